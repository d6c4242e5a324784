#!/usr/bin/env python3
"""The whole training loop as users run it: ``tcnn train`` under torchrun on a folder of JPEGs, T-CNN vs its CNN.

    python benchmarks/loop.py                              # 20k ImageNet-size JPEGs, resnet50d, 2 epochs per run
    python benchmarks/loop.py --workers 8 16               # a sweep of loader workers
    python benchmarks/loop.py --pipelines pil device       # the data pipelines side by side
    python benchmarks/loop.py --smoke --out /tmp/loop      # every code path in under a minute on 2 CPU cores

Generates an ImageFolder of JPEGs on the local disk (``benchmarks/photos.py``: ImageNet-size photo-like JPEGs, about
500 x 375 px and 110 KB, ``--unique`` of them distinct and the rest hard links; or ``--source shapes``: the demo's
shapes at ``--source-size``; reused when it exists), then runs ``torchrun --nproc_per_node 1 -m tcnn.train`` on it
with the recipe's full augmentation (RandAugment, random erasing, mixup/cutmix) at 224 px, for the T-CNN and for its
CNN (``--no-sa``), random weights (``--no-pretrained``: nothing is downloaded), bf16 and channels_last on a GPU, on
each data pipeline asked for (``--data-pipeline``). torchrun gives the one process a process group, so the job runs
what a many-GPU job runs (NCCL on a GPU, gloo on the CPU) and the backend is recorded. On a GPU, ``nvidia-smi``
samples its utilisation twice a second during each run (the median of the samples of the run's second half).

The numbers are the run's own (``OUTPUT/metrics.jsonl``, the last epoch's: the first one pays for cuDNN's
autotuning and the loader's start):

- loop img/s: training images per second of the epoch's whole training loop, waiting for data included
  (``img_per_s``; validation is not part of it);
- step img/s: the same images over the loop's time minus the time spent waiting for the loader's next batch
  (``step_img_per_s`` = loop img/s / (1 - data wait)): what the loop would do with data for free, as far as the
  compute of this run goes (host overhead included, the loader's CPU use beside it not excluded);
- data wait: the share of the loop's time the training process waited for the loader (``data_wait``; ``tcnn
  train`` calls a run data-bound from 10% on).

Prints a table and writes ``<out>/<device>-loop-<backend>-<date>.json`` (device ``cpu`` or ``cuda-<gpu>``, e.g.
``cuda-h100``; backend ``nccl`` or ``gloo``) with the machine (``benchmarks.report.machine_info``), the commands and
every epoch's numbers. See docs/benchmarks.md.
"""
import argparse
import datetime
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import photos  # noqa: E402
from benchmarks.report import load_average, machine_info, write_json  # noqa: E402
from tcnn.demo import synthetic  # noqa: E402
from tcnn.files.run_folder import read_metrics, read_status  # noqa: E402
from tcnn.train.recipe import auto_workers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, 'benchmarks', 'results')
VARIANTS = {'tcnn': [], 'cnn': ['--no-sa']}  # T-CNN, and its CNN fine-tuned with the same recipe
EPOCH_KEYS = ('epoch', 'img_per_s', 'step_img_per_s', 'data_wait', 'train_images', 'epoch_time_s', 'train_loss')


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def presets(smoke: bool) -> Dict[str, Any]:
    """Default settings; explicit command-line options override them."""
    if smoke:  # every code path on a few dozen small images; for tests, not for numbers
        return dict(images=48, val_images=12, source_size=64, img_size=64, model='resnet18d', epochs=1,
                    batch_size=8, workers=[2], unique=16)
    return dict(images=20000, val_images=1000, source_size=256, img_size=224, model='resnet50d', epochs=2,
                batch_size=128, workers=[usable_cpus()], unique=2000)


