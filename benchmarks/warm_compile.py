#!/usr/bin/env python3
"""Fill torch.compile's caches for a ``benchmarks/run.py --compile`` run: one model variant and one mode per
process, so that several processes compile at once.

    python benchmarks/warm_compile.py --only tcnn:train --device cuda --amp --channels-last --models resnet50d \\
        --sizes 224 --batch-size 32 --compile reduce-overhead

Takes run.py's options (the same ones make the same graphs) plus ``--only VARIANT:MODE`` (``cnn`` or ``tcnn``;
``inference`` or ``train``). Builds the model as run.py does and calls its compiled step a few times, untimed; prints
the seconds of the first call (tracing, compilation, CUDA-graph recording). Why: compiling a whole network's
training step takes minutes (Triton kernels on a GPU, C++ on a CPU), and run.py compiles four functions one after
another; warmed in parallel processes beforehand, run.py's own compilation finds the graphs in inductor's FX-graph
and AOTAutograd caches and the kernels in Triton's, and its timed repeats are unchanged (they never include a
compilation). Used by ``benchmarks/gpu/first.sh`` while the GPU tests run.
"""
import os
import sys
import time
from typing import List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import suites  # noqa: E402
from benchmarks.measure import synchronize  # noqa: E402
from benchmarks.run import build_parser, make_settings  # noqa: E402

CALLS = 3  # as run.py's COMPILE_WARMUP: a compiled function may recompile once more on its second call


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    parser.add_argument('--only', required=True, metavar='VARIANT:MODE',
                        help='cnn:inference, cnn:train, tcnn:inference or tcnn:train')
    args = parser.parse_args(argv)
    variant, _, mode = args.only.partition(':')
    if variant not in ('cnn', 'tcnn') or mode not in ('inference', 'train'):
        parser.error(f'--only {args.only}: expected cnn or tcnn, then inference or train, e.g. tcnn:train')
    if not args.compile:
        parser.error('--compile MODE: there is nothing to warm in eager mode')
    settings = make_settings(args, parser)
    if args.threads or args.smoke:
        torch.set_num_threads(args.threads or 1)
    device = settings.torch_device
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True  # as run.py
    for name in settings.models:
        model = suites.model_variants(name, settings)[variant]
        runner = suites.Runner(settings.prepare(model), settings)
        for size in settings.sizes:
            for batch in settings.batch_sizes:
                torch.manual_seed(settings.seed)
                x = settings.tensor(batch, 3, size, size)
                y = torch.randint(0, 1000, (batch,), device=device)
                step = (lambda: runner.infer(x)) if mode == 'inference' else (lambda: runner.train_step(x, y))
                start = time.perf_counter()
                step()
                synchronize(device)
                first = time.perf_counter() - start
                for _ in range(CALLS - 1):
                    step()
                synchronize(device)
                print(f'{name} {size}px b{batch} {variant} {mode}: first call {first:.1f} s, {CALLS} calls '
                      f'{time.perf_counter() - start:.1f} s', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
