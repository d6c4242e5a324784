"""``run_demo``: a demo from its plan to its report, or the rest of an interrupted one.

The data (``tcnn.demo.synthetic``), then every seed's training runs in the pool of ``tcnn train`` processes
(``tcnn.demo.pool``: the CNN, exported and its conversion verified as soon as it is trained, then its fine-tuning
arms), then evaluation, analysis and figures (``tcnn.demo.results``), the comparison with the documented
judgement (``tcnn.demo.judgement``) and the report (``tcnn.demo.report``).
"""
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from ..atomic import atomic_write_text
from ..convert.transform import reparameterize
from ..errors import InvalidArgumentError, TcnnError, check_device, check_number
from ..files import loading, tcnn_file
from ..paths import check_output_dir
from ..files import run_folder
from . import shipped, synthetic
from .judgement import judge, judgement_lines
from .plan import CNN, DATA_SEED, DEMO_FORMAT, DEMO_VERSION, IMG_SIZE, PLANS, SCRATCH, SHIPPED, Plan, run_name, \
    warmup_epochs
from .pool import Context, Run, loader_workers, parallel_layout, train_all
from .report import render_readme, summary_lines
from .results import collect_results, draw_figures, evaluate

__all__ = ['run_demo']


def _train_argv(ctx: Context, name: str, seed: int, epochs: int, lr: float, extra: Sequence[str]) -> List[str]:
    plan = ctx.plan
    argv = ['train', '--data', ctx.data, '--output', ctx.run_dir(name), '--resume', 'auto',
            '--model', 'demo_resnet10', '--img-size', str(IMG_SIZE), '--epochs', str(epochs),
            '--batch-size', str(plan.batch_size), '--lr', str(lr), '--seed', str(seed), '--device', ctx.device,
            '--set', 'scale_lr=false', '--set', 'aa=null', '--set', 'mixup=0', '--set', 'cutmix=0',
            '--set', 'reprob=0', '--set', 'scale=[1.0,1.0]', '--set', 'crop_pct=1.0',
            '--set', f'warmup_epochs={warmup_epochs(epochs)}',
            # channels-last pays on CPU too for this model (oneDNN's convolutions; measured in docs/demo.md)
            '--set', 'channels_last=true', '--no-progress']
    workers = ctx.workers if ctx.workers is not None else loader_workers(ctx.device, ctx.threads)
    if workers is not None:
        argv += ['--workers', str(workers)]
    return argv + list(extra)


def _export(ctx: Context, name: str) -> str:
    """The run's final weights as a model file (``tcnn.save`` of ``tcnn.load(last.pt)``)."""
    path = ctx.model_file(name)
    tcnn_file.save(loading.load(os.path.join(ctx.run_dir(name), run_folder.LAST_CHECKPOINT)), path)
    return path


def _verify_conversion(ctx: Context, seed: int) -> Dict[str, Any]:
    """``tcnn.reparameterize`` of the seed's trained CNN with verification: the T-CNN in its exact configuration
    computes the CNN (the error is measured), and its deviation at the fine-tuning init (alpha = lambda = 1). The
    T-CNN is kept as ``models/seedS-init-t-cnn.pt``: the reference the fine-tuned T-CNNs are compared with (its
    query/key init drawn from the seed)."""
    cnn = loading.load(ctx.model_file(run_name(seed, CNN)))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        t_cnn = reparameterize(cnn, input_size=(3, IMG_SIZE, IMG_SIZE))
    tcnn_file.save(t_cnn, ctx.model_file(run_name(seed, 'init-t-cnn')))
    rep = t_cnn.tcnn_report
    report = dataclasses.asdict(rep)
    report['seed'] = seed
    report['vacuous'] = rep.vacuous
    report['gpsa_layers'] = rep.num_gpsa
    report['params_cnn'] = sum(p.numel() for p in cnn.parameters())
    report['params_t_cnn'] = sum(p.numel() for p in t_cnn.parameters())
    return report


def _arm_argv(ctx: Context, arm: str, seed: int) -> List[str]:
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


