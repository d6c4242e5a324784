"""Measurement primitives: interleaved timing, peak tensor memory (CPU and CUDA), FLOPs, op profiles.

Timing. The machine may be shared, so absolute times are noisy; what we report are ratios of things measured side
by side: every repeat runs each candidate once (``iters`` calls), alternating the order from repeat to repeat, and a
ratio is the median over repeats of the per-repeat ratio, so that slow phases of the machine hit both sides alike.
The clock is wall time by default. On a CPU shared with other jobs, multi-threaded wall times are erratic (a
descheduled thread stalls the others at every parallel region); ``timer='cpu'`` with one torch thread measures the
CPU time of the work itself instead (``time.thread_time``), which other processes barely disturb.

Peak memory. It is the bytes of the model's own tensors before a step (parameters, gradients, optimizer state,
inputs) plus the peak growth of live tensor bytes during the step, so that the other models kept on the device for
the side-by-side comparison do not count. On CUDA the growth comes from ``torch.cuda.max_memory_allocated`` (live
tensors; the caching allocator's reserve is excluded). On the CPU no allocator keeps such a statistic, and the
process RSS is a poor proxy: glibc keeps freed blocks resident and reuses them, so an RSS high-water mark misses
most of a step's allocations (measured: +152 MiB of RSS for a resnet50d training step whose live tensors grow by
411 MiB). ``PeakTensorMemory`` measures the CPU equivalent of ``max_memory_allocated`` instead: a
``TorchDispatchMode`` sees every tensor an ATen op creates (forward, autograd backward and optimizer step alike);
it adds the bytes of each new storage, subtracts them when the storage is freed (a weakref callback), and keeps the
maximum. Library scratch space (oneDNN, BLAS) is not counted, as on CUDA. The mode slows the step down, so it runs
apart from the timed repeats.
"""
import statistics
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

__all__ = ['synchronize', 'interleaved_times', 'timing_summary', 'paired_ratio', 'PeakTensorMemory',
           'storage_bytes', 'peak_memory', 'count_flops', 'op_profile']


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def interleaved_times(
        fns: Dict[str, Callable[[], object]],
        device: torch.device,
        warmup: int = 1,
        repeats: int = 5,
        iters: int = 1,
        timer: str = 'wall',
        first_calls: Optional[Dict[str, float]] = None,
) -> Dict[str, List[float]]:
    """Seconds per call of each function, one value per repeat, measured interleaved.

    Args:
        fns: Name -> callable doing one unit of work (an inference batch, a training step).
        device: Synchronised around each timed block (CUDA kernels are asynchronous).
        warmup: Untimed calls of each function first (allocator, oneDNN/cuDNN plans, torch.compile).
        repeats: Timed blocks per function; the order of the functions alternates between repeats.
        iters: Calls per timed block (raise it on GPU, where a single call is short).
        timer: ``'wall'`` (``time.perf_counter``), ``'cpu'`` (``time.thread_time``: CPU time of the calling
            thread; only meaningful with one torch thread on the CPU) or ``'process'`` (``time.process_time``: CPU
            time of all the process's threads, for work that runs on threads of its own, e.g. onnxruntime's).
        first_calls: If given, filled with the wall seconds of each function's first warm-up call (synchronised):
            under ``torch.compile`` that call traces and compiles, so it is the compilation time a user waits for.
    """
    clock = _clock(timer, device)
    names = list(fns)
    for i in range(warmup):
        for name in names:
            if i == 0 and first_calls is not None:
                synchronize(device)
                start = time.perf_counter()
                fns[name]()
                synchronize(device)
                first_calls[name] = time.perf_counter() - start
            else:
                fns[name]()
    synchronize(device)
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            synchronize(device)
            start = clock()
            for _ in range(iters):
                fns[name]()
            synchronize(device)
            times[name].append((clock() - start) / iters)
    return times


def _clock(timer: str, device: torch.device) -> Callable[[], float]:
    if timer == 'wall':
        return time.perf_counter
    if timer == 'process':
        return time.process_time
    if timer != 'cpu':
        raise ValueError(f'timer must be "wall", "cpu" or "process", got {timer!r}')
    if device.type != 'cpu' or torch.get_num_threads() != 1:
        raise ValueError('timer="cpu" measures one CPU thread: use it on the CPU with torch.set_num_threads(1)')
    return time.thread_time


