#!/usr/bin/env python3
"""The batched training augmentation (``tcnn.data.batch_augment``) against timm's PIL transform, per batch.

    python benchmarks/batch_augment.py                 # CPU (and CUDA if present): about 3 minutes on 2 cores
    python benchmarks/batch_augment.py --quick         # one size, 2 repeats: a smoke run
    python benchmarks/batch_augment.py --save          # also writes results/<device>-batch-augment-<date>.json

Times ``BatchAugment.__call__`` and ``BatchEval.__call__`` on a batch of decoded uint8 images, and timm's
``create_transform`` (train and eval) on the same images as PIL images, one image at a time in this process (as
one DataLoader worker runs it): batch 64 at 96 px (96 x 96 sources) and batch 256 at 224 px (sources of about
500 x 375, several sizes), with the paper recipe's settings (``rand-m9-mstd0.5-inc1``, bicubic, random erasing 0.25
'pixel') and the demo's (no auto-augment, colour jitter 0.3, scale (1, 1), bicubic). Decoding is outside every
timing; drawing the parameters (``BatchAugment.draw``, in the loader workers) is timed on its own, per sample.
Medians of interleaved repeats (wall clock), with one torch thread and with torch's default; "img/s/core" divides
by the threads used (1 for PIL), on CUDA it is per GPU; "x PIL" is timm's time for the batch on one core over ours.
Generated images. The process keeps the memory it frees, as ``tcnn train``'s do (``tcnn.allocator``).
"""
import argparse
import datetime
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import create_transform  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from tcnn.allocator import keep_freed_memory  # noqa: E402
from tcnn.data.batch_augment import BatchAugment, BatchEval  # noqa: E402
from tcnn.data.transforms import safe_augmentation  # noqa: E402

