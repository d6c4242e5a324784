#!/usr/bin/env python3
"""Benchmark the T-CNN against its CNN, our GPSA layer against the obvious implementation, and the paper.

    python benchmarks/run.py --quick                      # a few minutes on 2 CPU cores
    python benchmarks/run.py --device cuda --amp --channels-last --batch-size 32 256
    python benchmarks/run.py --device cuda --amp --channels-last --compile --batch-size 32 256
    python benchmarks/run.py --timer cpu --models convnext_tiny --stages convnext_tiny=stages.3 --label convnext

Writes ``<out>/<device>[-flags]-<date>.json`` and regenerates ``<out>/README.md`` (default out:
``benchmarks/results``). Models and inputs are random; nothing is downloaded. See docs/benchmarks.md.
"""
import argparse
import dataclasses
import datetime
import os
import shlex
import sys
import time
from typing import Any, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import report, suites  # noqa: E402
from tcnn.runtime.compiling import COMPILE_MODES  # noqa: E402
from benchmarks.paper import paper_figures  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')
SECTIONS = ('models', 'layers', 'conversion')
COMPILE_WARMUP = 3  # untimed calls of each compiled function, at least
FULL_MODELS = ['resnet50d', 'resnetrs50', 'resnet101d', 'resnetrs101', 'resnet152d', 'resnetrs152', 'resnet200d',
               'resnetrs200', 'resnetrs270', 'resnetrs350']


def presets(preset: str, device: str) -> Dict[str, Any]:
    """Default settings of each preset; explicit command-line options override them."""
    cuda = device == 'cuda'
    if preset == 'smoke':  # every code path on one tiny model; for tests, not for numbers
        return dict(models=['resnet18d'], sizes=[64], batch_sizes=[2], repeats=1, warmup=0, iters=1,
                    variants=['sdpa', 'reference'], variant_sizes=None, layer_grids=[4], layer_channels=64,
                    goal_size=64)
    if preset == 'quick':
        return dict(models=['resnet50d', 'resnetrs50'], sizes=[160, 224, 320], batch_sizes=[32 if cuda else 4],
                    repeats=10 if cuda else 5, warmup=5 if cuda else 1, iters=5 if cuda else 1,
                    variants=['sdpa', 'reference'], variant_sizes=[224], layer_grids=[5, 7, 12])
    if cuda:
        return dict(models=FULL_MODELS, sizes=[160, 224, 320], batch_sizes=[32, 256], repeats=10, warmup=5, iters=3,
                    variants=['sdpa', 'reference'], variant_sizes=None, layer_grids=[5, 7, 10, 12])
    # On a CPU the GPU preset would take hours (resnetrs350 alone is ~8x resnet50's work): every model at 224 px,
    # the other designs left to --quick, which measures them on the 50-layer models.
    return dict(models=FULL_MODELS, sizes=[224], batch_sizes=[4], repeats=5, warmup=1, iters=1, variants=[],
                variant_sizes=None, layer_grids=[5, 7, 10, 12])