def timing_summary(times: Sequence[float], batch_size: int) -> Dict[str, float]:
    """Median/min/max milliseconds per call and the median images per second."""
    med = statistics.median(times)
    return {
        'img_s': batch_size / med,
        'ms': med * 1e3,
        'ms_min': min(times) * 1e3,
        'ms_max': max(times) * 1e3,
        'repeats': len(times),
    }


def paired_ratio(base: Sequence[float], other: Sequence[float]) -> float:
    """Speed of ``other`` relative to ``base`` (> 1: faster), median over the interleaved repeats."""
    return statistics.median(b / o for b, o in zip(base, other))


def storage_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and duplicates counted once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != 'meta':
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storages created inside the mode and alive at the same time.

    Outputs that alias an input (views, in-place ops) are not new memory; storages of tensors that existed before
    the mode are not tracked (count them with ``storage_bytes``).
    """

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: Dict[int, weakref.ref] = {}

    def _release(self, key: int, nbytes: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and _has_storage(t)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or not _has_storage(t):
                continue
            st = t.untyped_storage()
            key = id(st)
            if key in inputs or key in self._live:
                continue
            nbytes = st.nbytes()
            self._live[key] = weakref.ref(st, lambda _, k=key, n=nbytes: self._release(k, n))
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        return out


def _has_storage(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type != 'meta'


def peak_memory(step: Callable[[], object], device: torch.device, baseline: Iterable[torch.Tensor]) -> Dict[str, Any]:
    """Peak tensor bytes of one call of ``step``: the bytes of ``baseline`` plus the peak growth during the step.

    The growth is ``max_memory_allocated - memory_allocated`` on CUDA and ``PeakTensorMemory`` on the CPU, so other
    models living on the same device (the benchmark keeps the CNN and its T-CNN side by side) are not counted.

    Args:
        step: One unit of work (e.g. forward + backward + optimizer step).
        device: Where ``step`` runs.
        baseline: Tensors of this model alive before the step (parameters, gradients, optimizer state, inputs).
    """
    base = storage_bytes(baseline)
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        growth = torch.cuda.max_memory_allocated(device) - before
        method = 'baseline + torch.cuda.max_memory_allocated growth'
    else:
        with PeakTensorMemory() as tracker:
            step()
        growth = tracker.peak
        method = 'baseline + peak of live tensor storages (dispatch mode)'
    return {'peak_bytes': base + growth, 'baseline_bytes': base, 'method': method}


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators that compute something, in order (``ops``): on a GPU each launches at least one
    kernel, so their number is what a small batch pays in host time, and it can be counted on any device. Views,
    allocations and dtype queries launch nothing and are not counted."""

    FREE = frozenset({
        'view', '_unsafe_view', 'reshape', '_reshape_alias', 'transpose', 'permute', 'expand', 'slice', 'select',
        'unsqueeze', 'squeeze', 't', 'as_strided', 'unflatten', 'flatten', 'alias', 'detach', 'unbind', 'split',
        'split_with_sizes', 'narrow', 'empty', 'empty_strided', 'new_empty', 'promote_types', 'lift_fresh',
    })

    def __init__(self):
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.FREE:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def count_operators(step: Callable[[], object]) -> int:
    """Computing operators (``OperatorCount``) of one call of ``step``, forward and backward alike."""
    with OperatorCount() as counter:
        step()
    return len(counter.ops)


@torch.no_grad()
def count_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward (``torch.utils.flop_counter``: 2 per multiply-add; matmuls, convs, attention)."""
    with FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def op_profile(step: Callable[[], object], device: torch.device, steps: int = 2) -> Dict[str, float]:
    """Self time (ms per step) of each ATen op over ``steps`` profiled calls (CPU time, or CUDA kernel time)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    step()
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    result = {}
    for evt in prof.key_averages():
        if device.type == 'cuda':
            t = getattr(evt, 'self_device_time_total', getattr(evt, 'self_cuda_time_total', 0.0))
        else:
            t = evt.self_cpu_time_total
        if t > 0:
            result[evt.key] = t / 1e3 / steps
    return result
