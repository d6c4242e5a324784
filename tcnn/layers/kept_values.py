"""Values a GPSA layer keeps from call to call in eager mode, and when it may keep them.

On a GPU at small batches the host's launches, not the kernels, set the layer's time, so what depends on the input's
size only (the key-query offsets, ``log(n_pad)``) is made once per size, device and dtype, and where no gradient flows
to the positional and gating parameters (inference), the positional attention and the gates are kept from call to
call in eval mode, for as long as those parameters are the same tensors at the same version and address (PyTorch
bumps a tensor's version on every in-place change: optimizer steps, ``load_state_dict``, the setters;
``param.data = t`` moves the address), and ``train()``/``eval()`` drop them (``forget``), as does every forward with
gradients (``GPSA``): fused optimizers (``torch.optim.AdamW(fused=True)``) write the parameters without a version bump,
and a training step needs such a forward first. Only an in-place write through ``param.data`` in eval mode, which
bypasses version counting, or a fused step on gradients set by hand, would go unseen: switch modes after such an
edit. Nothing is kept under TorchScript, FX, ``torch.compile``, exporters or functorch
transforms (``may_keep``).

One name for the idea throughout: a layer *keeps* values (``keep``) in its ``_kept_values`` dict, at most
``MAX_KEPT`` of them, when it ``may_keep``; ``forget`` drops them.
"""
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn as nn

from .. import compat

__all__ = ['keep', 'forget', 'may_keep', 'is_exporting', 'MAX_KEPT', 'KEPT_ATTRIBUTE']

# the most values a layer keeps (the newest), so that a stream of new input sizes cannot grow it
MAX_KEPT = 8
# the layer's attribute (in its ``__dict__``, plain Python: never part of a state dict or a TorchScript module)
KEPT_ATTRIBUTE = '_kept_values'


def is_exporting() -> bool:
    """Whether an exporter or tracer is recording the forward: ``torch.export`` (also under the dynamo ONNX
    exporter), the TorchScript ONNX exporter or ``torch.jit.trace``. Such a graph must hold for other input sizes
    than the one traced, so the depthwise product takes its plain-op form there (``attend_traceable``)."""
    return compat.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def may_keep(size: int) -> bool:
    """Whether a forward may keep values from call to call: in eager mode on real sizes only, never while FX,
    TorchScript, dynamo, an exporter or a functorch transform records or wraps the computation (a kept tensor would
    become a constant of their graph, or escape its transform)."""
    return (isinstance(size, int) and not is_exporting() and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


def keep(layer: nn.Module, key: tuple, params: Tuple[torch.Tensor, ...], make: Callable[[], Any]) -> Any:
    """``make()``, kept on ``layer`` under ``key`` while ``params`` are the same tensors at the same version and
    address (``param.data = ...`` replaces the storage without a version bump, so the address is checked too).

    Values are made outside inference mode (a tensor made inside it could not be used by a later training forward)
    and without gradients;
    a layer keeps at most ``MAX_KEPT`` of them (the newest), so a stream of new input sizes cannot grow it.
    """
    kept = layer.__dict__.setdefault(KEPT_ATTRIBUTE, {})
    stamp = tuple((p, p._version, p.data_ptr()) for p in params)
    hit = kept.get(key)
    if hit is not None and len(hit[0]) == len(stamp) and all(
            a[0] is b[0] and a[1:] == b[1:] for a, b in zip(hit[0], stamp)):
        return hit[1]
    # inference_mode(False) turns gradient mode on (it is also autograd's mode guard): no_grad inside it keeps the
    # values graph-free leaves (kept values never need a gradient; copy.deepcopy accepts only leaves)
    with torch.inference_mode(False), torch.no_grad():
        value = make()
    kept.pop(key, None)
    kept[key] = (stamp, value)
    while len(kept) > MAX_KEPT:
        kept.pop(next(iter(kept)), None)
    return value


def forget(layer: nn.Module, kind: Optional[str] = None) -> None:
    """Drop every value ``layer`` keeps (``GPSA.train``: a mode switch is where training ends), or those whose key
    starts with ``kind``."""
    if kind is None:
        layer.__dict__.pop(KEPT_ATTRIBUTE, None)
        return
    kept = layer.__dict__.get(KEPT_ATTRIBUTE)
    if kept:
        for key in [k for k in kept if k[0] == kind]:
            del kept[key]
