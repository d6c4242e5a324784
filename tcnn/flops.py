"""FLOP counters that papers quote, made right for GPSA layers: the handlers each counter accepts.

torch's ``torch.utils.flop_counter.FlopCounterMode`` counts a T-CNN right out of the box (every matmul and conv of
the forward, 2 FLOPs per multiply-add). The counters that papers and timm's scripts use do not know the GPSA layer
and say nothing: thop counts it as 0 MACs and 0 parameters, ptflops' default backend sees only part of it, fvcore
(timm's benchmark.py) skips its ``aten::baddbmm`` (the content scores), torchinfo prices its weights like an RNN's.
Each function below gives the handler its counter accepts; they only add the GPSA's count (a CNN's count is
unchanged) and it is FlopCounterMode's, in the counter's unit.

Units: thop, ptflops and torchinfo report multiply-adds (MACs); fvcore's "flops" are multiply-adds too;
FlopCounterMode counts 2 FLOPs per multiply-add. Compare like with like (README, "Counting FLOPs").

The counters are imported inside the functions (none is a dependency of tcnn: ``pip install 'tcnn[flops]'``).
"""
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from .errors import InvalidArgumentError
from .layers.gpsa import GPSA

__all__ = ['gpsa_macs', 'thop_ops', 'ptflops_hooks', 'fvcore_handles', 'torchinfo_summary']


def gpsa_macs(layer: GPSA, x: torch.Tensor) -> int:
    """Multiply-adds of one forward of a GPSA layer on input ``x``: FlopCounterMode's count of the matmuls that run
    (projections, content scores, attention-value and output products), halved. The layer's own forward hooks are
    not run (the counter that asked is not called again)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        type(layer).forward(layer, x)
    return counter.get_total_flops() // 2


def thop_ops() -> Dict[type, Callable]:
    """``custom_ops`` for ``thop.profile``: ``thop.profile(model, (x,), custom_ops=tcnn.flops.thop_ops())``; the GPSA
    layers' MACs and parameters, which thop otherwise counts as 0."""

    def count_gpsa(layer: GPSA, inputs: Sequence[torch.Tensor], output: torch.Tensor) -> None:
        layer.total_ops += float(gpsa_macs(layer, inputs[0]))

    return {GPSA: count_gpsa}


def _ptflops_wrappers() -> List[Any]:
    """The functions ptflops' default backend has patched to count them (``torch.mm``, ``F.relu``, ...)."""
    from ptflops.pytorch_engine import torch_function_wrapper
    namespaces = (torch, torch.Tensor, torch.nn.functional)
    return [f for ns in namespaces for f in vars(ns).values() if isinstance(f, torch_function_wrapper)]


def _aten_baddbmm(inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
    batch, n, k = inputs[1].shape
    return batch * n * k * inputs[2].shape[-1]


def ptflops_hooks(backend: str = 'pytorch') -> Dict[Any, Callable]:
    """``custom_modules_hooks`` for ptflops' ``get_model_complexity_info(..., backend=backend,
    custom_modules_hooks=tcnn.flops.ptflops_hooks(backend))``.

    Args:
        backend: ptflops' backend: ``'pytorch'`` (its default: module hooks plus patched torch functions, which
            also count elementwise ops) or ``'aten'`` (aten ops, FlopCounterMode's way; it misses only
            ``aten.baddbmm``, which the handler adds).
    """
    if backend == 'aten':
        return {torch.ops.aten.baddbmm: _aten_baddbmm}
    if backend != 'pytorch':
        raise InvalidArgumentError(f"backend must be 'pytorch' or 'aten' (ptflops' backends), got {backend!r}")

    def count_gpsa(layer: GPSA, inputs: Sequence[torch.Tensor], output: torch.Tensor) -> None:
        # The patched functions counted the ops inside the layer already (partly, elementwise ones too): measure
        # what they counted by running the layer again into a scratch list, and make the layer's total its MACs.
        wrappers = _ptflops_wrappers()
        collectors = [w.collector for w in wrappers]
        counted: List[int] = []
        try:
            for w in wrappers:
                w.collector = []  # what gpsa_macs's run would add is dropped
            macs = gpsa_macs(layer, inputs[0])
            for w in wrappers:
                w.collector = counted
            type(layer).forward(layer, inputs[0])
        finally:
            for w, c in zip(wrappers, collectors):
                w.collector = c
        layer.__flops__ += int(macs - sum(int(f) for f in counted))

    return {GPSA: count_gpsa}


def fvcore_handles() -> Dict[str, Callable]:
    """Op handles for fvcore's ``FlopCountAnalysis`` (what timm's benchmark.py uses):
    ``FlopCountAnalysis(model, x).set_op_handle(**tcnn.flops.fvcore_handles())``; fvcore has no handle for
    ``aten::baddbmm``, the GPSA's content scores."""
    from fvcore.nn.jit_handles import get_shape

    def baddbmm(inputs: List[Any], outputs: List[Any]) -> int:
        batch, n, k = get_shape(inputs[1])
        return batch * n * k * get_shape(inputs[2])[-1]

    return {'aten::baddbmm': baddbmm}


def torchinfo_summary(model: nn.Module, *args, verbose: int = 1, **kwargs) -> Any:
    """``torchinfo.summary(model, *args, **kwargs)`` with the GPSA layers' mult-adds right: torchinfo prices every
    parameter whose name holds "weight" by its own rule (for a GPSA, like an RNN's weights: more than
    the whole model's MACs) and takes no custom rule, so the GPSA rows and the total are replaced by their MACs here.
    Prints the summary like torchinfo (``verbose``) and returns its ``ModelStatistics``."""
    import torchinfo
    macs: Dict[nn.Module, List[int]] = {}

    def record(layer: GPSA, inputs: Sequence[torch.Tensor], output: torch.Tensor) -> None:
        macs.setdefault(layer, []).append(gpsa_macs(layer, inputs[0]))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, GPSA)]
    try:
        stats = torchinfo.summary(model, *args, verbose=0, **kwargs)
    finally:
        for h in handles:
            h.remove()
    calls = {m: iter(v) for m, v in macs.items()}
    for info in stats.summary_list:
        if isinstance(info.module, GPSA) and info.module in calls:
            new = next(calls[info.module], info.macs)
            if info.is_leaf_layer:
                stats.total_mult_adds += new - info.macs
            info.macs = new
    if verbose:
        print(stats)
    return stats
