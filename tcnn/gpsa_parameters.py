"""What a GPSA layer's per-head parameters mean, in plain Python (T-CNN, arXiv:2106.05795, footnote 1 and eq. 7):

* ``pos_locality`` holds the raw locality strength: ``alpha_h = softplus(pos_locality_h, beta=5)`` (1/tokens^2),
  the sharpness of the positional logits ``-alpha_h |delta - Delta_h|^2`` (T-CNN eq. 4, ConViT eq. 5);
* ``gating`` holds lambda: ``gate_h = sigmoid(lambda_h)`` is the positional attention's weight in the head's mix
  ``(1 - gate_h) * content_h + gate_h * positional_h`` (eq. 7);
* ``pos_centers`` holds each head's centre ``Delta_h`` (row, column offsets in tokens);
* what T-CNN Fig. 4 plots of them: the span ``1 / alpha_h`` (tokens^2), and its width ``sigma_h = 1 / sqrt(2 alpha_h)``
  (tokens: the positional logits are a Gaussian of that standard deviation along each axis).

The one reading of these values for every report of them: ``tcnn.gpsa_summary`` (from a model's layers, whose
``gate()`` and ``locality_strength()`` compute the same functions in torch) and ``tcnn info`` (from the numbers a file
stores, without torch: importing it takes seconds, this module microseconds). ``tests/test_info.py`` holds the two
computations to each other.
"""
import math
from typing import Any, Dict, List, Sequence

__all__ = ['SOFTPLUS_BETA', 'HEAD_PARAMETERS', 'gate', 'locality_strength', 'layer_summary', 'summary_of_values']

SOFTPLUS_BETA = 5.0  # T-CNN footnote 1; the one copy: the layer (tcnn.layers.gpsa) imports it from here
# The parameters of a GPSA layer (tcnn.layers.gpsa.GPSA) that its gates, spans and centres come from: a state dict
# holds them under LAYER.gating, LAYER.pos_locality and LAYER.pos_centers
HEAD_PARAMETERS = ('gating', 'pos_locality', 'pos_centers')


def gate(gating: float) -> float:
    """``sigmoid(lambda)``: the weight of the positional attention (T-CNN eq. 7), in [0, 1]."""
    if gating >= 0:
        return 1.0 / (1.0 + math.exp(-gating))
    e = math.exp(gating)  # the other branch: exp(-gating) would overflow for a very negative lambda
    return e / (1.0 + e)


def locality_strength(raw: float) -> float:
    """``softplus(raw, beta=5)``: the locality strength alpha > 0 of the stored ``pos_locality`` (T-CNN footnote 1),
    written so that neither a large nor a very negative ``raw`` overflows."""
    x = SOFTPLUS_BETA * raw
    return (max(x, 0.0) + math.log1p(math.exp(-abs(x)))) / SOFTPLUS_BETA


def layer_summary(gates: Sequence[float], alphas: Sequence[float], centers: Sequence[Sequence[float]]
                  ) -> Dict[str, Any]:
    """One GPSA layer's entry of ``tcnn.gpsa_summary`` (JSON-ready): per head its gate, alpha, span 1/alpha, width
    sigma = 1/sqrt(2 alpha) and centre, and the layer's mean gate, span and width.

    Args:
        gates: Per head, sigmoid(lambda).
        alphas: Per head, the locality strength alpha (> 0).
        centers: Per head, the centre (row, column) in tokens.
    """
    gates, alphas = [float(g) for g in gates], [float(a) for a in alphas]
    spans = [1.0 / a for a in alphas]
    sigmas = [1.0 / math.sqrt(2.0 * a) for a in alphas]
    return {'gate': gates, 'alpha': alphas, 'span': spans, 'sigma': sigmas, 'center': [list(c) for c in centers],
            'gate_mean': _mean(gates), 'span_mean': _mean(spans), 'sigma_mean': _mean(sigmas)}


def summary_of_values(gating: Sequence[float], pos_locality: Sequence[float], pos_centers: Sequence[Sequence[float]]
                      ) -> Dict[str, Any]:
    """``layer_summary`` of a layer's stored parameters (``HEAD_PARAMETERS``' values, per head)."""
    return layer_summary([gate(g) for g in gating], [locality_strength(r) for r in pos_locality], pos_centers)


def _mean(values: List[float]) -> float:
    return sum(values) / len(values)