def build_parser() -> argparse.ArgumentParser:
    summary, usage = __doc__.split('\n\n', 1)
    p = argparse.ArgumentParser(description=summary, epilog=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    preset = p.add_mutually_exclusive_group()
    preset.add_argument('--quick', action='store_true',
                        help='resnet50d and resnetrs50 at 160/224/320, fewer repeats (a few minutes on 2 CPU cores)')
    preset.add_argument('--smoke', action='store_true',
                        help='one tiny model at 64 px, one repeat, one thread: checks that everything runs (tests)')
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    p.add_argument('--amp', action='store_true', help='bf16 autocast')
    p.add_argument('--channels-last', action='store_true', help='channels_last models and inputs')
    p.add_argument('--compile', nargs='?', const='default', choices=COMPILE_MODES, metavar='MODE',
                   help='torch.compile every model and layer (static shapes) in MODE: default (the flag alone), '
                        'reduce-overhead or max-autotune (CUDA graphs), max-autotune-no-cudagraphs')
    p.add_argument('--batch-size', type=int, nargs='+', help='batch size(s) of the whole-model runs')
    p.add_argument('--models', nargs='+', help=f'timm model names (full run: {" ".join(FULL_MODELS)})')
    p.add_argument('--stages', nargs='+', metavar='MODEL=STAGE[,STAGE]', default=[],
                   help='stages to convert per model (default: the last ResNet stage), e.g. convnext_tiny=stages.3')
    p.add_argument('--label', default='',
                   help='added to the results name and configuration tag (runs of other models or stages)')
    p.add_argument('--sizes', type=int, nargs='+', help='input resolutions (default 160 224 320)')
    p.add_argument('--repeats', type=int, help='timed repeats per measurement (medians are reported)')
    p.add_argument('--warmup', type=int, help=f'untimed calls before timing (at least {COMPILE_WARMUP} with --compile)')
    p.add_argument('--iters', type=int, help='calls per timed repeat')
    p.add_argument('--variants', nargs='*', choices=['sdpa', 'reference'],
                   help='other GPSA designs to run in the whole models (default: both; --quick: at 224 only; '
                        'the option alone: none)')
    p.add_argument('--layer-grids', type=int, nargs='+', help='output grids of the layer benchmark (5 7 10 12)')
    p.add_argument('--layer-batch', type=int, help='batch size of the layer benchmark (default: first --batch-size)')
    p.add_argument('--sections', nargs='+', choices=SECTIONS, default=list(SECTIONS), help='what to run')
    p.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s choice)')
    p.add_argument('--timer', choices=['wall', 'cpu'], default='wall',
                   help='wall clock (default), or CPU time of the one torch thread (implies --threads 1; for CPUs '
                        'shared with other jobs)')
    p.add_argument('--no-profile', action='store_true', help='do not profile the configurations that miss a goal')
    p.add_argument('--strict', action='store_true', help='exit with status 1 when a goal is missed')
    p.add_argument('--out', default=RESULTS_DIR, help='results folder (default benchmarks/results)')
    return p


def make_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> suites.Settings:
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is available')
    if args.timer == 'cpu' and (args.device != 'cpu' or (args.threads or 1) != 1):
        parser.error('--timer cpu measures one CPU thread: use it with --device cpu and without --threads > 1')
    preset = 'smoke' if args.smoke else 'quick' if args.quick else 'full'
    values = presets(preset, args.device)
    overrides = {'models': args.models, 'sizes': args.sizes, 'batch_sizes': args.batch_size, 'repeats': args.repeats,
                 'warmup': args.warmup, 'iters': args.iters, 'variants': args.variants,
                 'layer_grids': args.layer_grids, 'layer_batch': args.layer_batch}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if args.compile and values['warmup'] < COMPILE_WARMUP:
        # The first calls of a compiled function trace and compile it (and may recompile once for a new grad mode):
        # timing them would measure the compiler, not the model.
        values['warmup'] = COMPILE_WARMUP
    if values.get('variant_sizes') is not None:  # keep the preset's sizes that are run (possibly none)
        values['variant_sizes'] = [s for s in values['variant_sizes'] if s in values['sizes']]
    for key in ('repeats', 'iters'):
        if values[key] < 1:
            parser.error(f'--{key} must be >= 1')
    if any(v < 1 for v in values['batch_sizes'] + values['sizes'] + values['layer_grids']):
        parser.error('sizes, batch sizes and grids must be >= 1')
    import timm
    unknown = [m for m in values['models'] if not timm.is_model(m)]
    if unknown:
        parser.error(f'unknown timm model(s): {", ".join(unknown)}')
    stages = {}
    for spec in args.stages:
        model, _, names = spec.partition('=')
        if model not in values['models'] or not names:
            parser.error(f'--stages {spec}: expected MODEL=STAGE[,STAGE] with MODEL one of the --models')
        stages[model] = names.split(',')
    if args.label and not args.label.replace('_', '').isalnum():
        parser.error(f'--label {args.label}: letters, digits and underscores only (it names the results file)')
    return suites.Settings(device=args.device, preset=preset, amp=args.amp, channels_last=args.channels_last,
                           compile=args.compile, sections=list(args.sections), timer=args.timer, stages=stages,
                           label=args.label, **values)


