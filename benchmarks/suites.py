"""What the benchmark measures: whole models, single layers, conversion time; the goals and the profiles of misses.

Every suite returns plain JSON-ready rows. Models and inputs are random (``pretrained=False``): speed, memory and
FLOPs do not depend on the weights, and nothing is downloaded.
"""
import copy
import dataclasses
import gc
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import tcnn
from tcnn.runtime.compiling import begin_step, compile_model, uses_cuda_graphs
from tcnn.layers.gpsa import GPSA

from .measure import count_flops, interleaved_times, op_profile, paired_ratio, peak_memory, synchronize, \
    timing_summary
from .paper import paper_figures
from .reference_gpsa import ReferenceGPSA, to_reference
from .sdpa_gpsa import SdpaGPSA, to_sdpa

__all__ = ['Settings', 'Runner', 'model_variants', 'bench_models', 'bench_layers', 'bench_conversion', 'evaluate_goals',
           'profile_gap']

Log = Callable[[str], None]

# Goals of issue 5, as ratios T-CNN / CNN measured in one run.
GOAL_SPEED = 0.9  # inference and training-step img/s at 224
GOAL_FLOPS = 1.1  # forward FLOPs at 224
GOAL_MEMORY = 1.15  # peak training-step memory at 224
GOAL_VS_REFERENCE = 2.0  # our GPSA vs the reference, stride-2 first block


@dataclasses.dataclass
class Settings:
    """What to run and how (``run.py`` fills it from the command line and the presets)."""
    device: str = 'cpu'
    preset: str = 'full'  # 'smoke', 'quick' or 'full': which models, sizes and repeats (run.py's presets)
    amp: bool = False
    channels_last: bool = False
    compile: Optional[str] = None  # a torch.compile mode (tcnn.runtime.compiling.COMPILE_MODES); None: eager
    models: List[str] = dataclasses.field(default_factory=lambda: ['resnet50d', 'resnetrs50'])
    sizes: List[int] = dataclasses.field(default_factory=lambda: [160, 224, 320])
    batch_sizes: List[int] = dataclasses.field(default_factory=lambda: [4])
    repeats: int = 5
    warmup: int = 1
    iters: int = 1
    variants: List[str] = dataclasses.field(default_factory=list)  # extra T-CNN designs: 'sdpa', 'reference'
    variant_sizes: Optional[List[int]] = None  # sizes at which the extra designs run (None: all)
    layer_grids: List[int] = dataclasses.field(default_factory=lambda: [5, 7, 10, 12])
    layer_channels: int = 512
    layer_batch: Optional[int] = None  # default: the first batch size
    sections: List[str] = dataclasses.field(default_factory=lambda: ['models', 'layers', 'conversion'])
    goal_size: int = 224
    timer: str = 'wall'  # 'cpu': thread CPU time, with one torch thread (see measure.py)
    seed: int = 0
    stages: Dict[str, List[str]] = dataclasses.field(default_factory=dict)  # per model (default: its last stage)
    label: str = ''  # appended to the configuration tag: runs of other models must not replace a preset's results

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def autocast(self):
        return torch.autocast(self.torch_device.type, dtype=torch.bfloat16, enabled=self.amp)

    def prepare(self, module: nn.Module) -> nn.Module:
        """Move to the device (channels_last if asked)."""
        module = module.to(self.torch_device)
        return module.to(memory_format=torch.channels_last) if self.channels_last else module

    def tensor(self, *shape: int) -> torch.Tensor:
        x = torch.randn(*shape, device=self.torch_device)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    def maybe_compile(self, module: nn.Module) -> Callable:
        """``module`` compiled in the run's mode (one static graph per input size), or as it is."""
        return compile_model(module, self.compile) if self.compile else module

    def begin_step(self, eager: bool = False) -> None:
        """Before each call of a compiled function: under a CUDA-graph mode a new step begins (the previous call's
        outputs may be overwritten), as in ``tcnn train``'s loop."""
        if not eager:
            begin_step(self.compile)


