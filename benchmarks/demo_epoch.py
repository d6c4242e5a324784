#!/usr/bin/env python3
"""What the paper-schedule demo (``tcnn demo --plan paper``) costs: a few timed epochs of its CNN and of its T-CNN
arm, run as the demo runs them, and the whole demo's training time estimated from them.

    python benchmarks/demo_epoch.py --device cuda --jobs 4 --json cuda-demo-epoch.json   # about 1-2 min on a GPU
    python benchmarks/demo_epoch.py --smoke                                               # the code path, on a CPU

Why not time the demo itself: its CNNs train for 80 epochs before any T-CNN epoch runs, so a call of a few minutes
would never reach the fine-tuning arms. This script runs the demo's own training runs (``tcnn.demo.runner``: the same
``tcnn train`` arguments, processes, loader workers and threads per process, ``--jobs`` of them sharing the device)
on the paper plan's data (6000 training and 1000 validation images at 96 px), with ``--seeds`` CNNs trained from
scratch for ``--epochs`` epochs, then each one's T-CNN arm for as many. The last epoch of each run is the steady one
(the first also pays cuDNN's autotuning and the loader's start); ``epoch_time_s`` includes the validation pass.

The estimate: the demo's phase 1 trains ``PLANS['paper'].seeds`` CNNs at once for 80 epochs; phase 2 runs the
fine-tuning arms, ``jobs`` at a time, each for 50 epochs (the no-SA arm at the CNN's cost per epoch, the T-CNN arm at
the T-CNN's, the late arm half and half). Epochs measured with ``--jobs`` processes at once stand for both phases;
process start-up is added per run; evaluation, analysis and figures are not included.
"""
import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tcnn.demo import runner, synthetic  # noqa: E402
from tcnn.demo.plan import CNN, DATA_SEED, PLANS, SCRATCH, SHIPPED, run_name  # noqa: E402
from tcnn.demo.pool import Context, parallel_layout, train_all  # noqa: E402
from tcnn.files import run_folder  # noqa: E402

from benchmarks.report import machine_info, write_json  # noqa: E402

T_CNN = 't-cnn'


def _last_epochs(ctx: Context, names: List[str]) -> List[Dict[str, Any]]:
    rows = []
    for name in names:
        metrics = run_folder.read_metrics(os.path.join(ctx.run_dir(name), run_folder.METRICS_FILE))
        rows.append({'run': name, 'epochs': len(metrics), 'epoch_time_s': [m['epoch_time_s'] for m in metrics],
                     'img_per_s': [m['img_per_s'] for m in metrics], 'data_wait': [m['data_wait'] for m in metrics],
                     'step_img_per_s': [m['step_img_per_s'] for m in metrics]})
    return rows


