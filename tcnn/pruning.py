"""Structured channel pruning of a T-CNN with Torch-Pruning (DepGraph, ``pip install 'tcnn[pruning]'``).

Why Torch-Pruning cannot prune a T-CNN by itself: its ``DependencyGraph`` traces the autograd graph of the forward
and reads every tensor as channel-first (dimension 1 the channels). A GPSA layer computes token-major, ``(B, N, C)``
tokens and a query-major ``(B, N_q, N_h, keys)`` attention, so each of its reshapes, the q/k/v ``cat``/``split`` and
the ``lerp`` of the two attentions become channel index mappings that are not: ``_FlattenIndexMapping`` multiplies
a group's channel list by the flattened size (x56 at ``lerp``/``mul``, x2 at the value product, for resnet18d at 64
px), and the graph walk (``get_pruning_group``) revisits a node whenever it arrives with a different channel list, so
the lists grow multiplicatively along the paths through the layers (``MemoryError`` after more than 20 GB). Its
parameters are "unwrapped" as well (pruned along their last dimension: ``pos_locality`` of 9 heads as 9 channels).

What this module does: ``pruner_options()`` gives the arguments that make Torch-Pruning read each GPSA layer as one
layer, as it reads a conv: a pruner for the layer (``GPSAPruner``: output channels are the filter's; input channels
are the columns of ``W_q``, ``W_k``, the filter's and both sides of ``W_val``) and a ``forward_fn`` that traces each
GPSA layer as one opaque op from its input to its output. Pruning the same channels of a CNN and of its T-CNN gives a
T-CNN that equals the pruned CNN in the exact configuration (``W_val`` is the identity there, and stays so with its
rows and columns pruned alike); after fine-tuning, the value channels follow the input channels (as a hidden
channel's weights go with it). Supported: dense GPSA layers (``groups=1``, every ResNet's ``layer4``); grouped and
depthwise ones are refused in one line (``TcnnError``) when their channels would be pruned: put them in
``ignored_layers``. Checked by ``tests/test_pruning.py``.

The ``tp.state_dict`` / ``tp.load_state_dict`` round trip of a pruned model works without this module (GPSA's
``in_channels`` / ``out_channels`` take the value the layer's weights have).
"""
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.nn as nn

from .errors import TcnnError
from .layers.gpsa import GPSA
from .layers.kept_values import forget

__all__ = ['pruner_options', 'gpsa_pruner', 'traced_as_one_op']


def _torch_pruning() -> Any:
    try:
        import torch_pruning
    except ImportError:
        raise TcnnError("tcnn.pruning needs Torch-Pruning: pip install 'tcnn[pruning]' (torch-pruning)") from None
    return torch_pruning


class _OneOp(torch.autograd.Function):
    """The output of a GPSA layer as one op of its input, for Torch-Pruning's trace only: the autograd node of the
    output has the input's node as its only input (no backward: nothing is differentiated through it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise TcnnError('tcnn.pruning.traced_as_one_op is for tracing by Torch-Pruning, not for training')


def traced_as_one_op(model: nn.Module, example_inputs: Any) -> Any:
    """Torch-Pruning's ``forward_fn``: ``model`` on ``example_inputs`` (a tensor, a tuple of arguments or a dict of
    keyword arguments) with every GPSA layer recorded as one op from its input to its output (its internals have no
    channel-first reading; module docstring). The outputs are the model's; the layers are restored on every exit."""
    layers = [m for m in model.modules() if isinstance(m, GPSA)]

    def one_op(layer: GPSA) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                out = GPSA.forward(layer, x)
            return _OneOp.apply(x, out)
        return forward

    try:
        for layer in layers:
            layer.forward = one_op(layer)  # an instance attribute: nn.Module.__call__ (and its hooks) call it
        if isinstance(example_inputs, dict):
            return model(**example_inputs)
        if isinstance(example_inputs, (tuple, list)):
            return model(*example_inputs)
        return model(example_inputs)
    finally:
        for layer in layers:
            layer.__dict__.pop('forward', None)


