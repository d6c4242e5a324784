#!/usr/bin/env python3
"""The distribution of ``tcnn demo``'s headline numbers over seeds (docs/demo.md quotes it).

    python benchmarks/demo_distribution.py --seeds 10 --out /tmp/demo-dist   # runs tcnn demo --seeds 10 there
    python benchmarks/demo_distribution.py --results A/results.json B/results.json   # pools finished demos

Each seed of the default plan fine-tunes its own converged CNN (shipped with tcnn) with and without self-attention.
Pass the ``results.json`` of demos run in other environments (another torch build, CPU) to pool them. The per-seed
table goes to ``benchmarks/results/demo-distribution-DATE.json`` and, as markdown, to stdout, with the paired gains'
95% intervals over all the seeds pooled. A demo run here is resumable: the same command continues it.
"""
import argparse
import datetime
import json
import os
import shutil
import sys
from typing import Any, Dict, List, Mapping, Sequence

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tcnn.atomic import atomic_write_text  # noqa: E402
from tcnn.demo.judgement import interval  # noqa: E402
from tcnn.demo.reference import HEADLINE, HEADLINE_TITLES, build_reference  # noqa: E402
from tcnn.demo.runner import run_demo  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')


def _fmt(key: str, v: float) -> str:
    if key.endswith(('gate_mean', 'span_mean')):
        return f'{v:.3f}'
    if key.endswith('nonlocality_mean'):
        return f'{v:.2f}'
    return f'{v:+.1f}' if '/gain_' in key else f'{v:.1f}'


def _environment_name(env: Mapping[str, Any]) -> str:
    return (f'torch {env["torch"]}, torchvision {env.get("torchvision", "?")}, timm {env["timm"]}, Pillow '
            f'{env.get("pillow", "?")}, numpy {env.get("numpy", "?")}, {env["threads"]} thread(s) x {env["jobs"]} '
            f'process(es) on {env["cpus"]} CPUs ({env["machine"]}), {env["device"]}')


def markdown(reference: Mapping[str, Any]) -> str:
    """Per seed and environment every headline number, then mean, sd and range over all of them."""
    keys = [k for k, _ in HEADLINE if k in reference['stats']]
    lines = []
    for e, env in enumerate(reference['environments']):
        lines.append(f'Environment {chr(65 + e)}: {_environment_name(env)}; {env["seeds"]} seeds'
                     + (f', {env["wall_s"] / 60:.0f} min wall clock' if env.get('wall_s') else '') + '.')
    lines.append('')
    header = ['number'] + [f'{chr(65 + e)}{s}' for e, env in enumerate(reference['environments'])
                           for s in range(env['seeds'])] + ['mean', 'sd', 'min to max']
    lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for key in keys:
        stats = reference['stats'][key]
        cells = [_fmt(key, v) for env in reference['environments'] for v in env['values'].get(key, [])]
        lines.append('| ' + ' | '.join([HEADLINE_TITLES[key], *cells, _fmt(key, stats['mean']),
                                        f'{stats["std"]:.3g}', f'{_fmt(key, stats["min"])} to '
                                                               f'{_fmt(key, stats["max"])}']) + ' |')
    return '\n'.join(lines) + '\n'


def _reuse(demo: str, out: str, seeds: int) -> Dict[str, Any]:
    """Copy the runs and model files of the finished demo ``demo`` into a new demo folder ``out`` of ``seeds`` seeds
    (its settings are the reused demo's, the seeds aside); returns the reused demo's results."""
    with open(os.path.join(demo, 'demo.json'), encoding='utf-8') as f:
        settings = json.load(f)
    with open(os.path.join(demo, 'results.json'), encoding='utf-8') as f:
        results = json.load(f)
    if settings['plan']['name'] != 'default' or settings['plan']['seeds'] >= seeds:
        raise SystemExit(f'--reuse needs a default demo with fewer than {seeds} seeds')
    if os.path.exists(out):
        raise SystemExit(f'--reuse starts a new demo folder: {out} exists')
    for folder in ('runs', 'models'):
        shutil.copytree(os.path.join(demo, folder), os.path.join(out, folder))
    settings['plan']['seeds'] = seeds
    atomic_write_text(os.path.join(out, 'demo.json'), json.dumps(settings, indent=2) + '\n')
    return results


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, default=10, help='seeds of the demo run here (default 10)')
    parser.add_argument('--out', default='demo-distribution', help='the demo folder (a run here is resumable)')
    parser.add_argument('--jobs', type=int, help="tcnn demo's --jobs (the numbers do not depend on it as long as each "
                                                 'process keeps one thread)')
    parser.add_argument('--reuse', metavar='DEMO',
                        help='a finished default demo with fewer seeds, run on this machine with this code: its '
                             'complete runs are copied in and not trained again (each process has one thread, so '
                             'a seed trains to the same bits; the copied seeds\' numbers are checked against it)')
    parser.add_argument('--results', nargs='+', metavar='JSON',
                        help='results.json of finished demos (one per environment) instead of running one')
    args = parser.parse_args(argv)
    if args.results:
        runs: List[Dict[str, Any]] = []
        for path in args.results:
            with open(path, encoding='utf-8') as f:
                runs.append(json.load(f))
    else:
        reused = _reuse(args.reuse, args.out, args.seeds) if args.reuse else None
        runs = [run_demo(args.out, plan='default', seeds=args.seeds, jobs=args.jobs, progress=False)]
        if reused:
            again = {r['name']: (r['clean_top1'], r['corrupted_top1']) for r in runs[0]['runs']}
            differ = [r['name'] for r in reused['runs'] if again[r['name']] != (r['clean_top1'], r['corrupted_top1'])]
            if differ:
                print(f'the reused runs score otherwise here: {", ".join(differ)}', file=sys.stderr)
                return 1
    today = datetime.date.today().isoformat()
    reference = build_reference(runs, measured=today)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f'demo-distribution-{today}.json')
    atomic_write_text(path, json.dumps(reference, indent=1) + '\n')
    print(markdown(reference))
    for key in ('t-cnn/gain_clean', 't-cnn/gain_corrupted'):
        values = [v for env in reference['environments'] for v in env['values'].get(key, [])]
        if len(values) > 1:
            g = interval(values)
            print(f'{HEADLINE_TITLES[key]}: {g["mean"]:+.2f}, 95% CI {g["lo"]:+.2f} to {g["hi"]:+.2f} (n = {g["n"]}, '
                  f'sd {g["std"]:.2f}, half-width {g["half"]:.2f})')
    print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
