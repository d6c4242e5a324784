"""``tcnn demo``: the whole method end to end, offline, in miniature (T-CNN, arXiv:2106.05795).

1. **Data**: ``tcnn.demo.synthetic`` writes an odd-colour-out task (train / val / test ImageFolders and an
   ImageNet-C-style ``test-c``) from a fixed seed.
2. **The "pretrained" CNN**, one per seed: ``demo_resnet10`` (timm's ``ResNet`` class, see ``tcnn.models``) trained
   from scratch on it with ``tcnn train --no-pretrained --no-sa``.
3. **The method**, from the seed's CNN, with the same epochs and data: (a) ``no-sa``: the CNN fine-tuned
   without self-attention (T-CNN Table 1's baseline); (b) ``t-cnn``: ``tcnn.reparameterize`` (verified) and the
   fine-tuning recipe (AdamW, warm-up + cosine, gating lr, init alpha = lambda = 1); (c) ``t-cnn-late``: the CNN
   fine-tuned for part of the epochs, then reparameterised (Table 3), where the plan has it.
4. **Evaluation and analysis**: ``tcnn eval`` on the test split and ``test-c``, gates / spans / nonlocality of every
   T-CNN (``tcnn.evaluation.analysis``), the figures (Fig. 3, 4 and 5 of the paper in miniature), ``results.json`` and a
   ``README.md`` that says what the numbers mean, whatever their sign, and how far they lie from the distribution
   documented for the plan (``demo_reference.json``, measured over many full-pipeline seeds).

A seed varies the whole pipeline on the one dataset (the CNN's init, data order and augmentation, then the
fine-tuning's and the GPSA layers' query/key init), so the spread over seeds includes the start point: what
another machine's torch build changes first.

Every step goes through the project's public code paths (the ``tcnn`` command's ``train`` and ``eval``, ``tcnn.load``,
``tcnn.save``, ``tcnn.reparameterize``, ``tcnn.evaluation.analysis``, ``tcnn.evaluation.plots``), so the demo is also their end-to-end
check. Training runs are ``tcnn train`` processes, several at once on a CPU (see ``_train_all``). An interrupted
demo continues where it stopped when the same command is run again (every training run resumes from its
``last.pt``).
"""
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import timm
import torch

from ..evaluation import analysis, plots
from . import synthetic
from ..files import loading, tcnn_file as tio
from ..atomic import atomic_write_text
from ..train import run_folder
from ..cli import main
from ..convert.transform import reparameterize
from ..data import data_config, find_images, load_images
from ..train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest
from ..errors import InvalidArgumentError, TcnnError, check_device, check_number
from ..paths import check_output_dir
from ..evaluation.plots import load_metrics
from ..evaluation.robustness import format_markdown, format_table
from .synthetic import CORRUPTED_SPLIT, hue_class
from ..version import __version__

__all__ = ['Plan', 'PLANS', 'ARMS', 'CNN', 'run_demo', 'run_name', 'parallel_layout', 'recipe_changes', 'verdict',
           'DemoStopped', 'DEMO_FORMAT', 'HEADLINE', 'headline_values', 'build_reference', 'load_reference',
           'compare_with_reference', 'reference_lines', 'environment', 'REFERENCE_FILE']

DEMO_FORMAT = 'tcnn-demo'
DEMO_VERSION = 2  # 2: one CNN per seed (runs/seedS-cnn); 1 had one CNN for every seed (runs/cnn)
DATA_SEED = 0  # one dataset for every seed: a seed varies the rest of the pipeline, the CNN's training included
CNN = 'cnn'  # the arm name of the CNN trained from scratch (the start point of the seed's fine-tuning arms)
ARMS = ('no-sa', 't-cnn', 't-cnn-late')  # the fine-tuning arms
ARM_TITLES = {CNN: 'CNN (start point, trained from scratch)', 'no-sa': 'CNN fine-tuned, no SA', 't-cnn': 'T-CNN',
              't-cnn-late': 'T-CNN, late reparam.'}
