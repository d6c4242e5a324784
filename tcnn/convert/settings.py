"""What a conversion sets, and the GPSA layers it makes (T-CNN, arXiv:2106.05795, section 2).

``ConversionSettings`` are the settings of ``reparameterize`` (which stages, every layer's initial locality strength
alpha, gate lambda and content q/k width); ``gpsa_layers`` finds the GPSA layers of a T-CNN, ``exact_configuration``
puts them temporarily in the configuration where each computes its conv (alpha = 50, lambda = 40, centres on the
taps), and ``gpsa_summary`` reads their per-head gates, spans and centres.
"""
import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import check_module
from ..gpsa_parameters import layer_summary
from ..layers.gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA

__all__ = ['StageSpec', 'ConversionSettings', 'CONVERSION_KEYS', 'gpsa_layers', 'gpsa_summary', 'exact_configuration']

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


@torch.no_grad()
def gpsa_summary(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    """Per GPSA layer: per-head gate sigmoid(lambda), locality strength alpha (1/tokens^2), span 1/alpha
    (tokens^2), width sigma = 1/sqrt(2 alpha) (tokens: the positional logits -alpha |delta - Delta|^2 are a Gaussian
    of that standard deviation along each axis), centre (row, col, tokens), and the layer means, as plain Python values
    (JSON-ready; T-CNN Fig. 4 plots the spans and gates over training)."""
    summary = {}
    for name, layer in gpsa_layers(model):
        gate, alpha = layer.gate(), layer.locality_strength()
        summary[name] = layer_summary(gate.tolist(), alpha.tolist(), layer.pos_centers.float().tolist())
    return summary


@contextlib.contextmanager
def exact_configuration(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put every GPSA layer in the exact configuration (alpha = 50, lambda = 40, centres on the taps).

    In that configuration a GPSA layer computes its conv (T-CNN, arXiv:2106.05795, section 2). Parameters are
    restored on exit.
    """
    check_module(model, 'model')
    saved = []
    with torch.no_grad():
        for _, layer in gpsa_layers(model):
            saved.append((layer, layer.pos_locality.clone(), layer.gating.clone(), layer.pos_centers.clone()))
            layer.set_locality_strength(EXACT_LOCALITY)
            layer.set_gating(EXACT_GATING)
            layer.pos_centers.copy_(layer.kernel_centers().to(layer.pos_centers))
    try:
        yield model
    finally:
        with torch.no_grad():
            for layer, loc, gate, centers in saved:
                layer.pos_locality.copy_(loc)
                layer.gating.copy_(gate)
                layer.pos_centers.copy_(centers)