def estimate_paper_demo(cnn_epoch_s: float, t_cnn_epoch_s: float, startup_s: float, jobs: int) -> Dict[str, Any]:
    """The paper plan's training time from the measured steady epochs (seconds), as described in the module
    docstring."""
    paper = PLANS['paper']
    late = paper.late_epoch or 0
    # the paper plan fine-tunes the shipped converged CNNs: no CNN is trained unless --train-cnns asks
    phase1 = 0.0 if paper.cnns == SHIPPED else paper.pretrain_epochs * cnn_epoch_s + startup_s
    arm_epochs_cnn_cost = paper.seeds * (paper.finetune_epochs + late)  # no-SA arms, and the late arms before reparam.
    arm_epochs_t_cnn_cost = paper.seeds * (paper.finetune_epochs + paper.finetune_epochs - late)
    runs = paper.seeds * len(paper.arms)
    phase2 = (arm_epochs_cnn_cost * cnn_epoch_s + arm_epochs_t_cnn_cost * t_cnn_epoch_s + runs * startup_s) / jobs
    return {'phase1_cnns_s': phase1, 'phase2_arms_s': phase2, 'total_s': phase1 + phase2,
            'total_h': (phase1 + phase2) / 3600, 'jobs': jobs, 'seeds': paper.seeds,
            'pretrain_epochs': paper.pretrain_epochs, 'finetune_epochs': paper.finetune_epochs,
            'late_epoch': paper.late_epoch}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--jobs', type=int, default=4, help='training processes at once (the paper demo: 4 on a GPU)')
    parser.add_argument('--seeds', type=int, default=4, help='CNNs (and T-CNN arms) timed at once')
    parser.add_argument('--epochs', type=int, default=2, help='epochs of each timed run (the last is the steady one)')
    parser.add_argument('--smoke', action='store_true', help='the tiny plan\'s data and one epoch: the code path only')
    parser.add_argument('--out', help='work folder (default: a new temporary folder)')
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args(argv)
    plan = PLANS['tiny' if args.smoke else 'paper']
    epochs = 1 if args.smoke else args.epochs
    # the CNNs are trained here (timed): their epoch is what the no-SA arms cost too
    plan = dataclasses.replace(plan, pretrain_epochs=epochs, finetune_epochs=epochs, late_epoch=None,
                               seeds=args.seeds, cnns=SCRATCH)
    jobs, threads = parallel_layout(args.device, plan.seeds, args.jobs)
    out = args.out or tempfile.mkdtemp(prefix='tcnn-demo-epoch-')
    ctx = Context(out, plan, args.device, None, False, lambda msg: print(msg, flush=True), jobs, threads)
    timings: Dict[str, float] = {}
    start = time.perf_counter()
    synthetic.generate(ctx.data, sizes={'train': plan.train, 'val': plan.val, 'test': 0},
                       seed=DATA_SEED, task=plan.task(), corruptions=(), progress=False)
    timings['data'] = time.perf_counter() - start
    conversions: Dict[int, Dict[str, Any]] = {}
    files: Dict[str, str] = {}
    # the demo's own runs (arguments, export and verified conversion of each CNN), its CNNs and T-CNN arms only
    runs = [r for r in runner._demo_runs(ctx, conversions, files, {})
            if r.name in {run_name(s, arm) for s in range(plan.seeds) for arm in (CNN, T_CNN)}]
    train_all(ctx, runs, timings)
    cnns = _last_epochs(ctx, [run_name(s, CNN) for s in range(plan.seeds)])
    arms = _last_epochs(ctx, [run_name(s, T_CNN) for s in range(plan.seeds)])
    steady = {kind: statistics.median(r['epoch_time_s'][-1] for r in rows) for kind, rows in
              ((CNN, cnns), (T_CNN, arms))}
    startup = statistics.median(timings[r['run']] - sum(r['epoch_time_s']) for r in cnns + arms)
    estimate = estimate_paper_demo(steady[CNN], steady[T_CNN], startup, jobs)
    results = {
        'schema': 'tcnn-demo-epoch', 'date': datetime.date.today().isoformat(),
        'command': 'python benchmarks/demo_epoch.py ' + ' '.join(sys.argv[1:] if argv is None else argv),
        'machine': machine_info(torch.device(args.device)), 'device': args.device, 'jobs': jobs,
        'threads_per_process': threads, 'plan': plan.to_dict(), 'timings_s': timings,
        'runs': cnns + arms, 'steady_epoch_s': steady, 'startup_s': startup,
        'ratio_t_cnn_to_cnn_epoch': steady[T_CNN] / steady[CNN], 'paper_demo_estimate': estimate,
        'wall_s': time.perf_counter() - start,
    }
    print(f'steady epoch ({jobs} process(es) at once): CNN {steady[CNN]:.1f} s, T-CNN {steady[T_CNN]:.1f} s '
          f'({results["ratio_t_cnn_to_cnn_epoch"]:.2f}x); start-up {startup:.1f} s per run; '
          f'data {timings["data"]:.0f} s')
    print(f'the paper demo\'s training, estimated: {estimate["total_h"]:.2f} h '
          f'(CNNs {estimate["phase1_cnns_s"] / 60:.0f} min, arms {estimate["phase2_arms_s"] / 60:.0f} min)')
    if args.json:
        write_json(results, args.json)
        print(f'wrote {args.json}')
    print(json.dumps({'wall_s': round(results['wall_s'], 1)}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