IMG_SIZE = 96


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes and schedule of a demo (``PLANS``). Epoch counts are those of the miniature, see ``recipe_changes``.

    Args:
        name: ``default``, ``quick`` or ``tiny`` (the test suite's).
        train: Training images (balanced over the classes).
        val: Validation images (the model-selection split: the demo's settings were chosen on it).
        test: Test images (reported, never used to choose anything).
        corrupt: Test images that get corrupted copies (every corruption, 5 severities).
        pretrain_epochs: Epochs of the CNN trained from scratch.
        finetune_epochs: Epochs of every fine-tuning arm.
        late_epoch: Arm (c) is reparameterised after this many of its fine-tuning epochs (None: no arm (c)).
        seeds: Fine-tuning seeds (0 .. seeds - 1).
        batch_size: Images per update.
        pretrain_lr: Peak lr of the CNN's training from scratch.
        lr: Peak lr of the fine-tuning arms.
        gating_lr: Peak lr of the gating parameters (T-CNN arms).
        inspect_images: Test images whose attention maps are drawn (Fig. 5).
        nonlocality_images: Test images the nonlocality is averaged over.
    """
    name: str
    train: int
    val: int
    test: int
    corrupt: int
    pretrain_epochs: int
    finetune_epochs: int
    late_epoch: Optional[int]
    seeds: int
    batch_size: int = 64
    pretrain_lr: float = 5e-3
    lr: float = 1e-3
    gating_lr: float = 0.1
    inspect_images: int = 3
    nonlocality_images: int = 256

    @property
    def arms(self) -> List[str]:
        return [a for a in ARMS if a != 't-cnn-late' or self.late_epoch is not None]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


PLANS: Dict[str, Plan] = {
    'default': Plan('default', train=6000, val=1000, test=1000, corrupt=300, pretrain_epochs=14, finetune_epochs=4,
                    late_epoch=2, seeds=2),
    'quick': Plan('quick', train=2400, val=300, test=300, corrupt=60, pretrain_epochs=6, finetune_epochs=3,
                  late_epoch=None, seeds=1, nonlocality_images=64),
    'tiny': Plan('tiny', train=96, val=24, test=24, corrupt=6, pretrain_epochs=1, finetune_epochs=2, late_epoch=1,
                 seeds=2, batch_size=16, inspect_images=1, nonlocality_images=8),
}


def recipe_changes(plan: Plan) -> List[str]:
    """Every change from the paper's fine-tuning recipe (T-CNN section 3, Table 1), and why."""
    return [
        f'epochs: {plan.finetune_epochs} instead of 50, warm-up scaled with them (5 of 50 -> '
        f'{_warmup(plan.finetune_epochs)} of {plan.finetune_epochs}): a miniature that fits minutes on 2 CPU cores',
        f'batch: {plan.batch_size} instead of 1024, learning rates not scaled by the batch rule (scale_lr false)',
        f'lr: {plan.lr:g} instead of 1e-4 (at batch 1024): a few short epochs on a small CNN instead of 50 ImageNet '
        f'epochs; gating lr: {plan.gating_lr:g}, as the paper\'s, unscaled',
        'augmentation: no RandAugment (its translations push shapes out of the image, its colour ops change the '
        'colours that are the labels), no mixup or cutmix (a blend or a pasted patch changes which shape is the odd '
        'one), no random erasing (it can erase a shape), no random '
        'resized crop (scale [1, 1]: a crop can cut a shape off); instead, timm\'s colour jitter 0.3 (brightness, '
        'contrast, saturation: no hue change) and horizontal flips; kept: label smoothing 0.1, weight decay 0.05',
        'model: demo_resnet10 (timm ResNet, one BasicBlock per stage, 1/4 of ResNet-18\'s widths, output stride 16: a '
        '6x6 last-stage token grid at 96 px) trained from scratch on the task instead of a ResNet-RS/-D pretrained on '
        'ImageNet; its layer4 has 2 3x3 convs (BasicBlock) instead of one per bottleneck block',
        'no stochastic depth (drop_path 0) and no EMA, as in the paper\'s ResNet-50 settings',
    ]


def _warmup(epochs: int) -> int:
    """The paper's 5 warm-up epochs of 50, kept as a fraction, at least one epoch (none for a 1-epoch run)."""
    return 0 if epochs < 2 else max(1, round(epochs / 10))


# ---------------------------------------------------------------------------------------------- steps

@dataclasses.dataclass
class _Context:
    out: str
    plan: Plan
    device: str
    workers: Optional[int]
    progress: bool
    log: Callable[[str], None]
    jobs: int = 1
    threads: Optional[int] = None  # torch threads per training process (None: torch's default)

    @property
    def data(self) -> str:
        return os.path.join(self.out, 'data')

    def run_dir(self, name: str) -> str:
        return os.path.join(self.out, 'runs', name)

    def model_file(self, name: str) -> str:
        return os.path.join(self.out, 'models', f'{name}.pt')


def run_name(seed: int, arm: str) -> str:
    """``seed0-cnn``, ``seed0-t-cnn``, ...: the name of a run, its folder under ``runs/`` and its model file."""
    return f'seed{seed}-{arm}'


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parallel_layout(device: str, seeds: int, jobs: Optional[int] = None,
                    cpus: Optional[int] = None) -> Tuple[int, Optional[int]]:
    """How many training processes run at once and the torch threads of each: ``(jobs, threads)``.

    On a CPU, one process per core up to the number of seeds, each with ``cpus // jobs`` threads: the demo's small
    model keeps one thread busy, while two threads of one process wait for each other at every layer (measured in
    docs/demo.md), and a process that loads its own images needs no loader workers. On a GPU, one process at a time
    with torch's default threads.
    """
    cpus = cpus or _available_cpus()
    if jobs is None:
        jobs = 1 if device != 'cpu' else max(1, min(seeds, cpus))
    return jobs, (max(1, cpus // jobs) if device == 'cpu' else None)


def _tcnn(argv: Sequence[str]) -> int:
    """Run a ``tcnn`` sub-command in this process (its one-line errors and exit codes)."""
    return main(list(argv))


class DemoStopped(Exception):
    """A training run of the demo stopped on a signal after saving its checkpoint (``exit_code``: 130 or 75)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _check_rc(rc: int, what: str, ctx: _Context) -> None:
    if rc in (EXIT_INTERRUPTED, EXIT_PREEMPTED):
        raise DemoStopped(f'{what} stopped and saved its checkpoint; run the same tcnn demo command again to continue '
                          'the demo where it stopped', rc)
    if rc != 0:
        raise TcnnError(f'{what} failed (exit {rc}, its error is above); the demo so far is in {ctx.out}')


def _train_argv(ctx: _Context, name: str, seed: int, epochs: int, lr: float, extra: Sequence[str]) -> List[str]:
    plan = ctx.plan
    argv = ['train', '--data', ctx.data, '--output', ctx.run_dir(name), '--resume', 'auto',
            '--model', 'demo_resnet10', '--img-size', str(IMG_SIZE), '--epochs', str(epochs),
            '--batch-size', str(plan.batch_size), '--lr', str(lr), '--seed', str(seed), '--device', ctx.device,
            '--set', 'scale_lr=false', '--set', 'aa=null', '--set', 'mixup=0', '--set', 'cutmix=0',
            '--set', 'reprob=0', '--set', 'scale=[1.0,1.0]', '--set', 'crop_pct=1.0',
            '--set', f'warmup_epochs={_warmup(epochs)}',
            # channels-last pays on CPU too for this model (oneDNN's convolutions; measured in docs/demo.md)
            '--set', 'channels_last=true', '--no-progress']
    workers = ctx.workers if ctx.workers is not None else 0 if ctx.threads == 1 else None
    if workers is not None:
        argv += ['--workers', str(workers)]
    return argv + list(extra)


@dataclasses.dataclass
class _Run:
    """One ``tcnn train`` run of the demo.

    Args:
        name: The run's name (``run_name``).
        argv: Its ``tcnn`` arguments.
        epochs: Its epochs (a run whose ``metrics.jsonl`` has them all is complete and not started again).
        after: The run that must be complete first (a fine-tuning arm's CNN).
        finished: Called in the demo's process when the run is complete.
    """
    name: str
    argv: List[str]
    epochs: int
    after: Optional[str] = None
    finished: Optional[Callable[[], None]] = None


def _epochs(ctx: _Context, name: str) -> List[Dict[str, Any]]:
    """The epochs a run has logged so far (none before its first)."""
    path = os.path.join(ctx.run_dir(name), run_folder.METRICS_FILE)
    return run_folder.read_metrics(path) if os.path.isfile(path) else []


def _complete(ctx: _Context, run: _Run) -> bool:
    return (os.path.isfile(os.path.join(ctx.run_dir(run.name), run_folder.LAST_CHECKPOINT))
            and len(_epochs(ctx, run.name)) >= run.epochs)


def _log_tail(path: str, lines: int = 1) -> str:
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            return ' | '.join(line.strip() for line in f.read().strip().splitlines()[-lines:])
    except OSError:
        return ''


class _Process:
    """A running ``tcnn train`` process, its output appended to ``runs/NAME/log.txt``."""

    def __init__(self, ctx: _Context, run: _Run):
        self.run, self.ctx = run, ctx
        os.makedirs(ctx.run_dir(run.name), exist_ok=True)
        self.log_path = os.path.join(ctx.run_dir(run.name), 'log.txt')
        env = dict(os.environ)
        if ctx.threads is not None:
            env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(ctx.threads)
        self.epochs_seen = len(_epochs(ctx, run.name))
        self.start = time.perf_counter()
        with open(self.log_path, 'a', encoding='utf-8') as log:
            log.write(f'== tcnn {" ".join(run.argv)}\n')
            log.flush()
            # its own session: a Ctrl-C in the terminal reaches the demo only, which forwards it once (a second
            # signal to a training process would stop it without its checkpoint)
            self.proc = subprocess.Popen([sys.executable, '-m', 'tcnn', *run.argv], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def new_epochs(self) -> List[Dict[str, Any]]:
        rows = _epochs(self.ctx, self.run.name)
        new, self.epochs_seen = rows[self.epochs_seen:], len(rows)
        return new

    def signal(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(getattr(signal, name))


def _train_all(ctx: _Context, runs: Sequence[_Run], timings: Dict[str, float]) -> None:
    """Every training run, ``ctx.jobs`` ``tcnn train`` processes at a time, in order as their ``after`` allows
    (each seed's CNN first, so its arms can start as soon as a process is free).

    Complete runs are not started again. A signal to the demo (Ctrl-C, SIGTERM) is passed once to every running
    process, which stops at its next update boundary and saves its checkpoint; the demo then raises
    ``DemoStopped``, and the same command continues it. A run that fails stops the others the same way.
    """
    pending = list(runs)
    done = set()
    running: List[_Process] = []
    total = sum(r.epochs for r in runs)
    epochs_done = 0
    for run in runs:
        if _complete(ctx, run):
            pending.remove(run)
            done.add(run.name)
            epochs_done += run.epochs
            if run.finished:
                run.finished()
    failed: Optional[str] = None
    forwarded = False
    with StopRequest() as stop:
        try:
            while pending or running:
                while not stop.requested and failed is None and len(running) < ctx.jobs:
                    ready = next((r for r in pending if r.after is None or r.after in done), None)
                    if ready is None:
                        break
                    pending.remove(ready)
                    running.append(_Process(ctx, ready))
                    epochs_done += running[-1].epochs_seen
                    ctx.log(f'== {ready.name}: tcnn {" ".join(ready.argv)}\n   (output in '
                            f'{running[-1].log_path})')
                if not running:
                    break
                time.sleep(0.5)
                for p in list(running):
                    for row in p.new_epochs():
                        epochs_done += 1
                        ctx.log(f'{p.run.name}: epoch {row["epoch"] + 1}/{p.run.epochs}, val top-1 '
                                f'{row["val_top1"]:.1f}%, {row["epoch_time_s"]:.0f} s [{epochs_done}/{total} '
                                f'epochs of the demo]')
                    rc = p.proc.poll()
                    if rc is None:
                        continue
                    running.remove(p)
                    timings[p.run.name] = timings.get(p.run.name, 0.0) + time.perf_counter() - p.start
                    # after a stop request, a process that the signal reached before it could install its
                    # handlers (still importing) ends killed by it: stopped too, its run continues from its last
                    # checkpoint
                    stopped = rc in (EXIT_INTERRUPTED, EXIT_PREEMPTED) or (forwarded and rc < 0)
                    if rc == 0 and _complete(ctx, p.run):
                        done.add(p.run.name)
                        if p.run.finished:
                            p.run.finished()
                    elif not stopped and failed is None:
                        failed = (f'training {p.run.name} failed (exit {rc}): {_log_tail(p.log_path)} (its log: '
                                  f'{p.log_path})')
                        for other in running:
                            other.signal('SIGTERM')
                if stop.requested and not forwarded:
                    forwarded = True
                    for p in running:
                        p.signal(stop.signal_name)
        except KeyboardInterrupt:  # a second Ctrl-C: pass it on, the processes stop without a new checkpoint
            for p in running:
                p.signal('SIGINT')
            for p in running:
                p.proc.wait()
            raise DemoStopped('interrupted; run the same tcnn demo command again to continue the demo (each '
                              'training run from its last checkpoint)', EXIT_INTERRUPTED) from None
    if failed:
        raise TcnnError(f'{failed}; the demo so far is in {ctx.out}')
    if stop.requested:
        raise DemoStopped('stopped: every training run saved its checkpoint; run the same tcnn demo command again '
                          'to continue the demo where it stopped', stop.exit_code)


def _export(ctx: _Context, name: str) -> str:
    """The run's final weights as a model file (``tcnn.save`` of ``tcnn.load(last.pt)``)."""
    path = ctx.model_file(name)
    tio.save(loading.load(os.path.join(ctx.run_dir(name), run_folder.LAST_CHECKPOINT)), path)
    return path


def _verify_conversion(ctx: _Context, seed: int) -> Dict[str, Any]:
    """``tcnn.reparameterize`` of the seed's trained CNN with verification: the T-CNN in its exact configuration
    computes the CNN (the error is measured), and its deviation at the fine-tuning init (alpha = lambda = 1). The
    T-CNN is kept as ``models/seedS-init-t-cnn.pt``: the reference the fine-tuned T-CNNs are compared with (its
    query/key init drawn from the seed)."""
    cnn = loading.load(ctx.model_file(run_name(seed, CNN)))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        t_cnn = reparameterize(cnn, input_size=(3, IMG_SIZE, IMG_SIZE))
    tio.save(t_cnn, ctx.model_file(run_name(seed, 'init-t-cnn')))
    rep = t_cnn.tcnn_report
    report = dataclasses.asdict(rep)
    report['seed'] = seed
    report['vacuous'] = rep.vacuous
    report['gpsa_layers'] = rep.num_gpsa
    report['params_cnn'] = sum(p.numel() for p in cnn.parameters())
    report['params_t_cnn'] = sum(p.numel() for p in t_cnn.parameters())
    return report


def _arm_argv(ctx: _Context, arm: str, seed: int) -> List[str]:
    plan = ctx.plan
    if arm == CNN:
        return _train_argv(ctx, run_name(seed, CNN), seed, plan.pretrain_epochs, plan.pretrain_lr,
                           ['--no-pretrained', '--no-sa'])
    extra = ['--weights', ctx.model_file(run_name(seed, CNN)), '--gating-lr', str(plan.gating_lr)]
    if arm == 'no-sa':
        extra.append('--no-sa')
    elif arm == 't-cnn-late':
        extra += ['--reparam-epoch', str(plan.late_epoch)]
    return _train_argv(ctx, run_name(seed, arm), seed, plan.finetune_epochs, plan.lr, extra)


def _demo_runs(ctx: _Context, conversions: Dict[int, Dict[str, Any]], files: Dict[str, str]) -> List[_Run]:
    """The training runs: every seed's CNN, then every seed's fine-tuning arms from it. A finished CNN is exported
    and its conversion verified; a finished arm is exported."""
    plan = ctx.plan

    def cnn_done(seed: int) -> None:
        files[run_name(seed, CNN)] = _export(ctx, run_name(seed, CNN))
        conversions[seed] = _verify_conversion(ctx, seed)
        ctx.log(f'{run_name(seed, CNN)}: conversion max relative logits error {conversions[seed]["max_rel_err"]:.2e} '
                f'in the exact configuration; {conversions[seed]["init_max_rel_err"]:.1%} deviation at the '
                'fine-tuning init (alpha = lambda = 1)')

    def arm_done(name: str) -> None:
        files[name] = _export(ctx, name)

    runs = [_Run(run_name(s, CNN), _arm_argv(ctx, CNN, s), plan.pretrain_epochs,
                 finished=functools.partial(cnn_done, s)) for s in range(plan.seeds)]
    runs += [_Run(run_name(s, arm), _arm_argv(ctx, arm, s), plan.finetune_epochs, after=run_name(s, CNN),
                  finished=functools.partial(arm_done, run_name(s, arm)))
             for s in range(plan.seeds) for arm in plan.arms]
    return runs


def _evaluate(ctx: _Context, files: Mapping[str, str]) -> Dict[str, Any]:
    """``tcnn eval`` of every model file on the test split (suite ``imagenet``) and ``test-c`` (``imagenet-c``)."""
    out = os.path.join(ctx.out, 'eval.json')
    argv = ['eval', *files.values(), '--names', *files.keys(), '--suite', 'imagenet', 'imagenet-c',
            '--data', os.path.join(ctx.data, 'test'), os.path.join(ctx.data, CORRUPTED_SPLIT),
            '--img-size', str(IMG_SIZE), '--crop-pct', '1.0', '--imagenet-c-size', str(IMG_SIZE),
            '--device', ctx.device, '--out', out]
    if ctx.workers is not None:
        argv += ['--workers', str(ctx.workers)]
    if not ctx.progress:
        argv.append('--no-progress')
    ctx.log(f'\n== tcnn {" ".join(argv)}')
    _check_rc(_tcnn(argv), 'evaluation', ctx)
    with open(out, encoding='utf-8') as f:
        return json.load(f)


def _test_images(ctx: _Context, limit: int) -> List[str]:
    """The first ``limit`` test images, classes interleaved (the same files on every run)."""
    paths = find_images(os.path.join(ctx.data, 'test'))
    return sorted(paths, key=lambda p: (os.path.basename(p), p))[:limit]


def _analyse(ctx: _Context, model_file: str) -> Dict[str, Any]:
    """Gates, spans and nonlocality (mixed, content, positional) of a T-CNN on test images."""
    model = loading.load(model_file).to(ctx.device)
    cfg = data_config(model)
    paths = _test_images(ctx, ctx.plan.nonlocality_images)
    batches = (load_images(paths[i:i + 64], cfg).to(ctx.device) for i in range(0, len(paths), 64))
    with torch.no_grad():
        summary = analysis.summarize(model, batches)
    return {'num_images': summary['num_images'], 'units': summary['units'], 'layers': {
        name: {k: entry[k] for k in ('gate', 'span', 'sigma', 'nonlocality', 'nonlocality_content',
                                     'nonlocality_positional', 'nonlocality_real', 'padding_share', 'grid', 'token_px',
                                     *ANALYSIS_MEANS)}
        for name, entry in summary['layers'].items()}}


# Layer means of tcnn.evaluation.analysis.summarize that the report shows (their units: tcnn.evaluation.analysis.UNITS).
ANALYSIS_MEANS = ('gate_mean', 'span_mean', 'sigma_mean', 'nonlocality_mean', 'nonlocality_real_mean',
                  'padding_share_mean')


def _layer_means(analysis_result: Mapping[str, Any], key: str) -> Optional[float]:
    values = [e[key] for e in analysis_result['layers'].values() if e.get(key) is not None]
    return sum(values) / len(values) if values else None


def _odd_shape_queries(ctx: _Context, limit: int) -> List[Tuple[str, Tuple[int, int]]]:
    """The first ``limit`` test images with the pixel (row, column) at the centre of the shape seen once: the query
    whose attention shows whether heads look at the other shapes."""
    out = []
    with open(os.path.join(ctx.data, 'test.jsonl'), encoding='utf-8') as f:
        for line in f:
            record = json.loads(line)
            hues = [hue_class(o['color']) for o in record['objects']]
            odd = next(o for o, h in zip(record['objects'], hues) if hues.count(h) == 1)
            x, y = odd['center']
            out.append((os.path.join(ctx.data, record['file']), (int(round(y)), int(round(x)))))
            if len(out) == limit:
                break
    return out


def _inspect(ctx: _Context, model_file: str, name: str) -> List[str]:
    """``tcnn inspect`` of a T-CNN on a few test images, the query on the shape seen once: Fig. 5 attention maps
    and the per-head chart (one folder per image: each holds that image's nonlocality)."""
    figures = []
    for image, (row, col) in _odd_shape_queries(ctx, ctx.plan.inspect_images):
        out = os.path.join(ctx.out, 'figures', f'inspect-{name}', os.path.splitext(os.path.basename(image))[0])
        argv = ['inspect', model_file, '--image', image, '--query', f'{row},{col}', '--out', out,
                '--device', ctx.device]
        ctx.log(f'\n== tcnn {" ".join(argv)}')
        _check_rc(_tcnn(argv), f'inspecting {name}', ctx)
        figures += sorted(os.path.join(out, f) for f in os.listdir(out) if f.startswith('attention_'))
    figures.append(os.path.join(out, 'heads.png'))
    return figures


# ---------------------------------------------------------------------------------------------- statistics

def _stats(values: Sequence[float]) -> Dict[str, Any]:
    """Mean, sample standard deviation, min and max over seeds."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {'mean': mean, 'std': std, 'min': min(values), 'max': max(values), 'values': list(values)}


def summarize_runs(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> Dict[str, Any]:
    """Per arm (the CNN included): clean and corrupted top-1 over seeds; per T-CNN arm: the gain over ``no-sa``
    seed by seed."""
    by_arm = {arm: [r for r in runs if r['arm'] == arm] for arm in arms}
    out: Dict[str, Any] = {}
    for arm, rs in by_arm.items():
        if not rs:
            continue
        entry = {'clean_top1': _stats([r['clean_top1'] for r in rs]),
                 'corrupted_top1': _stats([r['corrupted_top1'] for r in rs])}
        if arm not in (CNN, 'no-sa') and by_arm.get('no-sa'):
            base = {r['seed']: r for r in by_arm['no-sa']}
            paired = [(r, base[r['seed']]) for r in rs if r['seed'] in base]
            entry['gain_clean'] = _stats([r['clean_top1'] - b['clean_top1'] for r, b in paired])
            entry['gain_corrupted'] = _stats([r['corrupted_top1'] - b['corrupted_top1'] for r, b in paired])
        out[arm] = entry
    return out


# ---------------------------------------------------------------------------------------------- the demo

def _check_settings(out: str, settings: Dict[str, Any]) -> None:
    """A demo folder holds one demo: continuing it with other settings would mix two experiments."""
    path = os.path.join(out, 'demo.json')
    if os.path.isfile(path):
        try:
            with open(path, encoding='utf-8') as f:
                old = json.load(f)
        except (OSError, json.JSONDecodeError):
            old = None
        if old != settings:
            raise TcnnError(f'{out} holds a demo with other settings ({path}); pass another --out, or delete the '
                            'folder to start again')
    elif os.path.isdir(out) and os.listdir(out):
        raise TcnnError(f'{out} is not empty and holds no demo; pass another --out')
    os.makedirs(out, exist_ok=True)
    atomic_write_text(path, json.dumps(settings, indent=2) + '\n')


def run_demo(
        out: str = 'tcnn-demo',
        *,
        plan: str = 'default',
        seeds: Optional[int] = None,
        device: str = 'cpu',
        workers: Optional[int] = None,
        jobs: Optional[int] = None,
        progress: bool = True,
        log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """Run the demo (or continue an interrupted one) and write its report into ``out``.

    Args:
        out: Output folder: ``data/``, ``runs/``, ``models/``, ``figures/``, ``eval.json``, ``results.json``,
            ``README.md``.
        plan: ``default`` (about 15 minutes on 2 CPU cores), ``quick`` (2-3 minutes) or ``tiny`` (tests).
        seeds: Full-pipeline seeds (default: the plan's); each trains its own CNN, then its fine-tuning arms.
        device: ``cpu``, ``cuda``, ``cuda:1``, ...
        workers: Data-loading processes per loader (default: none for a training process with one thread, else
            sized to the machine).
        jobs: Training processes at once (default: on CPU one per core, at most one per seed; 1 on a GPU). The
            numbers depend on it through the threads per process (``parallel_layout``).
        progress: Progress bars (data generation, evaluation).
        log: Where progress lines go.

    Returns:
        The results (also ``out/results.json``).
    """
    if plan not in PLANS:
        raise InvalidArgumentError(f'plan must be one of {", ".join(PLANS)}, got {plan!r}')
    p = PLANS[plan]
    if seeds is not None:
        check_number(seeds, 'seeds', ge=1, integer=True)
        p = dataclasses.replace(p, seeds=int(seeds))
    if workers is not None:
        check_number(workers, 'workers', ge=0, integer=True)
    if jobs is not None:
        check_number(jobs, 'jobs', ge=1, integer=True)
    check_device(device, 'device')
    check_output_dir(out, 'out')
    out = os.path.abspath(out)
    jobs, threads = parallel_layout(device, p.seeds, jobs)
    settings = {'format': DEMO_FORMAT, 'version': DEMO_VERSION, 'plan': p.to_dict(), 'device': device,
                'workers': workers, 'jobs': jobs, 'threads': threads}
    _check_settings(out, settings)
    ctx = _Context(out, p, device, workers, progress, log, jobs, threads)
    start = time.perf_counter()
    timings: Dict[str, float] = {}

    dataset = _generate(ctx, timings)
    log(f'== training: {p.seeds} seed(s) x ({CNN} + {", ".join(p.arms)}), {jobs} tcnn train process(es) at a time'
        + (f', {threads} thread(s) each' if threads else ''))
    conversions: Dict[int, Dict[str, Any]] = {}
    files: Dict[str, str] = {}
    _train_all(ctx, _demo_runs(ctx, conversions, files), timings)
    runs = [{'seed': seed, 'arm': arm, 'name': run_name(seed, arm), 'run_dir': ctx.run_dir(run_name(seed, arm)),
             'model_file': files[run_name(seed, arm)]} for seed in range(p.seeds) for arm in (CNN, *p.arms)]
    step = time.perf_counter()
    report = _evaluate(ctx, {r['name']: r['model_file'] for r in runs})  # in seed and arm order
    timings['evaluation'] = time.perf_counter() - step
    step = time.perf_counter()
    results = _collect(ctx, report, runs, [conversions[s] for s in range(p.seeds)], dataset, timings)
    timings['analysis'] = time.perf_counter() - step
    step = time.perf_counter()
    results['figures'] = _figures(ctx, results)
    timings['figures'] = time.perf_counter() - step
    results['reference'] = compare_with_reference(results)
    results['wall_s'] = time.perf_counter() - start
    results['timings_s'] = timings
    atomic_write_text(os.path.join(out, 'results.json'), json.dumps(results, indent=2) + '\n')
    atomic_write_text(os.path.join(out, 'README.md'), render_readme(results))
    log(f'\n{summary_lines(results)}\n' + '\n'.join(reference_lines(results)) +
        f'\nwrote {os.path.join(out, "README.md")} and results.json ({results["wall_s"] / 60:.1f} min)')
    return results


def _generate(ctx: _Context, timings: Dict[str, float]) -> Dict[str, Any]:
    plan = ctx.plan
    ctx.log(f'== data: {plan.train} train / {plan.val} val / {plan.test} test images ({IMG_SIZE} px), '
            f'{plan.corrupt} test images x {len(synthetic.DEFAULT_CORRUPTIONS)} corruptions x 5 severities -> '
            f'{ctx.data}')
    manifest = synthetic.generate(ctx.data, sizes={'train': plan.train, 'val': plan.val, 'test': plan.test},
                                  seed=DATA_SEED, task=synthetic.OddColour(img_size=IMG_SIZE),
                                  corrupt_count=plan.corrupt, workers=ctx.workers, progress=ctx.progress)
    timings['data'] = manifest.pop('generation_s')
    return manifest


_CONVERSION_KEYS = ('seed', 'max_abs_err', 'max_rel_err', 'init_max_abs_err', 'init_max_rel_err', 'sensitivity',
                    'vacuous', 'float64_max_rel_err', 'dtype', 'gpsa_layers', 'params_cnn', 'params_t_cnn')


def _collect(ctx: _Context, report: Mapping[str, Any], runs: List[Dict[str, Any]],
             conversions: Sequence[Mapping[str, Any]], dataset: Mapping[str, Any],
             timings: Mapping[str, float]) -> Dict[str, Any]:
    clean = report['suites']['imagenet']['results']
    corrupted = report['suites']['imagenet-c']['results']

    def scores(name: str) -> Dict[str, Any]:
        c = corrupted[name]
        return {'clean_top1': clean[name]['top1'], 'corrupted_top1': c['top1'],
                'corrupted_by_severity': c['severities'],
                'corruptions': {k: {'top1': v['top1'], 'severities': v['severities']}
                                for k, v in c['corruptions'].items()}}

    for r in runs:
        r.update(scores(r['name']))
        r['train_s'] = _train_time(r['run_dir'])
        r['analysis'] = _analyse(ctx, r['model_file']) if r['arm'] not in (CNN, 'no-sa') else None
        if r['analysis']:
            r.update({key: _layer_means(r['analysis'], key) for key in ANALYSIS_MEANS})
    per_seed = [{k: c.get(k) for k in _CONVERSION_KEYS} for c in conversions]
    worst = max(per_seed, key=lambda c: c['max_rel_err'])
    return {
        'format': DEMO_FORMAT, 'version': DEMO_VERSION, 'plan': ctx.plan.to_dict(),
        'dataset': {k: dataset[k] for k in ('task', 'rule', 'seed', 'classes', 'sizes', 'corruptions', 'severities',
                                             'corrupt_count', 'task_params')},
        # the seed whose conversion was the least exact, and every seed's
        'conversion': dict(worst, init_max_rel_err_range=[min(c['init_max_rel_err'] for c in per_seed),
                                                          max(c['init_max_rel_err'] for c in per_seed)],
                           seeds=per_seed),
        'init': _analyse_init(ctx),
        'runs': runs,
        'summary': summarize_runs(runs, [CNN, *ctx.plan.arms]),
        'recipe_changes': recipe_changes(ctx.plan),
        'eval_file': os.path.join(ctx.out, 'eval.json'),
        'environment': environment(ctx.device, ctx.jobs, ctx.threads),
    }


def environment(device: str = 'cpu', jobs: int = 1, threads: Optional[int] = None) -> Dict[str, Any]:
    """What the numbers depend on besides the plan: the library versions, the device and the threads per process."""
    import numpy
    import PIL
    import torchvision
    return {'device': device, 'jobs': jobs, 'threads': threads if threads is not None else torch.get_num_threads(),
            'cpus': _available_cpus(), 'python': platform.python_version(), 'torch': torch.__version__,
            'torchvision': torchvision.__version__, 'timm': timm.__version__, 'pillow': PIL.__version__,
            'numpy': numpy.__version__, 'tcnn': __version__, 'machine': platform.machine()}


def _train_time(run_dir: str) -> float:
    """Seconds the run's epochs took (training and validation), from its metrics: also right for a run that was
    interrupted and continued."""
    return float(sum(r.get('epoch_time_s') or 0.0 for r in load_metrics(run_dir)))


def _analyse_init(ctx: _Context) -> Dict[str, Any]:
    """Gates, spans and nonlocality of every seed's T-CNN at the fine-tuning init (before any training), and their
    means over the seeds."""
    seeds = []
    for seed in range(ctx.plan.seeds):
        path = ctx.model_file(run_name(seed, 'init-t-cnn'))
        result = _analyse(ctx, path)
        seeds.append({'seed': seed, 'model_file': path, **{key: _layer_means(result, key) for key in ANALYSIS_MEANS},
                      'analysis': result})
    out: Dict[str, Any] = {}
    for key in ANALYSIS_MEANS:
        values = [s[key] for s in seeds if s[key] is not None]
        out[key] = sum(values) / len(values) if values else None
    out['seeds'] = seeds
    return out


def _figures(ctx: _Context, results: Mapping[str, Any]) -> Dict[str, Any]:
    fig_dir = os.path.join(ctx.out, 'figures')
    os.makedirs(fig_dir, exist_ok=True)
    figures: Dict[str, Any] = {}
    figures['robustness'] = plots.plot_demo_robustness(results, os.path.join(fig_dir, 'fig3_robustness.png'),
                                                       titles=ARM_TITLES)
    curves = {}
    for run in results['runs']:
        if run['seed'] == 0:
            curves[run['arm']] = plots.plot_training_curves(
                plots.load_metrics(run['run_dir']), os.path.join(fig_dir, f'fig4_curves_{run["name"]}.png'),
                title=f'{ARM_TITLES[run["arm"]]} (seed 0)')
    figures['curves'] = curves
    t_cnn = next(r for r in results['runs'] if r['arm'] == 't-cnn' and r['seed'] == 0)
    figures['attention'] = _inspect(ctx, t_cnn['model_file'], t_cnn['name'])
    return figures


# ------------------------------------------------------------------------------------ the documented distribution

REFERENCE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'reference.json')
REFERENCE_FORMAT = 'tcnn-demo-reference'
# The headline numbers, per seed: (key, what it is). Keys are ARM/QUANTITY; gains are of the T-CNN arm over the
# no-SA run of the same seed, in points; gate, span and nonlocality are the fine-tuned T-CNN's layer means.
HEADLINE: Tuple[Tuple[str, str], ...] = (
    ('cnn/clean_top1', 'CNN (start point), clean top-1 %'),
    ('cnn/corrupted_top1', 'CNN (start point), corrupted top-1 %'),
    ('no-sa/clean_top1', 'no-SA, clean top-1 %'),
    ('no-sa/corrupted_top1', 'no-SA, corrupted top-1 %'),
    ('t-cnn/clean_top1', 'T-CNN, clean top-1 %'),
    ('t-cnn/corrupted_top1', 'T-CNN, corrupted top-1 %'),
    ('t-cnn/gain_clean', 'T-CNN gain over no-SA, clean (points)'),
    ('t-cnn/gain_corrupted', 'T-CNN gain over no-SA, corrupted (points)'),
    ('t-cnn-late/clean_top1', 'late T-CNN, clean top-1 %'),
    ('t-cnn-late/corrupted_top1', 'late T-CNN, corrupted top-1 %'),
    ('t-cnn-late/gain_clean', 'late T-CNN gain over no-SA, clean (points)'),
    ('t-cnn-late/gain_corrupted', 'late T-CNN gain over no-SA, corrupted (points)'),
    ('t-cnn/gate_mean', 'T-CNN gate sigma(lambda) after fine-tuning'),
    ('t-cnn/span_mean', 'T-CNN span 1/alpha after fine-tuning'),
    ('t-cnn/nonlocality_mean', 'T-CNN nonlocality after fine-tuning (tokens)'),
)
HEADLINE_TITLES = dict(HEADLINE)
# A number is judged against the documented band: the documented range (min to max over the documented seeds)
# widened by BAND_SD documented standard deviations on each side. The documented seeds are a sample of a
# distribution, and another machine's floating-point rounding turns every seed into a new draw of it (docs/demo.md):
# a new draw leaves the bare range of n = 12 seeds with probability 2 / (n + 1), 15% per number (more for the
# default seeds 0 and 1, themselves among the range's ends), so a fresh install flagged numbers 0.1 past it; for a
# normal distribution it leaves the band with probability about 0.6% per value (simulated, n = 12), while a broken
# pipeline (a T-CNN that does not learn, a wrong conversion) lies many sd away. The band's margin is wider than the
# rounding of the printed numbers (3 significant digits) for every headline number, and a value printed equal to a
# range end counts as inside the range, so what the report prints never contradicts what it says.
BAND_SD = 2.0


def headline_values(results: Mapping[str, Any]) -> Dict[str, List[float]]:
    """Every headline number of a demo's results, one value per seed (in seed order); numbers of an arm the plan
    does not have are left out."""
    out: Dict[str, List[float]] = {}
    for key, _ in HEADLINE:
        arm, quantity = key.split('/')
        if quantity.startswith('gain_'):
            stats = results['summary'].get(arm, {}).get(quantity)
            values = list(stats['values']) if stats else []
        else:
            values = [r[quantity] for r in sorted(results['runs'], key=lambda r: r['seed'])
                      if r['arm'] == arm and r.get(quantity) is not None]
        if values:
            out[key] = [float(v) for v in values]
    return out


def _reference_plan(plan: Mapping[str, Any]) -> Dict[str, Any]:
    """The plan without what a distribution may vary (the number of seeds) or only names (the plan's name)."""
    return {k: v for k, v in plan.items() if k not in ('name', 'seeds')}


def build_reference(runs: Sequence[Mapping[str, Any]], measured: str = '') -> Dict[str, Any]:
    """The documented distribution (``demo_reference.json``) from the ``results.json`` of demos run with several
    seeds, one per environment (torch build, threads): every environment's per-seed values and the statistics over
    all of them pooled, since another machine's number may come from any of them.

    Args:
        runs: ``results.json`` contents, all of one plan (seeds aside) and demo version.
        measured: When (a date), for the record.
    """
    if not runs:
        raise InvalidArgumentError('build_reference needs the results of at least one demo')
    plan = _reference_plan(runs[0]['plan'])
    for r in runs:
        if _reference_plan(r['plan']) != plan or r['version'] != runs[0]['version']:
            raise InvalidArgumentError('the results come from different plans or demo versions; a distribution '
                                       'pools runs of one plan only')
    environments = []
    pooled: Dict[str, List[float]] = {}
    for r in runs:
        values = headline_values(r)
        for key, v in values.items():
            pooled.setdefault(key, []).extend(v)
        environments.append(dict(r['environment'], seeds=r['plan']['seeds'], wall_s=r.get('wall_s'),
                                 values=values))
    return {'format': REFERENCE_FORMAT, 'demo_version': runs[0]['version'], 'plan': plan, 'measured': measured,
            'environments': environments,
            'stats': {key: dict(_stats(v), n=len(v)) for key, v in pooled.items()}}


def load_reference(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The documented distribution shipped with tcnn (or the one at ``path``); None if there is none."""
    path = path or REFERENCE_FILE
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8') as f:
        reference = json.load(f)
    return reference if reference.get('format') == REFERENCE_FORMAT else None


def compare_with_reference(results: Mapping[str, Any], reference: Optional[Mapping[str, Any]] = None,
                           ) -> Dict[str, Any]:
    """Where each headline number of ``results`` lies in the documented distribution of its plan.

    A number is ``inside`` when every seed's value lies within the documented band (``band``: the documented range,
    min to max over the documented seeds, widened by ``BAND_SD`` documented standard deviations each side), and
    ``in_range`` when every value, printed with 3 significant digits, lies within the printed range itself; ``sd``
    is how far the seed furthest from the documented mean lies from it, in documented standard deviations (signed),
    and ``past_range`` how far the seed furthest outside the range lies past its nearer end (0 inside it). Without a
    documented distribution for the plan, ``available`` is False and ``why`` says why.
    """
    reference = load_reference() if reference is None else reference
    if reference is None:
        return {'available': False, 'why': 'no documented distribution is installed'}
    if (_reference_plan(results['plan']) != reference['plan']
            or results.get('version', DEMO_VERSION) != reference['demo_version']):
        return {'available': False, 'why': f'the documented distribution is of the default plan (this run: plan '
                                           f'{results["plan"]["name"]!r})'}
    numbers = {}
    for key, values in headline_values(results).items():
        ref = reference['stats'].get(key)
        if ref is None:
            continue
        sds = [(v - ref['mean']) / ref['std'] if ref['std'] > 0 else (0.0 if v == ref['mean'] else math.inf)
               for v in values]
        furthest = max(range(len(values)), key=lambda i: abs(sds[i]))
        lo, hi = ref['min'] - BAND_SD * ref['std'], ref['max'] + BAND_SD * ref['std']
        past = [_past_range(v, ref) for v in values]
        beyond = max(range(len(values)), key=lambda i: abs(past[i]))
        numbers[key] = {'values': values, 'mean': sum(values) / len(values),
                        'inside': all(_within(v, lo, hi) for v in values), 'in_range': all(p == 0 for p in past),
                        'band': [lo, hi], 'sd': sds[furthest], 'furthest_seed': furthest,
                        'past_range': past[beyond], 'past_range_seed': beyond,
                        'reference': {k: ref[k] for k in ('mean', 'std', 'min', 'max', 'n')}}
    return {'available': True, 'seeds': max(s['n'] for s in reference['stats'].values()),
            'environments': [{k: e.get(k) for k in ('torch', 'timm', 'pillow', 'threads', 'jobs', 'device', 'seeds')}
                             for e in reference['environments']],
            'measured': reference.get('measured', ''), 'numbers': numbers,
            'outside': [k for k, n in numbers.items() if not n['inside']]}


def _printed(value: float) -> float:
    """``value`` as the report prints it (3 significant digits)."""
    return float(f'{value:.3g}')


def _within(value: float, lo: float, hi: float) -> bool:
    """``lo <= value <= hi``, or so as printed: a value printed equal to a printed end is within."""
    return lo <= value <= hi or _printed(lo) <= _printed(value) <= _printed(hi)


def _past_range(value: float, ref: Mapping[str, Any]) -> float:
    """How far ``value`` lies past the documented range, in documented sd (signed: below its min < 0 < above its
    max); 0 within it (``_within``)."""
    if _within(value, ref['min'], ref['max']):
        return 0.0
    end = ref['max'] if value > ref['max'] else ref['min']
    return (value - end) / ref['std'] if ref['std'] > 0 else math.copysign(math.inf, value - end)


BAND_TEXT = f'the documented range ± {BAND_SD:g} sd'


def _where(number: Mapping[str, Any]) -> str:
    if number.get('in_range', number['inside']):
        return 'inside the documented range'
    if number['inside']:
        past = number['past_range']
        return (f'inside the band ({BAND_TEXT}): seed {number["past_range_seed"]} lies {abs(past):.1f} sd '
                f'{"above the documented maximum" if past > 0 else "below the documented minimum"}')
    sd = number['sd']
    band = ' to '.join(f'{v:.3g}' for v in number['band'])
    return (f'outside the band ({BAND_TEXT}: {band}): seed {number["furthest_seed"]} lies {abs(sd):.1f} sd '
            f'{"above" if sd > 0 else "below"} the documented mean')


def reference_lines(results: Mapping[str, Any]) -> List[str]:
    """How far the run's numbers lie from the documented distribution, in plain words (the log's last lines)."""
    ref = results.get('reference') or {}
    if not ref.get('available'):
        return [f'No comparison with the documented distribution: {ref.get("why", "none")}.']
    numbers, outside = ref['numbers'], ref['outside']
    in_range = sum(n.get('in_range', n['inside']) for n in numbers.values())
    head = f'Against the documented distribution ({ref["seeds"]} full-pipeline seeds, docs/demo.md): '
    if not outside:
        head += (f'all {len(numbers)} headline numbers lie inside the documented band ({BAND_TEXT}), '
                 f'{in_range} of them inside the range itself.')
    else:
        head += (f'{len(numbers) - len(outside)} of {len(numbers)} headline numbers lie inside the documented band '
                 f'({BAND_TEXT}); outside: {"; ".join(HEADLINE_TITLES[key] for key in outside)}.')
    lines = [head]
    for key in ref['outside']:
        n = numbers[key]
        lines.append(f'  {HEADLINE_TITLES[key]}: {", ".join(f"{v:.3g}" for v in n["values"])} vs documented '
                     f'{n["reference"]["mean"]:.3g} ± {n["reference"]["std"]:.2g} ({n["reference"]["min"]:.3g} to '
                     f'{n["reference"]["max"]:.3g}): {_where(n)}')
    return lines


# ---------------------------------------------------------------------------------------------- report

def _pm(stats: Mapping[str, Any], signed: bool = False) -> str:
    fmt = '+.1f' if signed else '.1f'
    if len(stats['values']) == 1:
        return format(stats['mean'], fmt)
    return f'{stats["mean"]:{fmt}} ± {stats["std"]:.1f}'


def verdict(results: Mapping[str, Any]) -> List[str]:
    """What the numbers say, in plain words, whatever their sign."""
    s = results['summary']
    n = results['plan']['seeds']
    lines = []
    t = s.get('t-cnn')
    if t and 'gain_clean' in t:
        for key, what in (('gain_clean', 'clean test accuracy'), ('gain_corrupted', 'accuracy on corrupted images')):
            g = t[key]
            favour = sum(v > 0 for v in g['values'])
            agree = ('one seed: no spread' if n == 1 else f'{favour} of {n} seeds favour the T-CNN' +
                     ('' if favour in (0, n) else ': the direction does not hold on every seed'))
            if n > 1 and abs(g['mean']) <= g['std']:
                lines.append(f'On {what}, the T-CNN and the no-SA baseline are within the spread over {n} seeds '
                             f'({_pm(g, True)} points, {agree}): no clear difference.')
            elif g['mean'] > 0:
                lines.append(f'On {what}, the T-CNN beats the no-SA baseline by {_pm(g, True)} points ({agree}).')
            else:
                lines.append(f'On {what}, the T-CNN is worse than the no-SA baseline by {_pm(g, True)} points '
                             f'({agree}).')
    base = s.get('no-sa')
    if t and base:
        ratio_t = t['corrupted_top1']['mean'] / t['clean_top1']['mean']
        ratio_b = base['corrupted_top1']['mean'] / base['clean_top1']['mean']
        more = ratio_t > ratio_b + 0.01
        lines.append(f'Relative to clean accuracy, the T-CNN keeps {ratio_t:.0%} on corrupted images and the baseline '
                     f'{ratio_b:.0%}: the T-CNN is {"more" if more else "not more"} robust in relative terms'
                     + ('.' if more else ': its gain on corrupted images is part of its clean gain.'))
    init = results['init']
    trained = [r for r in results['runs'] if r['arm'] == 't-cnn']
    if trained and init.get('gate_mean') is not None:
        gate = sum(r['gate_mean'] for r in trained) / len(trained)
        span = sum(r['span_mean'] for r in trained) / len(trained)
        nl = [r['nonlocality_mean'] for r in trained if r.get('nonlocality_mean') is not None]
        moved = ('fell: heads moved towards content attention' if gate < init['gate_mean'] - 0.01 else
                 'did not fall: heads stayed mostly positional')
        grew = ('grew' if span > init['span_mean'] * 1.05 else 'shrank' if span < init['span_mean'] / 1.05 else
                'barely moved')
        line = (f'Did the T-CNN learn to use attention? Mean gate sigma(lambda) {init["gate_mean"]:.3f} at init -> '
                f'{gate:.3f} after fine-tuning ({moved}); mean span 1/alpha {init["span_mean"]:.2f} -> {span:.2f} '
                f'tokens^2 ({grew})')
        if nl and init.get('nonlocality_mean') is not None:
            line += f'; mean nonlocality {init["nonlocality_mean"]:.2f} -> {sum(nl) / len(nl):.2f} tokens'
        lines.append(line + '.')
    return lines


def _result_rows(results: Mapping[str, Any]) -> List[List[str]]:
    """The result table: per arm (the CNN first) clean and corrupted top-1 and the gains over no-SA."""
    rows = []
    for arm, e in results['summary'].items():
        rows.append([ARM_TITLES[arm], _pm(e['clean_top1']), _pm(e['corrupted_top1']),
                     _pm(e['gain_clean'], True) if 'gain_clean' in e else '',
                     _pm(e['gain_corrupted'], True) if 'gain_corrupted' in e else ''])
    return rows


def summary_lines(results: Mapping[str, Any]) -> str:
    """The result table as plain text (the end of the demo's log)."""
    return format_table(['model', 'clean top-1 %', 'corrupted top-1 %', 'gain clean', 'gain corrupted'],
                        _result_rows(results))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return format_markdown(header, rows).rstrip('\n')


def _readme_result(results: Mapping[str, Any]) -> str:
    """Title, the result table, the verdict in words and the conversion's exactness."""
    plan, ds, conv = results['plan'], results['dataset'], results['conversion']
    seeds_note = (f'mean ± standard deviation over {plan["seeds"]} seeds, each its own CNN and fine-tuning'
                  if plan['seeds'] > 1 else 'one seed (run with --seeds 2 or more for a spread)')
    lo, hi = conv['init_max_rel_err_range']
    init_dev = f'{lo:.1%}' if f'{lo:.1%}' == f'{hi:.1%}' else f'{lo:.1%} to {hi:.1%}'
    cnns = f'each of the {plan["seeds"]} trained CNNs' if plan['seeds'] > 1 else 'the trained CNN'
    smoke = ('\n**A smoke run (`--quick`)**: its CNN is trained too briefly to learn the task, so the numbers below '
             'check the pipeline, not the method; `tcnn demo` without `--quick` gives the result.\n'
             if plan['name'] == 'quick' else '')
    corrupted = f'corrupted top-1 % (mean of {len(ds["corruptions"])} corruptions x 5 severities)'
    header = ['model', 'clean top-1 %', corrupted, 'gain clean (points)', 'gain corrupted (points)']
    return f"""# tcnn demo: a Transformed CNN in miniature

T-CNN (arXiv:2106.05795): the last-stage 3x3 convolutions of a trained CNN become GPSA self-attention layers
(ConViT, arXiv:2103.10697) that hold the CNN's filters (in their exact configuration, the CNN's function), then
the hybrid is fine-tuned. This folder holds the
whole experiment on a task made for it, with every file needed to check the numbers.
{smoke}
## Result ({seeds_note}; test split, never used to choose settings)

{_md_table(header, _result_rows(results))}

Gains are T-CNN minus the no-SA baseline of the same seed. In plain words:

""" + '\n'.join(f'- {line}' for line in verdict(results)) + f"""

The conversion is exact: in its exact configuration the T-CNN computes {cnns} with a maximum relative
logits error of {conv['max_rel_err']:.1e} (float32, {conv['gpsa_layers']} GPSA layers,
{conv['params_cnn'] / 1e6:.3f}M -> {conv['params_t_cnn'] / 1e6:.3f}M parameters); at the fine-tuning init
(alpha = lambda = 1) the logits deviate by {init_dev}: the init loosens locality and gates so that heads can learn
content attention.
"""


def _readme_reference(results: Mapping[str, Any]) -> str:
    """Every headline number against the documented distribution of the plan (docs/demo.md)."""
    ref = results.get('reference') or {}
    if not ref.get('available'):
        return f'\nNo comparison with the documented distribution: {ref.get("why", "none")}.\n'
    envs = '; '.join(f'torch {e["torch"]}, timm {e["timm"]}, Pillow {e["pillow"]}, {e["threads"]} thread(s) x '
                     f'{e["jobs"]} process(es), {e["seeds"]} seeds' for e in ref['environments'])
    rows = [[HEADLINE_TITLES[key], ', '.join(f'{v:.3g}' for v in n['values']),
             f'{n["reference"]["mean"]:.3g} ± {n["reference"]["std"]:.2g}',
             f'{n["reference"]["min"]:.3g} to {n["reference"]["max"]:.3g}', _where(n)]
            for key, n in ref['numbers'].items()]
    return f"""
### Against the documented distribution

What another machine sees: every headline number over {ref['seeds']} full-pipeline seeds of this plan (each its own
CNN and fine-tuning), measured {ref['measured'] or 'when this tcnn was released'} ({envs}). A different torch build,
CPU or thread count changes the floating-point rounding, and from there the whole training: numbers anywhere in the
documented range, or a little past it, are what this demo gives, not a failure to reproduce it. A number is flagged
only outside the band, {BAND_TEXT} (docs/demo.md says why).

{_md_table(['number', 'this run (per seed)', 'documented mean ± sd', 'documented range', 'this run lies'], rows)}

""" + '\n'.join(reference_lines(results)[:1]) + '\n'


def _readme_details(results: Mapping[str, Any]) -> str:
    """Per seed (with the attention statistics) and per corruption."""
    def attention(r: Mapping[str, Any]) -> List[str]:  # the ANALYSIS_MEANS columns
        return ['' if r.get(key) is None else format(r[key] * scale, fmt) for key, fmt, scale in (
            ('gate_mean', '.3f', 1), ('span_mean', '.2f', 1), ('sigma_mean', '.2f', 1), ('nonlocality_mean', '.2f', 1),
            ('nonlocality_real_mean', '.2f', 1), ('padding_share_mean', '.1f', 100))]

    per_seed = [[str(r['seed']), ARM_TITLES[r['arm']], f'{r["clean_top1"]:.1f}', f'{r["corrupted_top1"]:.1f}',
                 *attention(r), f'{r["train_s"]:.0f}'] for r in results['runs']]
    for init in results['init']['seeds']:
        per_seed.append([str(init['seed']), 'T-CNN at init (before fine-tuning)', '', '', *attention(init), ''])
    corr_names = list(results['runs'][0]['corruptions'])
    corr_rows = []
    for arm in results['summary']:
        rs = [r for r in results['runs'] if r['arm'] == arm]
        corr_rows.append([ARM_TITLES[arm]] + [
            f'{sum(r["corruptions"][c]["top1"] for r in rs) / len(rs):.1f}' for c in corr_names])
    analysed = next((r['analysis'] for r in results['runs'] if r.get('analysis')), {})
    grids = sorted({f'{e["grid"][0]}x{e["grid"][1]} tokens of {e["token_px"][0]:.3g} px' for e in
                    analysed.get('layers', {}).values() if e.get('grid')})
    return f"""
### Per seed

{_md_table(['seed', 'model', 'clean top-1 %', 'corrupted top-1 %', 'gate σ(λ), 0-1', 'span 1/α, tokens²',
            'σ = 1/√(2α), tokens', 'nonlocality, tokens', 'nonlocality on real keys, tokens',
            'attention on padding, %', 'train s'], per_seed)}

Means over heads and GPSA layers, with `tcnn.evaluation.analysis` (docs/analysis.md, "What the numbers mean"). Gate:
sigma(lambda) (1: positional attention only, 0: content only). Span: 1/alpha, in tokens² (not a distance); σ: the
width (standard deviation) of the positional Gaussian, in tokens. Nonlocality (ConViT eq. 8): mean distance between a
query and the keys it attends to (gated attention), in tokens of the layers' input grid
({', '.join(grids) or 'not measured'}), over all keys including the conv's zero padding, and over the real keys with
each query's attention renormalised over them; attention on padding: the share of the gated attention on padded keys.
Averaged over {analysed.get('num_images', 0)} test images.

### Accuracy by corruption (top-1 %, mean over severities and seeds)

{_md_table(['model'] + corr_names, corr_rows)}
"""


def _readme_figures(results: Mapping[str, Any]) -> str:
    figs = results.get('figures', {})
    rel = lambda p: os.path.relpath(p, os.path.dirname(results['eval_file']))  # noqa: E731
    fig_lines = []
    if figs.get('robustness'):
        fig_lines.append(f'![accuracy by corruption]({rel(figs["robustness"])})')
    for arm, path in figs.get('curves', {}).items():
        fig_lines.append(f'![training curves, {ARM_TITLES[arm]}]({rel(path)})')
    for path in figs.get('attention', []):
        fig_lines.append(f'![{os.path.basename(path)}]({rel(path)})')
    return '\n## Figures\n\n' + '\n\n'.join(fig_lines) + '\n'


def _readme_method(results: Mapping[str, Any]) -> str:
    """The task, how the experiment was made, the files and the environment."""
    plan, ds, env = results['plan'], results['dataset'], results['environment']
    late = (f""", `t-cnn-late` (CNN for {plan['late_epoch']} epochs, then
   reparameterised: the paper's Table 3)""" if plan['late_epoch'] is not None else '')
    return f"""
## The task

{ds['rule'].capitalize()}. Every image ({ds['task_params']['img_size']} px) holds {ds['task_params']['num_objects']}
shapes of the kinds {', '.join(ds['classes'])}, with random positions (at least
{ds['task_params']['min_distance']} image widths apart), sizes and colours on a random background. Telling the kinds
apart is local; finding which kind is the single one needs the shapes to be compared across the image. Splits:
{ds['sizes']['train']} train, {ds['sizes']['val']} val, {ds['sizes']['test']} test images (dataset seed
{ds['seed']}); {ds['corrupt_count']} test images corrupted with {', '.join(ds['corruptions'])} at 5 severities
(ImageNet-C parameters) in `data/test-c`.

## How it was made

1. Per seed, the CNN: `demo_resnet10` trained from scratch for {plan['pretrain_epochs']} epochs (`runs/seedS-cnn`).
2. From the seed's CNN, {plan['finetune_epochs']} fine-tuning epochs each: `no-sa` (the CNN, `tcnn train --no-sa`),
   `t-cnn` (`tcnn.reparameterize`, verified, then the recipe){late}.
3. `tcnn eval` of every final model on `data/test` and `data/test-c` (`eval.json`), gates, spans and nonlocality
   with `tcnn.evaluation.analysis`, attention maps with `tcnn inspect`.

Changes from the paper's fine-tuning recipe:

""" + '\n'.join(f'- {c}' for c in results['recipe_changes']) + f"""

The settings (epochs, learning rates) were chosen on the validation split; the test split only gives the table.

## Files

- `data/`: the dataset (`dataset.json` its parameters, `SPLIT.jsonl` every image's scene); `data/test-c` ImageNet-C
  layout
- `runs/NAME/`: each training run (`metrics.jsonl`, `last.pt`, `best.pt`, `log.txt`)
- `models/NAME.pt`: each final model, `tcnn.load`-able; `models/seedS-init-t-cnn.pt` the seed's T-CNN before
  fine-tuning
- `eval.json`, `eval.md`: `tcnn eval`'s output; `results.json`: everything in this page
- Check a number: `tcnn eval models/seed0-t-cnn.pt --suite imagenet --data data/test --img-size {IMG_SIZE} --crop-pct 1`

Wall time of the last `tcnn demo` call {results.get('wall_s', 0) / 60:.1f} min (every training run's time in the
per-seed table above; {env['jobs']} training process(es) at a time) on {env['cpus']} CPUs ({env['threads']} torch
threads per process, device {env['device']}); torch {env['torch']}, torchvision {env['torchvision']}, timm
{env['timm']}, Pillow {env['pillow']}, numpy {env['numpy']}, tcnn {env['tcnn']}.
"""


def render_readme(results: Mapping[str, Any]) -> str:
    """The demo's ``README.md``: the table, what it means, the details, the figures, how it was made."""
    return ''.join(f(results) for f in (_readme_result, _readme_reference, _readme_details, _readme_figures,
                                         _readme_method))
