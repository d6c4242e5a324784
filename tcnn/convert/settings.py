"""What a conversion sets, and the GPSA layers it makes (T-CNN, arXiv:2106.05795, section 2).

``ConversionSettings`` are the settings of ``reparameterize`` (which stages, every layer's initial locality strength
alpha, gate lambda and content q/k width); ``gpsa_layers`` finds the GPSA layers of a T-CNN, ``exact_configuration``
puts them temporarily in the configuration where each computes its conv (alpha = 50, lambda = 40, centres on the
taps), and ``gpsa_summary`` reads their per-head gates, spans and centres.

What changes a model temporarily (``exact_configuration``, ``eval_mode``, ``restored_parameters``) puts it back on
every exit path, a failure part-way through the change included: ``check_equivalence`` and ``reparameterize`` promise
to leave the model as it was.
"""
import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import check_module
from ..gpsa_parameters import layer_summary
from ..layers.gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA, check_unsharded

__all__ = ['StageSpec', 'ConversionSettings', 'CONVERSION_KEYS', 'gpsa_layers', 'gpsa_summary', 'exact_configuration',
           'unsharded_gpsa_layers', 'restored_parameters', 'eval_mode', 'restore_modes']

StageSpec = Union[None, int, str, Sequence[Union[int, str]]]


@dataclasses.dataclass(frozen=True)
class ConversionSettings:
    """How a CNN's convs become GPSA layers (T-CNN, arXiv:2106.05795, section 2): which stages, and every layer's
    initial locality strength alpha, gate lambda and content q/k width. The defaults are the paper's fine-tuning init
    (alpha = lambda = 1) on the default stage.

    The one home of these settings: ``reparameterize``, the ``t_*`` models, ``tcnn train``'s recipe keys, T-CNN files
    (``'conversion'``) and ``model.tcnn_config`` all spell them with these names.
    """
    stages: StageSpec = None
    locality_strength: float = 1.0
    gating_init: float = 1.0
    qk_dim: Optional[int] = None

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> 'ConversionSettings':
        """The settings held by a recipe, a T-CNN file's ``'conversion'``, a ``tcnn_config`` or keyword arguments
        (other keys are ignored; a missing or None value takes the default)."""
        return cls(**{f.name: mapping[f.name] for f in dataclasses.fields(cls) if mapping.get(f.name) is not None})

    def kwargs(self) -> Dict[str, Any]:
        """As keyword arguments of ``reparameterize`` / ``timm.create_model('t_...')``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


CONVERSION_KEYS = tuple(f.name for f in dataclasses.fields(ConversionSettings))


def gpsa_layers(model: nn.Module) -> List[Tuple[str, GPSA]]:
    """All ``(name, GPSA)`` pairs of a model, in module order."""
    check_module(model, 'model')
    return [(n, m) for n, m in model.named_modules() if isinstance(m, GPSA)]


def unsharded_gpsa_layers(model: nn.Module, what: str) -> List[Tuple[str, GPSA]]:
    """``gpsa_layers``, after refusing FSDP2-sharded ones in one line (``check_unsharded``): ``what`` reads or sets
    per-head values, which a DTensor holds one shard of per rank."""
    layers = gpsa_layers(model)
    for name, layer in layers:
        check_unsharded(layer, what, name)
    return layers


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put ``model`` in eval mode (BN running statistics, no dropout); after, every submodule's own
    train/eval mode, on every exit path (a model in training with frozen norms keeps them in eval mode)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield model
    finally:
        restore_modes(modes)


def restore_modes(modes: Sequence[Tuple[nn.Module, bool]]) -> None:
    """Put every module of ``modes`` (``model.modules()``'s order: parents first) back in its mode, through its own
    ``train()`` (a GPSA layer drops what it kept) where the mode differs: a parent's ``train()`` sets its children
    too, and they follow it in the list."""
    for module, training in modes:
        if module.training != training:
            module.train(training)


@contextlib.contextmanager
def restored_parameters(layers: Sequence[GPSA], names: Sequence[str]) -> Iterator[None]:
    """Copies of the parameters ``names`` of every layer of ``layers``, taken on entry and written back on every exit,
    a raise part-way through included: what the block changes in them is temporary. Entering changes nothing, so a
    failure there leaves nothing to undo."""
    with torch.no_grad():
        saved = [(getattr(layer, n), getattr(layer, n).clone()) for layer in layers for n in names]
    try:
        yield
    finally:
        with torch.no_grad():
            for param, value in saved:
                param.copy_(value)


@torch.no_grad()
def gpsa_summary(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    """Per GPSA layer: per-head gate sigmoid(lambda), locality strength alpha (1/tokens^2), span 1/alpha
    (tokens^2), width sigma = 1/sqrt(2 alpha) (tokens: the positional logits -alpha |delta - Delta|^2 are a Gaussian
    of that standard deviation along each axis), centre (row, col, tokens), and the layer means, as plain Python values
    (JSON-ready; T-CNN Fig. 4 plots the spans and gates over training)."""
    summary = {}
    for name, layer in unsharded_gpsa_layers(model, 'gpsa_summary'):
        gate, alpha = layer.gate(), layer.locality_strength()
        summary[name] = layer_summary(gate.tolist(), alpha.tolist(), layer.pos_centers.float().tolist())
    return summary


@contextlib.contextmanager
def exact_configuration(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put every GPSA layer in the exact configuration (alpha = 50, lambda = 40, centres on the taps).

    In that configuration a GPSA layer computes its conv (T-CNN, arXiv:2106.05795, section 2). Parameters are
    restored on exit, also when setting them fails part-way (every layer's values are copied before the first is set)
    or the block raises. FSDP2-sharded layers are refused before anything changes (``check_unsharded``).
    """
    check_module(model, 'model')
    layers = [layer for _, layer in unsharded_gpsa_layers(model, 'exact_configuration')]
    with restored_parameters(layers, GPSA.positional_params + GPSA.gating_params):
        with torch.no_grad():
            for layer in layers:
                layer.set_locality_strength(EXACT_LOCALITY)
                layer.set_gating(EXACT_GATING)
                layer.pos_centers.copy_(layer.kernel_centers().to(layer.pos_centers))
        yield model
