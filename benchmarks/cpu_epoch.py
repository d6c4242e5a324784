#!/usr/bin/env python3
"""What one epoch of the demo's CNN costs a CPU, whole process included: user and kernel time, wall time, peak
memory, page faults and the loop's wait for data, for settings compared side by side.

    python benchmarks/cpu_epoch.py                                  # the allocator: glibc's default vs tcnn's
    python benchmarks/cpu_epoch.py --variants pil resident device   # the data pipelines
    python benchmarks/cpu_epoch.py --smoke                          # the code path in a minute

Each run is the demo's own ``tcnn train`` process for its CNN (``tcnn.demo.runner``'s arguments: demo_resnet10 from
scratch, 96 px, batch 64, colour jitter and flips, label smoothing, channels-last), one epoch on the quick plan's 2400
training images (300 validation), one torch thread (the demo runs one process per core) and ``--workers 0`` (a
one-thread process loads its own images), as ``tcnn demo`` starts it. Variants run in interleaved pairs (A B, A B,
...) so that drifts of the machine hit both; the table gives medians and the ratio of the medians.

The numbers: user and system (kernel) CPU time and peak resident memory of the process (``os.wait4``), minor page
faults, wall time from start to exit, and the epoch's own ``img_per_s``, ``data_wait`` (share of the training loop
spent waiting for the next batch) and ``epoch_time_s`` (training plus validation) from its ``metrics.jsonl``.
"""
import argparse
import dataclasses
import datetime
import json
import os
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

from tcnn.demo import runner, synthetic  # noqa: E402
from tcnn.demo.plan import DATA_SEED, IMG_SIZE, PLANS  # noqa: E402
from tcnn.demo.pool import Context  # noqa: E402
from tcnn.files import run_folder  # noqa: E402

from benchmarks.report import machine_info, write_json  # noqa: E402

# name -> (environment, extra tcnn train arguments, what it is)
VARIANTS: Dict[str, tuple] = {
    'system-malloc': ({'TCNN_MALLOC': 'system'}, ['--data-pipeline', 'pil'],
                      "glibc's default malloc: freed memory goes back to the kernel (tcnn <= 0.6)"),
    'pil': ({}, ['--data-pipeline', 'pil'], "timm's PIL transform per image (tcnn's malloc)"),
    'resident': ({}, ['--data-pipeline', 'resident'], 'the data decoded once, augmented in batches'),
    'device': ({}, ['--data-pipeline', 'device'], 'file bytes read per batch, decoded and augmented in batches'),
    'auto': ({}, [], 'the default data pipeline'),
}
METRIC_KEYS = ('img_per_s', 'step_img_per_s', 'data_wait', 'epoch_time_s')


def _run(ctx: Context, name: str, variant: str, threads: int) -> Dict[str, Any]:
    env_extra, extra, _ = VARIANTS[variant]
    plan = ctx.plan
    shutil.rmtree(ctx.run_dir(name), ignore_errors=True)  # a fresh run (the demo's --resume auto would skip it)
    argv = runner._train_argv(ctx, name, 0, 1, plan.pretrain_lr, ['--no-pretrained', '--no-sa', *extra])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **env_extra)
    for key in ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_'):
        env.pop(key, None)  # this process's own setting must not reach the runs
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, '-m', 'tcnn', *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    output = proc.stdout.read().decode(errors='replace')
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f'{variant}: tcnn train failed (exit {proc.returncode}):\n{output[-3000:]}')
    metrics = run_folder.read_metrics(os.path.join(ctx.run_dir(name), run_folder.METRICS_FILE))[-1]
    row = {'variant': variant, 'user_s': usage.ru_utime, 'sys_s': usage.ru_stime, 'wall_s': wall,
           'peak_rss_mib': usage.ru_maxrss / 1024, 'minor_faults': usage.ru_minflt,
           **{k: metrics.get(k) for k in METRIC_KEYS}}
    row['kernel_share'] = row['sys_s'] / (row['user_s'] + row['sys_s'])
    return row


def _summary(rows: List[Dict[str, Any]], variants: List[str]) -> Dict[str, Dict[str, float]]:
    keys = ('user_s', 'sys_s', 'wall_s', 'peak_rss_mib', 'minor_faults', 'kernel_share') + METRIC_KEYS
    return {v: {k: statistics.median(r[k] for r in rows if r['variant'] == v and r[k] is not None) for k in keys}
            for v in variants}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--variants', nargs='+', default=['system-malloc', 'pil'], choices=sorted(VARIANTS))
    parser.add_argument('--pairs', type=int, default=5, help='interleaved rounds (default 5)')
    parser.add_argument('--threads', type=int, default=1, help='torch threads per run (the demo: 1)')
    parser.add_argument('--smoke', action='store_true', help='the tiny plan\'s data, one round')
    parser.add_argument('--out', help='work folder (default: a temporary folder; its data is reused)')
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args(argv)
    # the 2400 training images its recorded measurements used (the quick plan has fewer since demo version 3)
    plan = PLANS['tiny'] if args.smoke else dataclasses.replace(PLANS['quick'], train=2400)
    pairs = 1 if args.smoke else args.pairs
    out = args.out or os.path.join(tempfile.gettempdir(), f'tcnn-cpu-epoch-{plan.name}')
    ctx = Context(out, plan, 'cpu', 0, False, print, 1, args.threads)
    synthetic.generate(ctx.data, sizes={'train': plan.train, 'val': plan.val, 'test': 0}, seed=DATA_SEED,
                       task=synthetic.OddColour(img_size=IMG_SIZE), corruptions=(), progress=False)
    rows = []
    for i in range(pairs):
        for variant in args.variants:
            name = f'{variant}-{i}'
            row = _run(ctx, name, variant, args.threads)
            rows.append(row)
            print(f'{variant:14s} user {row["user_s"]:6.1f} s  sys {row["sys_s"]:5.1f} s  wall {row["wall_s"]:6.1f} s  '
                  f'peak {row["peak_rss_mib"]:6.0f} MiB  faults {row["minor_faults"] / 1e6:5.2f} M  '
                  f'{row["img_per_s"]:6.1f} img/s  data wait {100 * row["data_wait"]:4.1f}%', flush=True)
    summary = _summary(rows, args.variants)
    base = args.variants[0]
    print(f'\nmedians of {pairs} round(s); ratio: {base} / variant (wall), variant / {base} (peak memory)')
    print('| variant | user s | sys s | kernel share | wall s | wall speed-up | peak MiB | minor faults | img/s | '
          'data wait |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for v, s in summary.items():
        print(f'| {v} | {s["user_s"]:.1f} | {s["sys_s"]:.1f} | {100 * s["kernel_share"]:.1f}% | {s["wall_s"]:.1f} | '
              f'{summary[base]["wall_s"] / s["wall_s"]:.2f}x | {s["peak_rss_mib"]:.0f} | '
              f'{s["minor_faults"] / 1e6:.2f} M | {s["img_per_s"]:.1f} | {100 * s["data_wait"]:.1f}% |')
    if args.json:
        write_json({'schema': 'tcnn-cpu-epoch', 'date': datetime.date.today().isoformat(),
                    'command': 'python benchmarks/cpu_epoch.py ' + ' '.join(sys.argv[1:] if argv is None else argv),
                    'machine': machine_info(torch.device('cpu')), 'threads': args.threads, 'plan': plan.to_dict(),
                    'variants': {v: VARIANTS[v][2] for v in args.variants}, 'rows': rows, 'summary': summary},
                   args.json)
        print(f'wrote {args.json}')
    print(json.dumps({'rounds': pairs}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