def _create_cnn(name: str, seed: int) -> nn.Module:
    """A random CNN with random BN statistics and affine parameters.

    timm zero-initialises the last BN of every residual block, which would make the replaced convs irrelevant to
    the logits and the conversion's verification error trivially 0.
    """
    import timm
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.1)
    return model


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Runner:
    """One model variant: its compiled (or eager) callable, its AdamW optimizer, and the units of work."""

    def __init__(self, model: nn.Module, settings: Settings):
        self.model = model
        self.settings = settings
        self.fn = settings.maybe_compile(model)
        # A tiny lr keeps the weights (hence the numbers) stable over many steps; the cost does not depend on it.
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    # The mode is switched only when it changes, as a user's loop does (once per phase, not per call): a switch
    # drops what GPSA layers keep between inference calls (tcnn.GPSA.train).
    def infer(self, x: torch.Tensor, eager: bool = False) -> None:
        if self.model.training:
            self.model.eval()
        self.settings.begin_step(eager)
        with torch.no_grad(), self.settings.autocast():
            (self.model if eager else self.fn)(x)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, eager: bool = False) -> None:
        if not self.model.training:
            self.model.train()
        self.settings.begin_step(eager)
        with self.settings.autocast():
            loss = F.cross_entropy((self.model if eager else self.fn)(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def live_tensors(self, *inputs: torch.Tensor) -> List[torch.Tensor]:
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return [*self.model.parameters(), *self.model.buffers(), *grads, *state, *inputs]


def model_variants(name: str, settings: Settings) -> Dict[str, nn.Module]:
    """The random CNN ``name`` (``cnn``), its T-CNN (``tcnn``) and the other designs the settings ask for."""
    cnn = _create_cnn(name, settings.seed)
    t_cnn = tcnn.reparameterize(cnn, stages=settings.stages.get(name), verify=False)
    variants = {'cnn': cnn, 'tcnn': t_cnn}
    if settings.variant_sizes is None or any(s in settings.variant_sizes for s in settings.sizes):
        if 'sdpa' in settings.variants:
            variants['tcnn_sdpa'] = to_sdpa(copy.deepcopy(t_cnn))
        if 'reference' in settings.variants:
            variants['tcnn_reference'] = to_reference(copy.deepcopy(t_cnn))
    return variants


def _flops_at_paper_resolutions(name: str, models: Dict[str, nn.Module], settings: Settings) -> Dict[str, float]:
    """GFLOPs of the CNN at the paper's CNN resolution and of the T-CNN at its fine-tuning resolution (Table 2),
    whatever sizes the run times; empty for models the paper does not list."""
    paper = paper_figures(name)
    if paper is None:
        return {}
    device = settings.torch_device
    return {k: count_flops(models[k].eval().to(device), torch.randn(1, 3, paper[k]['res'], paper[k]['res'],
                                                                    device=device)) / 1e9 for k in ('cnn', 'tcnn')}


def _memory_eager(settings: Settings) -> bool:
    # On CPU the tracker sees ATen ops only; compiled (inductor) kernels allocate behind its back, so the memory
    # of a compiled run is measured on the same model in eager mode there. CUDA's allocator sees every allocation,
    # but a replayed CUDA graph makes none (its memory was reserved in the graph pool when it was recorded): the
    # memory of a CUDA-graph mode is measured in eager mode too.
    return bool(settings.compile) and (settings.torch_device.type != 'cuda' or uses_cuda_graphs(settings.compile))


def _bench_case(runners: Dict[str, Runner], size: int, batch: int, settings: Settings, log: Log) -> Dict[str, Any]:
    device = settings.torch_device
    torch.manual_seed(settings.seed)
    x = settings.tensor(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,), device=device)
    row: Dict[str, Any] = {'size': size, 'batch_size': batch}
    for mode, make in (('inference', lambda r: lambda: r.infer(x)),
                       ('train', lambda r: lambda: r.train_step(x, y))):
        first: Dict[str, float] = {}
        times = interleaved_times({k: make(r) for k, r in runners.items()}, device, settings.warmup,
                                  settings.repeats, settings.iters, settings.timer, first_calls=first)
        row[mode] = {k: timing_summary(t, batch) for k, t in times.items()}
        # the first call of each: with --compile, the compilation (and CUDA-graph recording) a user waits for
        row[mode + '_first_call_s'] = first
        row[mode + '_ratio'] = {k: paired_ratio(times['cnn'], t) for k, t in times.items() if k != 'cnn'}
        log(f'  {size}px b{batch} {mode:9s} ' + '  '.join(
            f'{k} {v["img_s"]:.1f} img/s' for k, v in row[mode].items()) + '  ratio ' + ' '.join(
            f'{k} {v:.3f}' for k, v in row[mode + '_ratio'].items()) + '  first call ' + ' '.join(
            f'{k} {v:.1f} s' for k, v in first.items()))
    eager = _memory_eager(settings)
    memory = {}
    for k, r in runners.items():
        memory[k] = {
            'train': peak_memory(lambda: r.train_step(x, y, eager=eager), device, r.live_tensors(x, y)),
            'inference': peak_memory(lambda: r.infer(x, eager=eager), device, r.live_tensors(x)),
        }
    row['memory'] = memory
    row['memory_ratio'] = {k: {m: v[m]['peak_bytes'] / memory['cnn'][m]['peak_bytes'] for m in v}
                           for k, v in memory.items() if k != 'cnn'}
    log(f'  {size}px b{batch} peak train memory ' + '  '.join(
        f'{k} {v["train"]["peak_bytes"] / 2 ** 20:.0f} MiB' for k, v in memory.items()))
    return row


def _free(settings: Settings) -> None:
    gc.collect()
    if settings.torch_device.type == 'cuda':
        torch.cuda.empty_cache()


def bench_models(settings: Settings, log: Log,
                 on_row: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
    """Whole models, every T-CNN design beside its CNN: img/s (inference, training step), peak memory, FLOPs.

    ``on_row(rows)`` is called with the rows so far after each one (``run.py`` writes them, so that a run stopped by
    a time limit keeps what it measured).
    """
    rows = []
    for name in settings.models:
        log(f'model {name}')
        full = model_variants(name, settings)
        params = {k: _num_params(m) for k, m in full.items()}
        at_paper_res = _flops_at_paper_resolutions(name, full, settings)
        for size in settings.sizes:
            variants = {k: m for k, m in full.items()
                        if k in ('cnn', 'tcnn') or settings.variant_sizes is None or size in settings.variant_sizes}
            flops = {}
            for k, m in variants.items():
                m.eval()
                flops[k] = count_flops(m.to(settings.torch_device), torch.randn(1, 3, size, size,
                                                                                   device=settings.torch_device))
            runners = {k: Runner(settings.prepare(m), settings) for k, m in variants.items()}
            for batch in settings.batch_sizes:
                row = {'model': name, 'params': params, 'gflops': {k: v / 1e9 for k, v in flops.items()},
                       'flops_ratio': {k: v / flops['cnn'] for k, v in flops.items() if k != 'cnn'}}
                if at_paper_res:
                    row['gflops_at_paper_res'] = at_paper_res
                try:
                    row.update(_bench_case(runners, size, batch, settings, log))
                except torch.OutOfMemoryError:
                    # The reference design materialises per-sample attention: at large batches it may not fit.
                    # Keep the comparison that matters (T-CNN vs CNN) and say what was left out.
                    _free(settings)
                    dropped = [k for k in runners if k not in ('cnn', 'tcnn')]
                    log(f'  {size}px b{batch}: out of memory; again without {dropped or "nothing"}')
                    if not dropped:
                        raise
                    row['out_of_memory'] = dropped
                    row.update(_bench_case({k: runners[k] for k in ('cnn', 'tcnn')}, size, batch, settings, log))
                rows.append(row)
                if on_row is not None:
                    on_row(rows)
            del runners
            gc.collect()
        del full
        gc.collect()
        if settings.compile:
            torch._dynamo.reset()
    return rows


def _layer_variants(channels: int, stride: int, settings: Settings) -> Dict[str, nn.Module]:
    torch.manual_seed(settings.seed)
    conv = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
    gpsa = GPSA.from_conv(conv)  # the paper's fine-tuning init; the cost does not depend on it
    sdpa = SdpaGPSA.from_conv(conv)
    sdpa.load_state_dict(gpsa.state_dict())
    return {'conv': conv, 'gpsa': gpsa, 'gpsa_sdpa': sdpa, 'reference': ReferenceGPSA.from_gpsa(gpsa)}


def bench_layers(settings: Settings, log: Log) -> List[Dict[str, Any]]:
    """One last-stage layer: the conv, our GPSA, our GPSA with an SDPA content path, and the reference GPSA.

    ``grid`` is the output grid; a stride-2 layer sees a ``2 grid x 2 grid`` input (the first block of the stage).
    """
    device = settings.torch_device
    batch = settings.layer_batch or settings.batch_sizes[0]
    c = settings.layer_channels
    rows = []
    for grid in settings.layer_grids:
        for stride in (1, 2):
            size = grid * stride
            modules = {k: settings.prepare(m) for k, m in _layer_variants(c, stride, settings).items()}
            fns = {k: settings.maybe_compile(m) for k, m in modules.items()}
            torch.manual_seed(settings.seed)
            x = settings.tensor(batch, c, size, size)
            x_grad = x.detach().clone().requires_grad_(True)  # in a network the layer's input needs its gradient

            def forward(fn=None):
                settings.begin_step()
                with torch.no_grad(), settings.autocast():
                    fn(x)

            def forward_backward(fn=None, module=None):
                settings.begin_step(eager=fn is module)
                with settings.autocast():
                    out = fn(x_grad)
                out.float().sum().backward()
                x_grad.grad = None
                for p in module.parameters():
                    p.grad = None

            row: Dict[str, Any] = {'grid': grid, 'stride': stride, 'in_size': size, 'channels': c,
                                   'batch_size': batch, 'tokens_q': grid * grid, 'tokens_k': (size + 2) ** 2}
            with torch.no_grad():
                row['gflops'] = {k: count_flops(m, x[:1]) / 1e9 for k, m in modules.items()}
            for mode, make in (('fwd', lambda k: lambda: forward(fns[k])),
                               ('fwd_bwd', lambda k: lambda: forward_backward(fns[k], modules[k]))):
                times = interleaved_times({k: make(k) for k in modules}, device, settings.warmup, settings.repeats,
                                          settings.iters, settings.timer)
                row[mode] = {k: timing_summary(t, batch) for k, t in times.items()}
                row[mode + '_speedup'] = {
                    'gpsa_vs_reference': paired_ratio(times['reference'], times['gpsa']),
                    'gpsa_vs_sdpa': paired_ratio(times['gpsa_sdpa'], times['gpsa']),
                    'gpsa_vs_conv': paired_ratio(times['conv'], times['gpsa']),
                }
            row['memory_fwd_bwd'] = {  # eager modules: see _memory_eager
                k: peak_memory(lambda: forward_backward(m, m), device,
                               [*m.parameters(), x_grad])['peak_bytes'] for k, m in modules.items()}
            log(f'  layer {c}ch grid {grid} stride {stride}: ' + '  '.join(
                f'{k} {row["fwd"][k]["ms"]:.1f}/{row["fwd_bwd"][k]["ms"]:.1f} ms' for k in modules) +
                f'  (fwd/fwd+bwd); gpsa vs reference {row["fwd_speedup"]["gpsa_vs_reference"]:.2f}x/'
                f'{row["fwd_bwd_speedup"]["gpsa_vs_reference"]:.2f}x')
            rows.append(row)
        if settings.compile:
            torch._dynamo.reset()
    return rows


def bench_conversion(settings: Settings, log: Log) -> List[Dict[str, Any]]:
    """Seconds of ``tcnn.reparameterize`` with and without the numerical verification (median of up to 3)."""
    rows = []
    for name in settings.models:
        cnn = _create_cnn(name, settings.seed).to(settings.torch_device)
        runs = max(1, min(settings.repeats, 3))
        times = {'no_verify': [], 'verify': []}
        report = None
        for _ in range(runs):
            for key, verify in (('no_verify', False), ('verify', True)):
                start = time.perf_counter()
                t_cnn = tcnn.reparameterize(cnn, stages=settings.stages.get(name), verify=verify)
                synchronize(settings.torch_device)
                times[key].append(time.perf_counter() - start)
                report = getattr(t_cnn, 'tcnn_report', report)
                del t_cnn
        row = {'model': name, 'seconds': {k: statistics.median(v) for k, v in times.items()}, 'runs': runs,
               'verify_input_size': list(report.input_size), 'verify_batch_size': report.batch_size,
               'max_rel_err': report.max_rel_err, 'init_max_rel_err': report.init_max_rel_err}
        log(f'  convert {name}: {row["seconds"]["no_verify"]:.2f} s, with verification {row["seconds"]["verify"]:.2f}'
            f' s (max rel err {report.max_rel_err:.2g})')
        rows.append(row)
        del cnn
        gc.collect()
    return rows


def _goal(name: str, subject: str, value: float, threshold: float, higher_is_better: bool) -> Dict[str, Any]:
    passed = value >= threshold if higher_is_better else value <= threshold
    op = '>=' if higher_is_better else '<='
    return {'goal': name, 'subject': subject, 'value': value, 'target': f'{op} {threshold:g}', 'passed': passed}


def evaluate_goals(results: Dict[str, Any], settings: Settings) -> List[Dict[str, Any]]:
    """Pass/miss of each goal of issue 5 on the rows that measure it (e.g. every model at 224 px)."""
    goals = []
    for row in results.get('models', []):
        if row['size'] != settings.goal_size:
            continue
        subject = f'{row["model"]} {row["size"]}px batch {row["batch_size"]}'
        goals.append(_goal('inference img/s T-CNN / CNN', subject, row['inference_ratio']['tcnn'], GOAL_SPEED, True))
        goals.append(_goal('training step img/s T-CNN / CNN', subject, row['train_ratio']['tcnn'], GOAL_SPEED, True))
        goals.append(_goal('peak training memory T-CNN / CNN', subject, row['memory_ratio']['tcnn']['train'],
                           GOAL_MEMORY, False))
        if row['batch_size'] == settings.batch_sizes[0]:
            goals.append(_goal('forward FLOPs T-CNN / CNN', f'{row["model"]} {row["size"]}px',
                               row['flops_ratio']['tcnn'], GOAL_FLOPS, False))
    for row in results.get('layers', []):
        if row['stride'] != 2:
            continue
        subject = f'stride-2 first block, {row["channels"]}ch {row["in_size"]}->{row["grid"]} grid'
        for mode, label in (('fwd', 'forward'), ('fwd_bwd', 'forward+backward')):
            goals.append(_goal(f'GPSA speed vs reference ({label})', subject,
                               row[f'{mode}_speedup']['gpsa_vs_reference'], GOAL_VS_REFERENCE, True))
    return goals


def profile_gap(model: str, size: int, batch: int, mode: str, settings: Settings, top: int = 12) -> Dict[str, Any]:
    """``torch.profiler`` of the CNN and the T-CNN on the same work: the ops whose self time grew the most.

    Args:
        model: timm model name.
        size: Input resolution.
        batch: Batch size.
        mode: ``'inference'`` or ``'train'``.
        settings: Device, precision and memory format.
        top: How many ops to keep.
    """
    cnn = _create_cnn(model, settings.seed)
    eager = dataclasses.replace(settings, compile=None)
    runners = {'cnn': Runner(settings.prepare(cnn), eager),
               'tcnn': Runner(settings.prepare(tcnn.reparameterize(cnn, stages=settings.stages.get(model),
                                                                   verify=False)), eager)}
    torch.manual_seed(settings.seed)
    x = settings.tensor(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,), device=settings.torch_device)
    ops = {}
    for k, r in runners.items():
        step = (lambda r=r: r.infer(x)) if mode == 'inference' else (lambda r=r: r.train_step(x, y))
        ops[k] = op_profile(step, settings.torch_device)
    names = set(ops['cnn']) | set(ops['tcnn'])
    diff = sorted(((ops['tcnn'].get(n, 0.0) - ops['cnn'].get(n, 0.0), n) for n in names), reverse=True)
    total = {k: sum(v.values()) for k, v in ops.items()}
    return {
        'model': model, 'size': size, 'batch_size': batch, 'mode': mode, 'eager': True,
        'total_ms': total,
        'top_increases_ms': [_op_row(n, d, ops) for d, n in diff[:top] if d > 0],
        'top_decreases_ms': [_op_row(n, d, ops) for d, n in diff[::-1][:3] if d < 0],  # e.g. the replaced convs
    }


def _op_row(name: str, delta: float, ops: Dict[str, Dict[str, float]]) -> Dict[str, Any]:
    return {'op': name, 'cnn_ms': ops['cnn'].get(name, 0.0), 'tcnn_ms': ops['tcnn'].get(name, 0.0), 'delta_ms': delta}