def _demo_runs(ctx: Context, conversions: Dict[int, Dict[str, Any]], files: Dict[str, str],
               cnn_records: Dict[int, Dict[str, Any]]) -> List[Run]:
    """The training runs: every seed's fine-tuning arms from its CNN, after the CNN itself where the plan trains it
    (``cnns='scratch'``); a shipped CNN is installed (checked against its record) first. A CNN's conversion is
    verified as soon as it is there; a finished run is exported."""
    plan = ctx.plan

    def cnn_done(seed: int) -> None:
        if plan.cnns == SCRATCH:
            files[run_name(seed, CNN)] = _export(ctx, run_name(seed, CNN))
        conversions[seed] = _verify_conversion(ctx, seed)
        ctx.log(f'{run_name(seed, CNN)}: conversion max relative logits error {conversions[seed]["max_rel_err"]:.2e} '
                f'in the exact configuration; {conversions[seed]["init_max_rel_err"]:.1%} deviation at the '
                'fine-tuning init (alpha = lambda = 1)')

    def arm_done(name: str) -> None:
        files[name] = _export(ctx, name)

    runs: List[Run] = []
    if plan.cnns == SHIPPED:
        for s in range(plan.seeds):
            name = run_name(s, CNN)
            cnn_records[s] = shipped.install(plan, s, ctx.model_file(name), ctx.run_dir(name))
            files[name] = ctx.model_file(name)
            ctx.log(f'{name}: the converged CNN shipped with tcnn (final val top-1 {cnn_records[s]["val_top1"]:.1f}% '
                    f'after {cnn_records[s]["epochs"]} epochs; sha256 {cnn_records[s]["sha256"][:12]})')
            cnn_done(s)
    else:
        runs += [Run(run_name(s, CNN), _arm_argv(ctx, CNN, s), plan.pretrain_epochs,
                     finished=functools.partial(cnn_done, s)) for s in range(plan.seeds)]
    after = (lambda s: run_name(s, CNN)) if plan.cnns == SCRATCH else (lambda s: None)
    runs += [Run(run_name(s, arm), _arm_argv(ctx, arm, s), plan.finetune_epochs, after=after(s),
                 finished=functools.partial(arm_done, run_name(s, arm)))
             for s in range(plan.seeds) for arm in plan.arms]
    return runs


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
        plan: Union[str, Plan] = 'default',
        seeds: Optional[int] = None,
        train_cnns: bool = False,
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
        plan: ``default`` (about 13 minutes on 2 CPU cores), ``quick`` (about a minute), ``paper`` (50 fine-tuning
            epochs, a GPU's job), ``tiny`` (tests), or a ``Plan`` of one's own.
        seeds: Seeds (default: the plan's); seed S fine-tunes CNN S (the shipped converged CNN of seed S, or one
            trained here) with and without self-attention.
        train_cnns: Train the CNNs from scratch to their plateau (as the shipped ones were made) instead of
            fine-tuning the shipped ones.
        device: ``cpu``, ``cuda``, ``cuda:1``, ...
        workers: Data-loading processes per loader (default: none for a training process with one thread, else
            sized to the machine).
        jobs: Training processes at once (default: on CPU one per core, at most one per seed, one thread each;
            1 on a GPU; ``parallel_layout``).
        progress: Progress bars (data generation, evaluation).
        log: Where progress lines go.

    Returns:
        The results (also ``out/results.json``).
    """
    if isinstance(plan, Plan):
        p = plan
    elif plan in PLANS:
        p = PLANS[plan]
    else:
        raise InvalidArgumentError(f'plan must be one of {", ".join(PLANS)}, got {plan!r}')
    if train_cnns:
        p = dataclasses.replace(p, cnns=SCRATCH)
    if seeds is not None:
        check_number(seeds, 'seeds', ge=1, integer=True)
        p = dataclasses.replace(p, seeds=int(seeds))
    if workers is not None:
        check_number(workers, 'workers', ge=0, integer=True)
    if jobs is not None:
        check_number(jobs, 'jobs', ge=1, integer=True)
    check_device(device, 'device')
    check_output_dir(out, 'out')
    if p.cnns == SHIPPED:
        shipped.check_plan(p)
    out = os.path.abspath(out)
    jobs, threads = parallel_layout(device, p.seeds * len(p.arms), jobs)
    # what the numbers depend on (the processes at once do not: each has one thread on a CPU)
    settings = {'format': DEMO_FORMAT, 'version': DEMO_VERSION, 'plan': p.to_dict(), 'device': device,
                'workers': workers, 'threads': threads}
    _check_settings(out, settings)
    ctx = Context(out, p, device, workers, progress, log, jobs, threads)
    start = time.perf_counter()
    timings: Dict[str, float] = {}

    dataset = _generate(ctx, timings)
    log(f'== training: {p.seeds} seed(s) x ({CNN} + {", ".join(p.arms)}), {jobs} tcnn train process(es) at a time'
        + (f', {threads} thread(s) each' if threads else ''))
    conversions: Dict[int, Dict[str, Any]] = {}
    files: Dict[str, str] = {}
    cnn_records: Dict[int, Dict[str, Any]] = {}
    train_all(ctx, _demo_runs(ctx, conversions, files, cnn_records), timings)
    runs = [{'seed': seed, 'arm': arm, 'name': run_name(seed, arm), 'run_dir': ctx.run_dir(run_name(seed, arm)),
             'model_file': files[run_name(seed, arm)]} for seed in range(p.seeds) for arm in (CNN, *p.arms)]
    step = time.perf_counter()
    report = evaluate(ctx, {r['name']: r['model_file'] for r in runs})  # in seed and arm order
    timings['evaluation'] = time.perf_counter() - step
    step = time.perf_counter()
    results = collect_results(ctx, report, runs, [conversions[s] for s in range(p.seeds)], dataset, timings)
    results['cnns'] = {'source': p.cnns, 'shipped': {str(s): r for s, r in sorted(cnn_records.items())}}
    timings['analysis'] = time.perf_counter() - step
    step = time.perf_counter()
    results['figures'] = draw_figures(ctx, results)
    timings['figures'] = time.perf_counter() - step
    results['judgement'] = judge(results)
    results['wall_s'] = time.perf_counter() - start
    results['timings_s'] = timings
    atomic_write_text(os.path.join(out, 'results.json'), json.dumps(results, indent=2) + '\n')
    atomic_write_text(os.path.join(out, 'README.md'), render_readme(results))
    log(f'\n{summary_lines(results)}\n' + '\n'.join(judgement_lines(results['judgement'])) +
        f'\nwrote {os.path.join(out, "README.md")} and results.json ({results["wall_s"] / 60:.1f} min)')
    return results


def _generate(ctx: Context, timings: Dict[str, float]) -> Dict[str, Any]:
    plan = ctx.plan
    ctx.log(f'== data: {plan.train} train / {plan.val} val / {plan.test} test images ({IMG_SIZE} px), '
            f'{plan.corrupt} test images x {len(synthetic.DEFAULT_CORRUPTIONS)} corruptions x 5 severities -> '
            f'{ctx.data}')
    manifest = synthetic.generate(ctx.data, sizes={'train': plan.train, 'val': plan.val, 'test': plan.test},
                                  seed=DATA_SEED, task=plan.task(),
                                  corrupt_count=plan.corrupt, workers=ctx.workers, progress=ctx.progress)
    timings['data'] = manifest.pop('generation_s')
    return manifest