def _kept(n: int, idxs: Sequence[int]) -> List[int]:
    drop = set(int(i) for i in idxs)
    return [i for i in range(n) if i not in drop]


def _check_dense(layer: GPSA) -> None:
    if layer.groups != 1:
        raise TcnnError(f'tcnn.pruning prunes dense GPSA layers only; this one has groups={layer.groups} '
                        f'({layer.extra_repr()}): put it in ignored_layers')


def _cut(param: torch.Tensor, dim: int, keep: List[int]) -> nn.Parameter:
    index = torch.tensor(keep, dtype=torch.long, device=param.device)
    return nn.Parameter(param.data.index_select(dim, index).contiguous(), requires_grad=param.requires_grad)


def gpsa_pruner() -> Any:
    """A Torch-Pruning pruner (``tp.pruner.function.BasePruningFunc``) for GPSA layers: ``customized_pruners={GPSA:
    gpsa_pruner()}``. Output channels: rows of ``proj_weight`` and ``proj_bias``; input channels: columns of
    ``q_weight`` and ``k_weight``, the last dimension of ``proj_weight`` and rows and columns of ``v_weight``. The
    per-head parameters (positional, gates) and ``qk_dim`` are kept."""
    tp = _torch_pruning()

    class GPSAPruner(tp.pruner.function.BasePruningFunc):
        """Channel pruning of a dense ``tcnn.GPSA`` layer (``tcnn.pruning``)."""

        def prune_out_channels(self, layer: GPSA, idxs: Sequence[int]) -> GPSA:
            _check_dense(layer)
            keep = _kept(layer.out_chs, idxs)
            layer.proj_weight = _cut(layer.proj_weight, 0, keep)
            if layer.proj_bias is not None:
                layer.proj_bias = _cut(layer.proj_bias, 0, keep)
            layer.out_chs = len(keep)
            forget(layer)
            return layer

        def prune_in_channels(self, layer: GPSA, idxs: Sequence[int]) -> GPSA:
            _check_dense(layer)
            keep = _kept(layer.in_chs, idxs)
            layer.q_weight = _cut(layer.q_weight, 1, keep)
            layer.k_weight = _cut(layer.k_weight, 1, keep)
            # the value channels follow the input channels: W_val = I (the exact configuration) stays I
            layer.v_weight = _cut(_cut(layer.v_weight, 0, keep), 1, keep)
            layer.proj_weight = _cut(layer.proj_weight, 2, keep)
            layer.in_chs = len(keep)
            forget(layer)
            return layer

        def get_out_channels(self, layer: GPSA) -> int:
            return layer.out_chs

        def get_in_channels(self, layer: GPSA) -> int:
            return layer.in_chs

    return GPSAPruner()


def pruner_options() -> Dict[str, Any]:
    """Keyword arguments for Torch-Pruning's pruners and ``DependencyGraph.build_dependency`` that make a T-CNN
    prunable: ``tp.pruner.MetaPruner(model, x, importance=..., pruning_ratio=..., **tcnn.pruning.pruner_options())``
    (``customized_pruners``, ``forward_fn``, and ``root_module_types``: its default and GPSA, so that a GPSA layer's
    output channels, inside a residual block, are pruned too; merge your own into the dict given). The importance
    of a GPSA layer's channels is what the criterion reads from the other layers of its group (its own weights are
    not scored, so the channels chosen can differ from the CNN's)."""
    tp = _torch_pruning()
    roots = [tp.ops.TORCH_CONV, tp.ops.TORCH_LINEAR, tp.ops.TORCH_LSTM, GPSA]  # tp's default roots, and GPSA
    return {'customized_pruners': {GPSA: gpsa_pruner()}, 'forward_fn': traced_as_one_op, 'root_module_types': roots}
