"""The content attention of a GPSA layer as pure functions: ``softmax(Q_h K_h^T / sqrt(d_qk))`` (T-CNN
arXiv:2106.05795 eq. 1, ConViT arXiv:2103.10697 eq. 1), normalised over the padded grid of keys.

Why the padded keys need no scores of their own: ``W_k`` is a 1x1 projection without bias, so with zero padding the
padded keys are zero and score exactly 0; together they weigh ``n_pad * exp(0)`` in the softmax, and one extra key
of score ``log(n_pad)`` stands for all of them (50 keys instead of 169 for a 7x7 kernel on a 7x7 grid).

Precision: the attention runs in ``promote_types(dtype, float32)`` (``at_least_float32``).
"""
from typing import Optional

import torch
import torch.nn.functional as F

from .geometry import Geometry

__all__ = ['at_least_float32', 'attention_dtype', 'content_scores', 'content_attention', 'real_key_content_attention',
           'padded_keys_logit']


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in ``promote_types(t.dtype, float32)``: the dtype of every attention computation (scores, softmaxes,
    gates, geometry). float16 and bfloat16 (autocast outputs, half-precision layers) are computed in float32, where
    a softmax over a few hundred keys keeps its precision; float32 and float64 layers compute in their own dtype, so
    that a float64 layer is float64 throughout (``torch.autograd.gradcheck``, float64 verification)."""
    return t.to(attention_dtype(t.dtype))


def attention_dtype(dtype: torch.dtype) -> torch.dtype:
    """``promote_types(dtype, float32)``: the dtype ``at_least_float32`` computes in."""
    return torch.promote_types(dtype, torch.float32)


# Leaves for FX: the dtype is known at run time only (before torch 2.9, FX cannot record torch functions called with
# a traced dtype or size, e.g. promote_types, arange, full). torch.fx.wrap marks the name in the calling module's
# globals, so every module that calls them (this one, tcnn.layers.gpsa) wraps them.
torch.fx.wrap('at_least_float32')
torch.fx.wrap('attention_dtype')


def content_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``Q_h K_h^T / sqrt(d_qk)`` (``scale``: ``d_qk ** -0.5``) (T-CNN eq. 1, ConViT eq. 1): ``(B, N_h, N_q, N_k)``
    in the GEMM's dtype, from queries ``(B, N_h, N_q, d)`` and keys ``(B, N_h, d, N_k)``.

    The scale is the GEMM's ``alpha`` (``baddbmm`` with ``beta = 0``, which ignores its input): no kernel of its
    own, and under autocast it is applied before the bf16 rounding of the scores, not to bf16 queries.
    """
    b, nh, n_q, d, n_k = q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[3]
    q3 = q.reshape(b * nh, n_q, d)
    out = torch.baddbmm(q3.new_empty([1, 1, 1]), q3, k.reshape(b * nh, d, n_k), beta=0.0, alpha=scale)
    return out.view(b, nh, n_q, n_k)


def content_attention(scores: torch.Tensor, geometry: Geometry, height: int, width: int) -> torch.Tensor:
    """Content attention ``(B, N_h, N_q, H_pad, W_pad)`` from ``content_scores`` of an input of ``height x width``,
    softmax over the grid padded as ``geometry`` pads it.

    With zero padding ``k`` holds the real pixels only: a zero key scores exactly 0, so the scores of the
    padded keys are filled in as zeros before the softmax (the same result as projecting the padded input).
    """
    (ph, pw), num_heads = geometry.padding, geometry.num_heads
    scores = at_least_float32(scores)  # (B, N_h, N_q, N_k)
    if geometry.padding_mode == 'zeros':
        scores = scores.view(scores.shape[0], num_heads, scores.shape[2], height, width)
        if ph > 0 or pw > 0:
            scores = F.pad(scores, (pw, pw, ph, ph))
    scores = scores.reshape(scores.shape[0], num_heads, scores.shape[2], (height + 2 * ph) * (width + 2 * pw))
    return scores.softmax(dim=-1).view(scores.shape[0], num_heads, scores.shape[2], height + 2 * ph,
                                       width + 2 * pw)


def real_key_content_attention(scores: torch.Tensor, log_pad: Optional[torch.Tensor], height: int,
                               width: int) -> torch.Tensor:
    """Zero padding: the content attention on the real keys, query-major ``(B, N_q, N_h, H, W)``, still
    normalised over the padded grid (``log_pad``: ``padded_keys_logit``). The ``n_pad`` padded keys all score exactly 0,
    so together they weigh ``n_pad * exp(0)``: one extra key of score ``log(n_pad)`` normalises the same. The
    softmax then runs over ``H * W + 1`` keys instead of the padded grid (49 + 1 instead of 169 for a 7x7 conv on
    a 7x7 grid), with no padded copy; the concatenation that appends the extra key also writes the scores
    query-major, the order in which the value product reads the attention, so the mixed attention needs no
    reordering copy."""
    scores = scores.transpose(1, 2)  # (B, N_q, N_h, H * W), in the GEMM's dtype
    if log_pad is not None:  # padding > 0, decided from attributes only (padded_keys_logit), for FX
        # log(n_pad) is at least float32 (not rounded to bf16 under autocast), and the concatenation promotes the
        # scores to its dtype: the cast costs no kernel of its own
        padded = log_pad.expand(scores.shape[0], scores.shape[1], scores.shape[2], 1)
        content = torch.cat([scores, padded], dim=-1).softmax(dim=-1)[..., :-1]
    else:
        content = at_least_float32(scores).contiguous().softmax(dim=-1)
    return content.unflatten(-1, (height, width))


def padded_keys_logit(height: int, width: int, geometry: Geometry, device: torch.device,
                      dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The logit ``log(n_pad)`` ``(1, 1, 1, 1)`` of the one key that stands for the ``n_pad`` zero-padded keys
    of the content softmax (``real_key_content_attention``) of an input of ``height x width``; None without zero
    padding (decided from the layer's ``geometry`` only, for FX)."""
    ph, pw = geometry.padding
    if geometry.padding_mode != 'zeros' or (ph == 0 and pw == 0):
        return None
    n_pad = (height + 2 * ph) * (width + 2 * pw) - height * width
    return _log_count(n_pad, device, dtype)


def _log_count(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``log(n)`` as a ``(1, 1, 1, 1)`` tensor: the logit of one key that stands for ``n`` keys of score 0."""
    return torch.full([1, 1, 1, 1], n, dtype=dtype, device=device).log()


torch.fx.wrap('_log_count')  # a leaf for FX: n is the input's size (FX before torch 2.9 cannot record torch.full)