def build_parser() -> argparse.ArgumentParser:
    summary, usage = __doc__.split('\n\n', 2)[:2]
    p = argparse.ArgumentParser(description=summary, epilog=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--smoke', action='store_true', help='48 images at 64 px, resnet18d, 1 epoch, 2 workers (tests)')
    p.add_argument('--data', help='dataset folder: generated there unless it holds this dataset already (default: a '
                   'folder in the temporary directory, kept for the next run)')
    p.add_argument('--images', type=int, help='training images (default 20000; val: --val-images)')
    p.add_argument('--val-images', type=int, help='validation images (default 1000)')
    p.add_argument('--source-size', type=int, help='side of the generated JPEGs in px (default 256)')
    p.add_argument('--img-size', type=int, help='training resolution (default 224)')
    p.add_argument('--model', help='timm model (default resnet50d)')
    p.add_argument('--epochs', type=int, help='epochs per run (default 2; the last one is reported)')
    p.add_argument('--batch-size', type=int, help="batch per process (default 128, the recipe's)")
    p.add_argument('--workers', type=int, nargs='+', help='loader workers per run, several for a sweep (default: '
                   'the usable CPUs)')
    p.add_argument('--variants', nargs='+', choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument('--pipelines', nargs='+', choices=('pil', 'device', 'resident', 'auto'), default=['pil'],
                   help='data pipelines (tcnn train --data-pipeline), each run on each (default: pil)')
    p.add_argument('--source', choices=('photos', 'shapes'), default='photos',
                   help='photos: ImageNet-size JPEGs (benchmarks/photos.py, default); shapes: the demo\'s, as JPEGs')
    p.add_argument('--unique', type=int, help='distinct photos (the rest hard links; default 2000)')
    p.add_argument('--device', choices=['cpu', 'cuda'], help='default: cuda when available')
    p.add_argument('--out', default=RESULTS_DIR, help='results folder (default benchmarks/results)')
    p.add_argument('--runs', help='folder of the training runs and their logs (default: a temporary one)')
    return p


def device_tag(device: torch.device) -> str:
    """``cpu``, or ``cuda-<gpu>`` from the GPU's name (``NVIDIA H100 80GB HBM3`` -> ``cuda-h100``)."""
    if device.type != 'cuda':
        return device.type
    name = torch.cuda.get_device_name(device)
    match = re.search(r'\b([A-Z]+\d+[A-Z]*)\b', name.replace('NVIDIA', ''))
    return f'cuda-{(match.group(1) if match else name.split()[-1]).lower()}'


def make_data(args: argparse.Namespace, root: str, workers: int) -> Dict[str, Any]:
    """The JPEG ImageFolder (generated in ``workers`` processes, or reused); returns what describes it."""
    start = time.perf_counter()
    if args.source == 'photos':
        manifest = photos.generate(root, train=args.images, val=args.val_images, unique=args.unique, workers=workers)
        classes = [f'c{c:02d}' for c in range(manifest['classes'])]
        source = '500x375'
    else:
        manifest = synthetic.generate(root, sizes={'train': args.images, 'val': args.val_images}, corruptions=(),
                                      task=synthetic.OddColour(img_size=args.source_size), image_format='jpeg',
                                      workers=workers, progress=False)
        classes, source = manifest['classes'], args.source_size
    files = [os.path.join(d, f) for d in (os.path.join(root, 'train', c) for c in classes) for f in os.listdir(d)]
    return {'root': root, 'source': args.source, 'train_images': args.images, 'val_images': args.val_images,
            'source_size': source, 'classes': len(classes), 'format': 'jpeg',
            'unique': args.unique if args.source == 'photos' else args.images,
            'mean_file_kib': sum(os.path.getsize(f) for f in files) / max(len(files), 1) / 1024,
            'generation_s': time.perf_counter() - start, 'generation_workers': workers}


class GpuUtilisation:
    """``nvidia-smi`` sampling the GPU's utilisation twice a second while a run goes (nothing without it)."""

    def __init__(self, enabled: bool):
        self.proc = None
        if enabled and shutil.which('nvidia-smi'):
            gpu = os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0]
            self.proc = subprocess.Popen(['nvidia-smi', '--query-gpu=utilization.gpu', '--format=csv,noheader,nounits',
                                          '-lms', '500', '-i', gpu], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)

    def stop(self) -> Optional[float]:
        """The median utilisation (%) of the second half of the samples; None without samples."""
        if self.proc is None:
            return None
        self.proc.terminate()
        out = self.proc.communicate(timeout=10)[0]
        samples = [float(v) for v in out.split() if v.replace('.', '', 1).isdigit()]
        tail = samples[len(samples) // 2:]
        return statistics.median(tail) if tail else None


def train_command(args: argparse.Namespace, data: str, output: str, variant: str, workers: int,
                  pipeline: str = 'pil') -> List[str]:
    """``torchrun --nproc_per_node 1 -m tcnn.train ...`` of one run: the recipe's augmentation at ``img_size``."""
    cuda = args.device == 'cuda'
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1', '-m', 'tcnn.train',
            '--data', data, '--output', output, '--model', args.model, '--no-pretrained', '--epochs', str(args.epochs),
            '--batch-size', str(args.batch_size), '--img-size', str(args.img_size), '--workers', str(workers),
            '--device', args.device, '--amp', 'bf16' if cuda else 'none', '--set', f'channels_last={str(cuda).lower()}',
            '--set', 'warmup_epochs=0', '--no-progress', '--data-pipeline', pipeline, *VARIANTS[variant]]


def run_one(args: argparse.Namespace, data: str, runs: str, variant: str, workers: int,
            pipeline: str = 'pil') -> Dict[str, Any]:
    """One training run; its epochs' numbers from its metrics.jsonl and its process group from status.json."""
    name = f'{variant}-{pipeline}-w{workers}'
    output = os.path.join(runs, name)
    cmd = train_command(args, data, output, variant, workers, pipeline)
    paths = [ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    env = dict(os.environ, HF_HUB_OFFLINE='1', PYTHONUNBUFFERED='1', PYTHONPATH=os.pathsep.join(paths))
    if args.smoke:  # a few tiny steps on a small shared CPU: threads would only fight the loader workers
        env.setdefault('OMP_NUM_THREADS', '1')
    log_path = os.path.join(runs, f'{name}.log')
    start = time.perf_counter()
    gpu = GpuUtilisation(args.device == 'cuda')
    with open(log_path, 'w') as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=runs).returncode
    utilisation = gpu.stop()
    wall = time.perf_counter() - start
    with open(log_path) as f:
        text = f.read()
    if code != 0:
        raise RuntimeError(f'{name} failed with exit code {code}; the end of {log_path}:\n{text[-3000:]}')
    status = read_status(os.path.join(output, 'status.json')) or {}
    epochs = [{k: row.get(k) for k in EPOCH_KEYS} for row in read_metrics(os.path.join(output, 'metrics.jsonl'))]
    last = epochs[-1]
    return {'variant': variant, 'pipeline': pipeline, 'workers': workers, 'gpu_utilisation': utilisation,
            'process_group': status.get('process_group'),
            'state': status.get('state'), 'img_per_s': last['img_per_s'], 'step_img_per_s': last['step_img_per_s'],
            'data_wait': last['data_wait'], 'epochs': epochs, 'wall_s': wall,
            'command': ' '.join(shlex.quote(c) for c in cmd[1:]).replace('-m torch.distributed.run', 'torchrun', 1),
            'log_tail': text[-2000:]}


def ratios(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """T-CNN / CNN of loop and step img/s for each pipeline and worker count (both variants run), and each run's
    loop img/s over its step img/s (what the data path leaves of the step's speed)."""
    out = []
    for pipeline, workers in sorted({(r['pipeline'], r['workers']) for r in rows}):
        by = {r['variant']: r for r in rows if r['workers'] == workers and r['pipeline'] == pipeline}
        if {'tcnn', 'cnn'} <= set(by):
            out.append({'pipeline': pipeline, 'workers': workers,
                        'loop': by['tcnn']['img_per_s'] / by['cnn']['img_per_s'],
                        'step': by['tcnn']['step_img_per_s'] / by['cnn']['step_img_per_s']})
    return out


def print_table(results: Dict[str, Any]) -> None:
    s, d = results['settings'], results['data']
    print(f'\n{s["model"]} at {s["img_size"]} px, batch {s["batch_size"]}, {s["epochs"]} epoch(s) of '
          f'{d["train_images"]} JPEGs ({d["source"]}, {d["source_size"]} px, {d["mean_file_kib"]:.1f} KiB each), '
          f'device {results["device"]}, process group {results["backend"]}; last epoch:')
    print('| model | pipeline | workers | loop img/s | step img/s | loop / step | data wait | GPU util. | run s |')
    print('|---|---|---|---|---|---|---|---|---|')
    for r in results['runs']:
        util = '-' if r['gpu_utilisation'] is None else f'{r["gpu_utilisation"]:.0f}%'
        print(f'| {r["variant"]} | {r["pipeline"]} | {r["workers"]} | {r["img_per_s"]:.1f} | '
              f'{r["step_img_per_s"]:.1f} | {r["img_per_s"] / r["step_img_per_s"]:.2f} | '
              f'{100 * r["data_wait"]:.1f}% | {util} | {r["wall_s"]:.0f} |')
    for r in results['ratios']:
        print(f'T-CNN / CNN, {r["pipeline"]} pipeline, {r["workers"]} workers: loop {r["loop"]:.3f}, '
              f'step {r["step"]:.3f}')


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    for key, value in presets(args.smoke).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is available')
    if min(args.images, args.val_images, args.epochs, args.batch_size, args.img_size, args.source_size) < 1 or \
            min(args.workers) < 0:
        parser.error('image counts, sizes, epochs and the batch must be >= 1, workers >= 0')
    device = torch.device(args.device)
    start = time.perf_counter()
    data_root = args.data or os.path.join(
        tempfile.gettempdir(), f'tcnn-loop-{args.source}-{args.images}-{args.val_images}-{args.source_size}px')
    data = make_data(args, data_root, usable_cpus())
    print(f'data {data_root}: {args.images} + {args.val_images} JPEGs ({args.source}, {data["source_size"]} px, '
          f'{data["mean_file_kib"]:.1f} KiB each), {data["generation_s"]:.0f} s to generate', flush=True)
    runs_dir = args.runs or tempfile.mkdtemp(prefix='tcnn-loop-runs-')
    os.makedirs(runs_dir, exist_ok=True)
    rows = []
    points = [(pipeline, workers) for pipeline in args.pipelines for workers in args.workers]
    for i, (pipeline, workers) in enumerate(points):
        for variant in (args.variants if i % 2 == 0 else args.variants[::-1]):  # alternate the order per sweep point
            row = run_one(args, data_root, runs_dir, variant, workers, pipeline)
            rows.append(row)
            print(f'{variant}, {pipeline} pipeline, {workers} workers: {row["img_per_s"]:.1f} img/s (step '
                  f'{row["step_img_per_s"]:.1f}), waiting for data {100 * row["data_wait"]:.1f}% '
                  f'({row["wall_s"]:.0f} s)', flush=True)
    backends = {r['process_group'] for r in rows}
    backend = backends.pop() if len(backends) == 1 else 'mixed'
    name = f'{device_tag(device)}-loop-{backend}-{datetime.date.today().isoformat()}'
    results = {
        'schema': 'tcnn-loop/1', 'name': name, 'date': datetime.datetime.now().isoformat(timespec='seconds'),
        'command': 'python benchmarks/loop.py ' + ' '.join(shlex.quote(a) for a in argv),
        'device': str(device), 'backend': backend, 'machine': machine_info(device),
        'settings': {k: getattr(args, k) for k in ('smoke', 'model', 'img_size', 'epochs', 'batch_size', 'workers',
                                                   'variants', 'pipelines')},
        'tcnn_default_workers': auto_workers(1), 'data': data, 'runs': rows, 'ratios': ratios(rows),
        'definitions': {'img_per_s': 'training images / training loop time, data wait included (metrics.jsonl '
                                     'img_per_s)',
                        'step_img_per_s': 'training images / (loop time - time waiting for the loader) = img_per_s '
                                          '/ (1 - data_wait) (metrics.jsonl step_img_per_s)',
                        'data_wait': 'share of the loop time spent waiting for the next batch (0 to 1)'},
        'loadavg_end': load_average(), 'wall_time_s': time.perf_counter() - start,
    }
    print_table(results)
    path = os.path.join(args.out, name + '.json')
    os.makedirs(args.out, exist_ok=True)
    write_json(results, path)
    print(f'wrote {path} (runs and logs in {runs_dir})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