def _log(start: float):
    def log(msg: str) -> None:
        print(f'[{time.perf_counter() - start:6.0f}s] {msg}', file=sys.stderr, flush=True)
    return log


def run(settings: suites.Settings, out_dir: str, command: str, profile: bool = True) -> Dict[str, Any]:
    """Run the selected sections, evaluate the goals, profile the misses, write the JSON and the README."""
    start = time.perf_counter()
    log = _log(start)
    device = settings.torch_device
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    if settings.compile:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    name = report.result_name(settings)
    results: Dict[str, Any] = {
        'schema': report.SCHEMA, 'name': name, 'config': report.config_tag(settings),
        'date': datetime.datetime.now().isoformat(timespec='seconds'), 'command': command,
        'settings': dataclasses.asdict(settings), 'machine': report.machine_info(device),
    }
    log(f'{name}: {results["machine"]["cpu"]}, {results["machine"]["torch_threads"]} threads, torch '
        f'{torch.__version__}, load {results["machine"]["loadavg_start"]}')
    path = os.path.join(out_dir, name + '.json')

    def write_partial(rows: List[Dict[str, Any]]) -> None:
        # A run stopped by a time limit (a rented GPU's minutes) keeps the rows it measured: the file is rewritten
        # after each row, marked partial until the run completes and writes it whole below.
        partial = dict(results, models=rows, partial=True, wall_time_s=time.perf_counter() - start,
                       loadavg_end=report.load_average())
        partial['goals'] = suites.evaluate_goals(partial, settings)
        report.write_json(partial, path)

    if 'models' in settings.sections:
        results['models'] = suites.bench_models(settings, log, on_row=write_partial)
    if 'layers' in settings.sections:
        results['layers'] = suites.bench_layers(settings, log)
    if 'conversion' in settings.sections:
        results['conversion'] = suites.bench_conversion(settings, log)
    results['paper'] = {m: f for m in settings.models if (f := paper_figures(m)) is not None}
    results['goals'] = suites.evaluate_goals(results, settings)
    results['profiles'] = []
    if profile:
        results['profiles'] = _profile_misses(results, settings, log)
    results['loadavg_end'] = report.load_average()
    results['wall_time_s'] = time.perf_counter() - start
    report.write_json(results, path)
    readme = report.write_readme(out_dir)
    for g in results['goals']:
        log(f'goal {"pass" if g["passed"] else "MISS"}: {g["goal"]} on {g["subject"]}: {g["value"]:.3f} '
            f'(target {g["target"]})')
    log(f'wrote {path} and {readme}')
    return results


def _profile_misses(results: Dict[str, Any], settings: suites.Settings, log) -> List[Dict[str, Any]]:
    """Profile every (model, size, batch, mode) whose speed goal was missed: which ops grew."""
    done, profiles = set(), []
    for g in results['goals']:
        if g['passed'] or 'img/s' not in g['goal']:
            continue
        mode = 'inference' if g['goal'].startswith('inference') else 'train'
        for row in results.get('models', []):
            subject = f'{row["model"]} {row["size"]}px batch {row["batch_size"]}'
            key = (row['model'], row['size'], row['batch_size'], mode)
            if subject == g['subject'] and key not in done:
                done.add(key)
                log(f'profiling {subject} {mode} (missed: {g["goal"]} {g["value"]:.3f})')
                profiles.append(suites.profile_gap(row['model'], row['size'], row['batch_size'], mode, settings))
    return profiles


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    settings = make_settings(args, parser)
    if args.threads or args.timer == 'cpu' or args.smoke:
        # One thread for the smoke run too: on a busy machine, multi-threaded first calls can take minutes.
        torch.set_num_threads(args.threads or 1)
    command = 'python benchmarks/run.py ' + ' '.join(shlex.quote(a) for a in argv)
    results = run(settings, args.out, command.strip(), profile=not args.no_profile)
    missed = [g for g in results['goals'] if not g['passed']]
    return 1 if args.strict and missed else 0


if __name__ == '__main__':
    sys.exit(main())
