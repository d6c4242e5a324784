#!/usr/bin/env python3
"""onnxruntime CPU latency and throughput of T-CNNs against their CNNs, beside PyTorch on the same inputs.

    python benchmarks/onnx_cpu.py                     # resnet50d and convnext_tiny (stages.3), 224 px, batch 1 and 32,
                                                  # 1 and 2 threads (about 25 minutes on 2 cores)
    python benchmarks/onnx_cpu.py --models resnet50d --batch-size 1 --threads 1 --repeats 3    # a quick look
    python benchmarks/onnx_cpu.py --forms             # the depthwise product's two plain-op forms in onnxruntime

Every model and its T-CNN (random weights; the paper's init, alpha = lambda = 1) are exported with
``tcnn.export.export`` (the dynamo exporter, opset 18, dynamic batch, checked against PyTorch), then four
candidates are timed interleaved in one process, the order alternating from repeat to repeat: onnxruntime CNN,
onnxruntime T-CNN, PyTorch CNN, PyTorch T-CNN (eager, ``torch.no_grad``). Reported: medians of the time per call and
the median over repeats of the per-repeat speed ratios (T-CNN / CNN, onnxruntime / PyTorch). With one thread the
clock is the process's CPU time (onnxruntime computes on a thread of its own, so the calling thread's CPU time
would miss it; other jobs on the machine barely disturb CPU time), with more threads wall time. onnxruntime
sessions run with ``threads`` intra-op threads, one inter-op thread and no spin-waiting (a spinning thread would
count as work in CPU time and take cores from the other jobs); PyTorch with ``torch.set_num_threads(threads)``.
Prints a table, writes JSON (``--out``, default ``benchmarks/results/cpu-onnx-<date>.json``). Nothing is
downloaded.
"""
import argparse
import datetime
import os
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import tcnn  # noqa: E402
from tcnn.layers import depthwise  # noqa: E402
import tcnn.layers.gpsa  # noqa: E402
import tcnn.export  # noqa: E402
from tcnn.export.options import require_onnx  # noqa: E402
from tcnn.files.sources import create_cnn  # noqa: E402

from benchmarks.measure import interleaved_times, paired_ratio  # noqa: E402
from benchmarks.report import load_average, machine_info, write_json  # noqa: E402

CPU = torch.device('cpu')
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')
DEFAULT_MODELS = ['resnet50d', 'convnext_tiny']
DEFAULT_STAGES = {'convnext_tiny': 'stages.3', 'efficientnet_b0': 'blocks.6'}
# depthwise layers of the --forms section: name, kernel, grid, channels (stride 1, 'same' padding)
FORM_LAYERS = [('convnext_tiny stages.3', 7, 7, 768), ('mobilenetv3_large_100 blocks.5', 5, 7, 960),
               ('efficientnet_b0 blocks.6', 3, 7, 1152)]


def _session(payload: str, threads: int) -> Any:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry('session.intra_op.allow_spinning', '0')
    return ort.InferenceSession(payload, options, providers=['CPUExecutionProvider'])


def _export(model: nn.Module, folder: str, name: str, size: int) -> str:
    path = os.path.join(folder, f'{name}.onnx')
    report = tcnn.export.export(model, path, input_size=(3, size, size))
    print(f'  exported {name}: {report.size_bytes / 2 ** 20:.1f} MiB, max rel err {report.max_rel_err:.2g} '
          f'({report.runtime})', flush=True)
    return path


