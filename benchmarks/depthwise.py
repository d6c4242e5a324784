#!/usr/bin/env python3
"""The depthwise GPSA product in both orders: attending first vs folded into the values and chunked.

    python benchmarks/depthwise.py                                  # CPU, 1 thread, CPU time: about 6 minutes
    python benchmarks/depthwise.py --device cuda --amp --batch-size 32 128

Times ``out[b, q, c] = sum_h w[c, h] sum_k A[b, q, h, k] V[b, k, c]``, forward and forward + backward, on the shapes
of depthwise last stages at 224 px (ConvNeXt 7x7, MobileNetV3 5x5, EfficientNet 3x3; and ConvNeXt's 14x14 stage),
evaluated by ``tcnn.layers.depthwise.attend_heads_first`` (``A V`` in one batched GEMM, then the per-channel sum over
the heads: what tcnn 0.3.0 did, and what TorchScript does) and ``attend_folded``, on a CPU at several chunk budgets
(``CPU_CHUNK_ELEMENTS``), and prints which order ``attend_depthwise`` picks for the shape (``folding_pays``).
Medians of interleaved repeats; prints a table, ``--out`` writes JSON. Random inputs.
"""
import argparse
import os
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tcnn.layers import depthwise  # noqa: E402

from benchmarks.measure import interleaved_times  # noqa: E402
from benchmarks.report import machine_info, write_json  # noqa: E402

# name, kernel, grid (queries = keys, 'same' padding, real keys only), channels
CASES = [
    ('convnext_tiny stages.3', 7, 7, 768),
    ('convnext_tiny stages.2', 7, 14, 384),
    ('mobilenetv3_large_100 blocks.5', 5, 7, 960),
    ('efficientnet_b0 blocks.6', 3, 7, 1152),
]
BUDGETS = [1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20]
DEFAULT_BUDGET = depthwise.CPU_CHUNK_ELEMENTS


def _case_id(case: tuple) -> str:
    return case[0].replace(' ', ':')


def _call(fn: Callable[..., torch.Tensor], args: List[torch.Tensor], backward: bool, amp: bool,
          budget: Optional[int] = None) -> Callable[[], None]:
    def run() -> None:
        if budget is not None:
            depthwise.CPU_CHUNK_ELEMENTS = budget
        with torch.autocast(args[0].device.type, dtype=torch.bfloat16, enabled=amp), \
                torch.set_grad_enabled(backward):
            out = fn(*args)
        if backward:
            out.float().sum().backward()
            for a in args:
                a.grad = None
    return run


def _inputs(batch: int, kernel: int, grid: int, channels: int, device: torch.device) -> List[torch.Tensor]:
    n = grid * grid
    attn = torch.rand(batch, n, kernel * kernel, n, device=device).softmax(-1).view(batch, n, -1)
    values = torch.randn(batch, n, channels, device=device)
    taps = torch.randn(kernel * kernel, channels, device=device)
    return [t.requires_grad_() for t in (attn, values, taps)]


def measure(case: tuple, batch: int, backward: bool, args: argparse.Namespace, device: torch.device) -> Dict[str, Any]:
    name, kernel, grid, channels = case
    torch.manual_seed(0)
    inputs = _inputs(batch, kernel, grid, channels, device)
    fns = {'heads_first': _call(depthwise.attend_heads_first, inputs, backward, args.amp)}
    budgets = BUDGETS if device.type == 'cpu' else [None]
    for budget in budgets:
        fns[f'folded_{budget}'] = _call(depthwise.attend_folded, inputs, backward, args.amp, budget)
    timer = 'cpu' if device.type == 'cpu' else 'wall'
    times = interleaved_times(fns, device, warmup=args.warmup, repeats=args.repeats, iters=args.iters, timer=timer)
    depthwise.CPU_CHUNK_ELEMENTS = DEFAULT_BUDGET
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    default = f'folded_{DEFAULT_BUDGET if device.type == "cpu" else None}'
    return {'case': name, 'kernel': kernel, 'grid': grid, 'channels': channels, 'batch_size': batch,
            'mode': 'fwd_bwd' if backward else 'fwd', 'ms': ms,
            'speedup_default': ms['heads_first'] / ms[default],
            'best_budget': min((k for k in ms if k != 'heads_first'), key=ms.get),
            'picked': 'folded' if depthwise.folding_pays(batch, grid * grid, kernel * kernel, grid * grid, channels)
            else 'heads_first'}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='cpu')
    p.add_argument('--amp', action='store_true', help='bf16 autocast')
    p.add_argument('--batch-size', type=int, nargs='+', default=[1, 4, 16])
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--iters', type=int, default=1)
    p.add_argument('--cases', nargs='+', choices=[_case_id(c) for c in CASES], help='only these cases')
    p.add_argument('--out', help='JSON file to write')
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == 'cpu':
        torch.set_num_threads(1)
    rows = []
    header = 'ms heads first, then folded at budgets ' + ' '.join(f'2^{b.bit_length() - 1}' for b in BUDGETS)
    print(f'{"case":32s} {"batch":>5s} {"mode":8s} {header}  heads first / folded at the default, picked'
          if device.type == 'cpu' else f'{"case":32s} {"batch":>5s} {"mode":8s} ms heads first, folded  ratio, picked')
    cases = [c for c in CASES if not args.cases or _case_id(c) in args.cases]
    for case in cases:
        for batch in args.batch_size:
            for backward in (False, True):
                r = measure(case, batch, backward, args, device)
                rows.append(r)
                cells = ' '.join(f'{v:8.2f}' for v in r['ms'].values())
                print(f'{case[0]:32s} {batch:5d} {r["mode"]:8s} {cells}  {r["speedup_default"]:5.2f}x  {r["picked"]}',
                      flush=True)
    if args.out:
        write_json({'machine': machine_info(device), 'amp': args.amp, 'rows': rows}, args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