from benchmarks.measure import interleaved_times, synchronize  # noqa: E402
from benchmarks.report import machine_info, write_json  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SETTINGS = {
    'recipe': dict(auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel'),
    'demo': dict(auto_augment=None, color_jitter=0.3, scale=(1.0, 1.0), interpolation='bicubic'),
}
# (img_size, batch, source sizes (height, width))
SIZES = [(96, 64, [(96, 96)]), (224, 256, [(375, 500), (500, 375), (333, 500), (375, 450), (400, 400)])]


def _images(batch: int, sizes: List[Tuple[int, int]], seed: int = 0) -> List[np.ndarray]:
    """Photo-like HWC uint8 images: gradients, a sinusoid, flat rectangles, noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batch):
        h, w = sizes[i % len(sizes)]
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack([255 * x / w, 255 * y / h, 128 + 100 * np.sin(x / 7 + y / 11 + i)], -1)
        for _ in range(3):
            y0, x0 = rng.integers(0, h - 10), rng.integers(0, w - 10)
            img[y0:y0 + h // 3, x0:x0 + w // 3] = rng.integers(0, 256, 3)
        img += rng.normal(0, 8, img.shape).astype(np.float32)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def _cases(quick: bool) -> List[Tuple[str, int, int, List[Tuple[int, int]]]]:
    sizes = SIZES[:1] if quick else SIZES
    return [(setting, img_size, batch, src) for img_size, batch, src in sizes for setting in SETTINGS]


def measure_case(setting: str, img_size: int, batch: int, sources: List[Tuple[int, int]], device: torch.device,
                 threads: int, args: argparse.Namespace, with_pil: bool) -> List[Dict[str, Any]]:
    kwargs = dict(SETTINGS[setting], mean=MEAN, std=STD)
    aug = BatchAugment(img_size, **kwargs)
    ev = BatchEval(img_size, interpolation='bicubic', mean=MEAN, std=STD)
    arrays = _images(batch, sources)
    tensors = [torch.from_numpy(a).permute(2, 0, 1).contiguous().to(device) for a in arrays]
    draws = []
    for seed in range(3):
        rng = random.Random(seed)
        start = time.perf_counter()
        params = default_collate([aug.draw(rng, tuple(t.shape[1:])) for t in tensors])
        draws.append((time.perf_counter() - start) / batch * 1e6)
    draw_us = statistics.median(draws)
    fns: Dict[str, Callable[[], object]] = {'batched train': lambda: aug(tensors, params),
                                            'batched eval': lambda: ev(tensors)}
    if with_pil:
        pils = [Image.fromarray(a) for a in arrays]
        train_tf = safe_augmentation(create_transform(img_size, is_training=True, **kwargs))
        eval_tf = create_transform(img_size, is_training=False, interpolation='bicubic', mean=MEAN, std=STD)
        fns['timm PIL train'] = lambda: [train_tf(p) for p in pils]
        fns['timm PIL eval'] = lambda: [eval_tf(p) for p in pils]
    times = interleaved_times(fns, device, warmup=1, repeats=args.repeats)
    rows = []
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        cores = 1 if 'PIL' in name or device.type == 'cuda' else threads
        rows.append({'setting': setting, 'img_size': img_size, 'batch': batch, 'device': device.type,
                     'threads': threads, 'what': name, 'ms_per_batch': ms, 'img_s_per_core': batch / ms * 1e3 / cores,
                     'draw_us_per_sample': draw_us, 'repeats': len(ts)})
    return rows


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeats', type=int, default=5, help='timed repeats per function (medians)')
    parser.add_argument('--quick', action='store_true', help='96 px only, 2 repeats: a smoke run')
    parser.add_argument('--device', nargs='+', default=None, help="devices (default: cpu, and cuda if available)")
    parser.add_argument('--save', action='store_true', help='write benchmarks/results/<device>-batch-augment-<date>'
                                                            '.json')
    args = parser.parse_args(argv)
    keep_freed_memory()  # as in tcnn train, whose processes run this code
    if args.quick:
        args.repeats = min(args.repeats, 2)
    devices = [torch.device(d) for d in (args.device or ['cpu'] + (['cuda'] if torch.cuda.is_available() else []))]
    default_threads = torch.get_num_threads()
    rows: List[Dict[str, Any]] = []
    for device in devices:
        for threads in sorted({1, default_threads}):
            torch.set_num_threads(threads)
            for setting, img_size, batch, sources in _cases(args.quick):
                # timm's PIL transform runs once per size and setting (one thread, on the CPU), beside our CPU runs
                with_pil = device.type == 'cpu' and threads == 1
                rows += measure_case(setting, img_size, batch, sources, device, threads, args, with_pil)
                synchronize(device)
        torch.set_num_threads(default_threads)
    pil = {(r['setting'], r['img_size'], r['what'].split()[-1]): r['ms_per_batch'] for r in rows if 'PIL' in r['what']}
    for r in rows:  # wall time of timm's PIL transform on one core / ours
        base = pil.get((r['setting'], r['img_size'], r['what'].split()[-1]))
        r['speedup_vs_pil'] = base / r['ms_per_batch'] if base and 'PIL' not in r['what'] else None
    header = f'{"setting":7s} {"px":>4s} {"batch":>5s} {"device":6s} {"thr":>3s}  {"what":15s} {"ms/batch":>9s} ' \
             f'{"img/s/core":>10s} {"x PIL":>6s}'
    print(header)
    for r in rows:
        speedup = f'{r["speedup_vs_pil"]:6.2f}' if r['speedup_vs_pil'] else f'{"":6s}'
        print(f'{r["setting"]:7s} {r["img_size"]:4d} {r["batch"]:5d} {r["device"]:6s} {r["threads"]:3d}  '
              f'{r["what"]:15s} {r["ms_per_batch"]:9.1f} {r["img_s_per_core"]:10.0f} {speedup}')
    draws = {(r['setting'], r['img_size']): r['draw_us_per_sample'] for r in rows}
    print('draw (per sample, in a loader worker): ' + ', '.join(f'{s} {px}px {us:.0f} us' for (s, px), us in
                                                               draws.items()))
    if args.save:
        device = devices[-1]
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results',
                            f'{device.type}-batch-augment-{datetime.date.today().isoformat()}.json')
        write_json({'schema': 'tcnn-batch-augment/1', 'date': datetime.date.today().isoformat(),
                    'command': 'python benchmarks/batch_augment.py ' + ' '.join(argv or sys.argv[1:]),
                    'machine': machine_info(device), 'repeats': args.repeats, 'rows': rows,
                    'loadavg_end': list(os.getloadavg())}, path)
        print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