def measure_model(name: str, stages: Optional[str], args: argparse.Namespace, folder: str) -> List[Dict[str, Any]]:
    torch.manual_seed(0)
    cnn = create_cnn(name, pretrained=False).eval()
    t_cnn = tcnn.reparameterize(cnn, stages=stages, verify=False).eval()
    paths = {'cnn': _export(cnn, folder, f'{name}-cnn', args.size), 't_cnn': _export(t_cnn, folder, f'{name}-t',
                                                                                      args.size)}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        sessions = {k: _session(p, threads) for k, p in paths.items()}
        timer = 'process' if threads == 1 else 'wall'
        for batch in args.batch_size:
            x = torch.randn(batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
            feed = {tcnn.export.INPUT_NAME: x.numpy()}

            def ort_call(session: Any) -> Callable[[], object]:
                return lambda: session.run([tcnn.export.OUTPUT_NAME], feed)

            def torch_call(model: nn.Module) -> Callable[[], object]:
                def run() -> object:
                    with torch.no_grad():
                        return model(x)
                return run

            fns = {'ort_cnn': ort_call(sessions['cnn']), 'ort_t_cnn': ort_call(sessions['t_cnn']),
                   'torch_cnn': torch_call(cnn), 'torch_t_cnn': torch_call(t_cnn)}
            iters = args.iters if args.iters else max(1, 8 // batch)
            times = interleaved_times(fns, CPU, args.warmup, args.repeats, iters, timer)
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            row = {
                'model': name, 'stages': stages or 'default', 'size': args.size, 'threads': threads, 'batch': batch,
                'clock': 'process CPU time' if threads == 1 else 'wall', 'repeats': args.repeats, 'iters': iters,
                'ms': ms, 'img_s': {k: batch * 1e3 / v for k, v in ms.items()},
                'ort_t_over_cnn': paired_ratio(times['ort_cnn'], times['ort_t_cnn']),
                'torch_t_over_cnn': paired_ratio(times['torch_cnn'], times['torch_t_cnn']),
                'ort_over_torch_cnn': paired_ratio(times['torch_cnn'], times['ort_cnn']),
                'ort_over_torch_t_cnn': paired_ratio(times['torch_t_cnn'], times['ort_t_cnn']),
                'loadavg': load_average(),
            }
            rows.append(row)
            print(f'{name:14s} {threads:>3d} {batch:>5d}  {ms["ort_cnn"]:9.1f} {ms["ort_t_cnn"]:9.1f} '
                  f'{ms["torch_cnn"]:9.1f} {ms["torch_t_cnn"]:9.1f}   {row["ort_t_over_cnn"]:6.3f} '
                  f'{row["torch_t_over_cnn"]:6.3f}   {row["ort_over_torch_cnn"]:5.2f} '
                  f'{row["ort_over_torch_t_cnn"]:5.2f}', flush=True)
    return rows


def _folded_plain(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The folded order in plain ops (``U = taps * V``, then one GEMM), the alternative to ``attend_traceable``."""
    b, n_q = attn.shape[0], attn.shape[1]
    num_heads, channels = taps.shape
    u = taps.reshape(1, num_heads, 1, channels) * values.reshape(b, 1, values.shape[1], channels)
    return torch.bmm(attn.to(u.dtype), u.reshape(b, -1, channels))


def measure_forms(args: argparse.Namespace, folder: str) -> List[Dict[str, Any]]:
    """Depthwise GPSA layers exported with each plain-op form of their product, timed in onnxruntime."""
    forms = {'heads_first': depthwise.attend_traceable, 'folded': _folded_plain}
    rows = []
    for name, kernel, grid, channels in FORM_LAYERS:
        torch.manual_seed(0)
        layer = tcnn.GPSA.from_conv(nn.Conv2d(channels, channels, kernel, 1, kernel // 2, groups=channels)).eval()
        paths = {}
        for form, fn in forms.items():
            saved, tcnn.layers.gpsa.attend_traceable = tcnn.layers.gpsa.attend_traceable, fn
            try:
                paths[form] = os.path.join(folder, f'layer-{form}.onnx')
                tcnn.export.export(layer, paths[form], input_size=(channels, grid, grid))
            finally:
                tcnn.layers.gpsa.attend_traceable = saved
        for threads in args.threads:
            sessions = {form: _session(p, threads) for form, p in paths.items()}
            timer = 'process' if threads == 1 else 'wall'
            for batch in args.batch_size:
                feed = {tcnn.export.INPUT_NAME: torch.randn(batch, channels, grid, grid).numpy()}
                fns = {form: (lambda s=s: s.run([tcnn.export.OUTPUT_NAME], feed)) for form, s in sessions.items()}
                iters = args.iters or max(1, 32 // batch)
                times = interleaved_times(fns, CPU, args.warmup, args.repeats, iters, timer)
                ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                ratio = paired_ratio(times['folded'], times['heads_first'])
                rows.append({'layer': name, 'kernel': kernel, 'grid': grid, 'channels': channels, 'threads': threads,
                             'batch': batch, 'ms': ms, 'heads_first_over_folded': ratio})
                print(f'{name:32s} {threads:>3d} {batch:>5d}  {ms["heads_first"]:8.2f} {ms["folded"]:8.2f}  '
                      f'{ratio:5.2f}x', flush=True)
        for path in paths.values():
            os.remove(path)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    summary, usage = __doc__.split('\n\n', 1)
    p = argparse.ArgumentParser(description=summary, epilog=usage, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', default=DEFAULT_MODELS, help='timm (or torchvision:NAME) models')
    p.add_argument('--stages', nargs='+', metavar='MODEL=STAGE', default=[],
                   help='stage to convert per model (default: convnext_tiny=stages.3, efficientnet_b0=blocks.6, '
                        'otherwise the last ResNet stage)')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--batch-size', type=int, nargs='+', default=[1, 32])
    p.add_argument('--threads', type=int, nargs='+', default=[1, 2])
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--iters', type=int, help='calls per timed repeat (default: 8 // batch, at least 1)')
    p.add_argument('--forms', action='store_true',
                   help='instead of whole models: depthwise layers exported with each plain-op form of their product')
    p.add_argument('--out', help='JSON file (default benchmarks/results/cpu-onnx[-forms]-<date>.json)')
    args = p.parse_args(argv)
    require_onnx()
    stages = dict(DEFAULT_STAGES, **dict(s.split('=', 1) for s in args.stages))
    import onnxruntime
    start = time.perf_counter()
    info = machine_info(torch.device('cpu'))
    info.update(onnxruntime=onnxruntime.__version__, onnx=__import__('onnx').__version__,
                onnxscript=__import__('onnxscript').__version__)
    with tempfile.TemporaryDirectory(prefix='tcnn-onnx-bench-') as folder:
        if args.forms:
            print(f'{"layer":32s} {"thr":>3s} {"batch":>5s}  ms: heads first, folded; heads first / folded speed')
            rows = measure_forms(args, folder)
        else:
            print(f'{"model":14s} {"thr":>3s} {"batch":>5s}  ms: {"ORT CNN":>9s} {"ORT T":>9s} {"PT CNN":>9s} '
                  f'{"PT T":>9s}   T/CNN: ORT    PT    ORT/PT: CNN  T')
            rows = []
            for name in args.models:
                rows += measure_model(name, stages.get(name), args, folder)
    result = {'schema': 'tcnn-onnx-benchmark/1', 'date': datetime.date.today().isoformat(),
              'command': 'python ' + ' '.join(shlex.quote(a) for a in [os.path.relpath(__file__)] + list(
                  sys.argv[1:] if argv is None else argv)),
              'machine': info, 'exporter': 'dynamo, opset 18', 'loadavg_end': load_average(),
              'minutes': round((time.perf_counter() - start) / 60, 1), 'rows': rows}
    out = args.out or os.path.join(RESULTS_DIR, f'cpu-onnx{"-forms" if args.forms else ""}-'
                                                f'{datetime.date.today().isoformat()}.json')
    write_json(result, out)
    print(f'wrote {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
