#!/usr/bin/env python3
"""The distribution of ``tcnn demo``'s headline numbers over full-pipeline seeds: what another machine sees.

    python benchmarks/demo_distribution.py --seeds 6 --out /tmp/demo-dist --write  # runs tcnn demo --seeds 6 there
    python benchmarks/demo_distribution.py --results A/results.json B/results.json --write  # pools finished demos

Each seed of the default plan trains its own CNN from scratch on the one dataset, then its fine-tuning arms, so the
spread over seeds is the spread of the whole pipeline. Pass the ``results.json`` of demos run in other environments
(another torch build, thread count) to pool them: the documented range should cover what any of them gives.
``--write`` stores the pooled distribution as ``tcnn/demo/reference.json``, the one every demo report compares its
numbers with; the per-seed table goes to ``benchmarks/results/demo-distribution-DATE.json`` and, as markdown, to
stdout (docs/demo.md quotes it). A demo run here is resumable: the same command continues it.
"""
import argparse
import datetime
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Sequence

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tcnn.atomic import atomic_write_text  # noqa: E402
from tcnn.demo.reference import HEADLINE, HEADLINE_TITLES, REFERENCE_FILE, build_reference  # noqa: E402
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


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, default=6, help='seeds of the demo run here (default 6)')
    parser.add_argument('--out', default='demo-distribution', help='the demo folder (a run here is resumable)')
    parser.add_argument('--jobs', type=int, help="tcnn demo's --jobs (the numbers do not depend on it as long as each "
                                                 'process keeps one thread)')
    parser.add_argument('--results', nargs='+', metavar='JSON',
                        help='results.json of finished demos (one per environment) instead of running one')
    parser.add_argument('--write', action='store_true', help=f'write {REFERENCE_FILE}')
    args = parser.parse_args(argv)
    if args.results:
        runs: List[Dict[str, Any]] = []
        for path in args.results:
            with open(path, encoding='utf-8') as f:
                runs.append(json.load(f))
    else:
        runs = [run_demo(args.out, plan='default', seeds=args.seeds, jobs=args.jobs, progress=False)]
    today = datetime.date.today().isoformat()
    reference = build_reference(runs, measured=today)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f'demo-distribution-{today}.json')
    atomic_write_text(path, json.dumps(reference, indent=1) + '\n')
    if args.write:
        atomic_write_text(REFERENCE_FILE, json.dumps(reference, indent=1) + '\n')
    print(markdown(reference))
    print(f'wrote {path}' + (f' and {REFERENCE_FILE}' if args.write else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
