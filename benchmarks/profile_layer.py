#!/usr/bin/env python3
"""Where one GPSA layer's time goes: wall time, GPU kernel time, kernel launches and the top kernels.

    python benchmarks/profile_layer.py --device cuda --amp --channels-last --batch-size 32 256

A layer whose wall time is far above its GPU kernel time is bound by the host (Python, dispatch and launch
overhead), not by the GPU: fusing work there means fewer launches, not fewer FLOPs. Prints a table and, with
``--out``, writes the numbers as JSON. Random weights and inputs; nothing is downloaded.
"""
import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from tcnn.layers.gpsa import GPSA  # noqa: E402

from benchmarks.measure import count_operators, synchronize  # noqa: E402


def _step(module: nn.Module, x: torch.Tensor, amp: bool, backward: bool) -> Callable[[], None]:
    """One call of ``module`` in its current mode, with ``backward`` a backward pass too (gradients dropped)."""
    def run() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp), torch.set_grad_enabled(backward):
            out = module(x)
        if backward:
            out.float().sum().backward()
            x.grad = None
            for p in module.parameters():
                p.grad = None
    return run


def profile_step(fn: Callable[[], None], device: torch.device, iters: int = 20, top: int = 8) -> Dict[str, Any]:
    """Wall ms per call (median of ``iters``), GPU kernel ms per call, kernels per call, computing ATen operators
    per call (``OperatorCount``: what launches kernels, countable on a CPU too), and the top kernels."""
    for _ in range(5):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    calls = 5
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    kernels: Dict[str, List[float]] = {}
    for evt in prof.events():
        if device.type == 'cuda' and evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(evt.name, []).append(evt.device_time_total / 1e3)
    total = sum(sum(v) for v in kernels.values()) / calls
    launches = sum(len(v) for v in kernels.values()) / calls
    ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {'wall_ms': times[len(times) // 2] * 1e3, 'gpu_kernel_ms': total, 'kernels_per_call': launches,
            'operators_per_call': count_operators(fn),
            'top_kernels': [{'name': k[:90], 'ms_per_call': sum(v) / calls, 'count_per_call': len(v) / calls}
                            for k, v in ranked]}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='cuda')
    p.add_argument('--amp', action='store_true', help='bf16 autocast')
    p.add_argument('--channels-last', action='store_true')
    p.add_argument('--batch-size', type=int, nargs='+', default=[32, 256])
    p.add_argument('--grid', type=int, default=7, help='output grid (7: ResNet-50 last stage at 224 px)')
    p.add_argument('--channels', type=int, default=512)
    p.add_argument('--out', help='JSON file to write')
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for batch in args.batch_size:
        for stride in (1, 2):
            torch.manual_seed(0)
            conv = nn.Conv2d(args.channels, args.channels, 3, stride=stride, padding=1, bias=False)
            modules = {'conv': conv, 'gpsa': GPSA.from_conv(conv)}
            size = args.grid * stride
            x = torch.randn(batch, args.channels, size, size, device=device)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_(True)
            for name, module in modules.items():
                module = module.to(device)
                if args.channels_last:
                    module = module.to(memory_format=torch.channels_last)
                # infer: eval mode without gradients (what tcnn eval runs); fwd: a training-mode forward without
                # gradients (the 2026-11-23 table's forward); fwd_bwd: a training step's forward and backward
                for mode, backward in (('infer', False), ('fwd', False), ('fwd_bwd', True)):
                    module.train(mode != 'infer')
                    r = profile_step(_step(module, x, args.amp, backward), device)
                    r.update({'layer': name, 'batch_size': batch, 'stride': stride, 'grid': args.grid, 'mode': mode})
                    rows.append(r)
                    print(f'b{batch:<4d} stride {stride} {name:5s} {mode:8s} wall {r["wall_ms"]:7.3f} ms  GPU kernels '
                          f'{r["gpu_kernel_ms"]:7.3f} ms  {r["kernels_per_call"]:5.0f} kernels  '
                          f'{r["operators_per_call"]:4d} operators', flush=True)
    for r in rows:
        if r['layer'] == 'gpsa' and r['mode'] == 'fwd_bwd':
            print(f'\ngpsa fwd+bwd b{r["batch_size"]} stride {r["stride"]}: top kernels')
            for k in r['top_kernels']:
                print(f'  {k["ms_per_call"]:7.3f} ms  x{k["count_per_call"]:<3.0f} {k["name"]}')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'device': torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu',
                       'torch': torch.__version__, 'amp': args.amp, 'channels_last': args.channels_last,
                       'rows': rows}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
