#!/usr/bin/env python3
"""Train the converged CNNs that ``tcnn demo`` fine-tunes and store them in the package (``tcnn/demo/cnns``).

    python benchmarks/demo_cnns.py --seeds 10 --out /tmp/demo-cnns --write   # resumable: the same command continues

Each seed's CNN is trained from scratch exactly as ``tcnn demo --train-cnns`` trains it (the default plan's data and
``tcnn train`` arguments, the seed as ``--seed``, one thread per process), in the demo's pool of training processes.
``--write`` copies every finished CNN (``tcnn.save`` of its last checkpoint) and its per-epoch metrics into
``tcnn/demo/cnns`` and writes ``record.json``: the command, the data, the environment, each CNN's SHA-256, final val
top-1 and plateau (``tcnn.demo.dynamics.plateau``). It refuses to write a CNN that has not reached its plateau.
"""
import argparse
import datetime
import json
import os
import shutil
import sys
import time
from typing import Dict, Sequence

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tcnn.atomic import atomic_write_text  # noqa: E402
from tcnn.demo import shipped  # noqa: E402
from tcnn.demo.dynamics import plateau  # noqa: E402
from tcnn.demo.plan import CNN, PLANS, SCRATCH, run_name  # noqa: E402
from tcnn.demo.pool import Context, Run, parallel_layout, train_all  # noqa: E402
from tcnn.demo.results import environment  # noqa: E402
from tcnn.demo.runner import _arm_argv, _export, _generate  # noqa: E402
from tcnn.evaluation.plots import load_metrics  # noqa: E402


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, default=10, help='CNNs to train: seeds 0 .. N-1 (default 10)')
    parser.add_argument('--out', default='demo-cnns', help='the working folder (resumable)')
    parser.add_argument('--jobs', type=int, help='training processes at once (default: one per core)')
    parser.add_argument('--write', action='store_true', help=f'store the CNNs and record.json in {shipped.SHIPPED_DIR}')
    args = parser.parse_args(argv)
    import dataclasses
    plan = dataclasses.replace(PLANS['default'], cnns=SCRATCH, seeds=args.seeds)
    out = os.path.abspath(args.out)
    jobs, threads = parallel_layout('cpu', plan.seeds, args.jobs)
    ctx = Context(out, plan, 'cpu', None, False, print, jobs, threads)
    timings: Dict[str, float] = {}
    start = time.perf_counter()
    _generate(ctx, timings)
    files: Dict[str, str] = {}

    def done(seed: int) -> None:
        files[run_name(seed, CNN)] = _export(ctx, run_name(seed, CNN))

    runs = [Run(run_name(s, CNN), _arm_argv(ctx, CNN, s), plan.pretrain_epochs, finished=lambda s=s: done(s))
            for s in range(plan.seeds)]
    train_all(ctx, runs, timings)
    cnns = {}
    for s in range(plan.seeds):
        name = run_name(s, CNN)
        metrics = load_metrics(ctx.run_dir(name))
        p = plateau(metrics)
        cnns[str(s)] = {'sha256': shipped.sha256(files[name]), 'epochs': len(metrics),
                        'val_top1': metrics[-1]['val_top1'], 'plateau': p,
                        'train_s': sum(r.get('epoch_time_s') or 0.0 for r in metrics)}
        print(f'{name}: val top-1 {metrics[-1]["val_top1"]:.1f}% after {len(metrics)} epochs, '
              f'{"at" if p and p["at_plateau"] else "NOT at"} its plateau ({p["gain"]:+.1f} points)')
    if not args.write:
        return 0
    rising = [s for s, c in cnns.items() if not (c['plateau'] and c['plateau']['at_plateau'])]
    if rising:
        print(f'seeds {", ".join(rising)} have not reached their plateau: nothing written', file=sys.stderr)
        return 1
    os.makedirs(shipped.SHIPPED_DIR, exist_ok=True)
    for s in range(plan.seeds):
        shutil.copyfile(files[run_name(s, CNN)], os.path.join(shipped.SHIPPED_DIR, shipped.model_name(s)))
        with open(os.path.join(ctx.run_dir(run_name(s, CNN)), 'metrics.jsonl'), encoding='utf-8') as f:
            atomic_write_text(os.path.join(shipped.SHIPPED_DIR, shipped.metrics_name(s)), f.read())
    argv0 = [a.replace(out, 'OUT') for a in _arm_argv(ctx, CNN, 0)]
    record = {'format': shipped.RECORD_FORMAT, 'made': datetime.date.today().isoformat(),
              'command': f'python benchmarks/demo_cnns.py --seeds {plan.seeds} --write',
              'tcnn_train': 'tcnn ' + ' '.join(argv0) + '  (seed S: --seed S)', 'train': plan.train,
              'data': shipped.data_key(plan), 'pretrain_epochs': plan.pretrain_epochs,
              'environment': environment('cpu', jobs, threads), 'wall_s': time.perf_counter() - start, 'cnns': cnns}
    atomic_write_text(shipped.RECORD_FILE, json.dumps(record, indent=2) + '\n')
    print(f'wrote {plan.seeds} CNNs and {shipped.RECORD_FILE}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
