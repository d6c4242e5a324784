"""The linear maps of a GPSA layer as pure functions: the input's queries, keys and values, and the output
projection that holds the conv's filter (T-CNN arXiv:2106.05795 eqs. 5-6).

Computation is token-major (queries as rows), so that every projection is one GEMM over the whole batch: ``Q``,
``K`` and ``V = X W_val`` come from the ``(B * N, C_in)`` token matrix (``K`` and ``V`` in one GEMM), and the output
projection is one ``(B * N_q, N_h * C_in) x (N_h * C_in, C_out)`` GEMM with the filter stored ``(C_out, N_h, C_in)``
(why: ``docs/benchmarks.md``, "Design choices of the GPSA layer"; a filter of the older 2-D layout is reordered as it
loads, ``upgrade_proj_weight``). Every branch is decided from the layer's ``Geometry`` and sizes alone (plain ints, no
data-dependent branch), so that FX traces these functions and TorchScript compiles them.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .geometry import Geometry, queries_are_tokens

__all__ = ['pad', 'query_tokens', 'project', 'grouped_values', 'output_projection', 'add_bias', 'upgrade_proj_weight']


def pad(x: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """``x`` padded like the conv of ``geometry`` pads it (its padding and ``padding_mode``, as in ``nn.Conv2d``)."""
    ph, pw = geometry.padding
    if ph == 0 and pw == 0:
        return x
    mode = 'constant' if geometry.padding_mode == 'zeros' else geometry.padding_mode
    return F.pad(x, (pw, pw, ph, ph), mode=mode)


def query_tokens(x: torch.Tensor, tokens: torch.Tensor, geometry: Geometry, *, out_size: Tuple[int, int],
                 all_tokens: bool) -> torch.Tensor:
    """Input tokens at the queries (the conv's output positions): ``(B, H_out * W_out, C_in)``; ``all_tokens``:
    ``queries_are_tokens(geometry)``.

    Decided from the layer's geometry alone (no data-dependent branch, so FX can trace it): when the padding
    does not exceed the anchor, every query lies on a real pixel, the first at ``anchor - padding``.
    """
    b, c, height, width = x.shape[0], x.shape[1], x.shape[-2], x.shape[-1]
    h_out, w_out = out_size
    (sy, sx), (ay, ax), (ph, pw) = geometry.stride, geometry.anchor, geometry.padding
    # the spatial axes are sliced after an ellipsis, not a ':' on the batch: torch 2.5's torch.export turns that ':'
    # into a guard on the batch size that no dynamic batch satisfies
    if ay < ph or ax < pw:  # queries on the border, in the padding: take them from the padded input
        x_q = pad(x, geometry)[..., ay::sy, ax::sx]
        if _cut_needed(x_q.shape[-2], x_q.shape[-1], out_size):
            x_q = x_q[..., :h_out, :w_out]
        return x_q.flatten(2).transpose(1, 2)
    if all_tokens:
        return tokens
    grid = tokens.view(b, height, width, c)[..., ay - ph::sy, ax - pw::sx, :]
    if _cut_needed(grid.shape[-3], grid.shape[-2], out_size):
        grid = grid[..., :h_out, :w_out, :]
    return grid.reshape(b, h_out * w_out, c)


def _cut_needed(rows: int, cols: int, out_size: Tuple[int, int]) -> bool:
    """Whether the strided grid of ``rows x cols`` query candidates must be cut to ``out_size``: skipped only where it
    is a no-op known from plain ints in the call itself (eager, TorchScript, a static ``torch.export``), which
    ``torch.export`` records as ``aten.alias``, a node Core ML's converter does not read. Kept for symbolic sizes (FX,
    a dynamic ``torch.export``) and under ``torch.jit.trace``, whose graph must hold at other sizes."""
    h_out, w_out = out_size
    if torch.jit.is_tracing() or not isinstance(rows, int) or not isinstance(cols, int):
        return True
    if not isinstance(h_out, int) or not isinstance(w_out, int):
        return True
    return rows != h_out or cols != w_out


def project(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
            geometry: Geometry, *, qk_dim: int, in_chs: int,
            out_size: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``(B, N_h, N_q, d)`` at the ``out_size`` output positions, keys ``(B, N_h, d, N_k)`` and values
    ``(B, N_k, C_in)`` of a GPSA layer (its weights, ``geometry``, ``qk_dim`` ``d`` and channels; sizes as plain ints,
    not read from the weights, so that FX keeps them constants).

    Keys and values are projected on the unpadded input (one GEMM for both). With zero padding they stay on the
    ``H x W`` real pixels (the padded ones are zero); otherwise they are padded to the full grid here, which is
    exact because a 1x1 projection without bias commutes with reflect/replicate/circular padding.
    """
    b, height, width = x.shape[0], x.shape[-2], x.shape[-1]
    nh, d, groups = geometry.num_heads, qk_dim, geometry.groups
    h_out, w_out = out_size
    all_tokens = queries_are_tokens(geometry)
    # Token-major (B, H * W, C_in): a free view of a channels_last input, one copy of an NCHW one.
    tokens = x.flatten(2).transpose(1, 2).contiguous()
    if groups == 1 and all_tokens:
        # every pixel is a query: Q, K and V in one GEMM (one launch, and one cast of the tokens under autocast)
        qkv = F.linear(tokens, torch.cat([q_weight, k_weight, v_weight]))
        q, kv = qkv.split([nh * d, nh * d + in_chs], dim=-1)
    else:
        q_tokens = query_tokens(x, tokens, geometry, out_size=out_size, all_tokens=all_tokens)
        q = F.linear(q_tokens, q_weight)  # (B, N_q, N_h * d)
        if groups == 1:
            kv = F.linear(tokens, torch.cat([k_weight, v_weight]))  # (B, H * W, N_h * d + C_in)
        else:
            kv = torch.cat([F.linear(tokens, k_weight), grouped_values(tokens, v_weight, in_chs, groups)], dim=-1)
    if geometry.padding_mode != 'zeros':
        kv = pad(kv.transpose(1, 2).view(b, kv.shape[-1], height, width), geometry).flatten(2).transpose(1, 2)
    # explicit sizes rather than -1 here and below: an empty batch has no size to infer
    q = q.view(b, h_out * w_out, nh, d).transpose(1, 2)
    # split, not slices: its backward writes the two gradients into one tensor (a slice's backward zero-fills a
    # tensor of the whole width for each)
    k, v = kv.split([nh * d, in_chs], dim=-1)
    return q, k.reshape(b, kv.shape[1], nh, d).permute(0, 2, 3, 1), v


def grouped_values(tokens: torch.Tensor, v_weight: torch.Tensor, in_chs: int, groups: int) -> torch.Tensor:
    """``X W_val`` for a block-diagonal ``W_val`` ``(C_in, C_in // groups)`` (groups > 1): ``(B, N, C_in)`` from
    ``(B, N, C_in)`` tokens."""
    b, n, c = tokens.shape[0], tokens.shape[1], in_chs
    if groups == c:  # depthwise: W_val is per-channel (decided from attributes only, for FX)
        return tokens * v_weight.view(1, 1, c)
    cg = c // groups
    # one GEMM per group: (g, B * N, C_in / g) x (g, C_in / g, C_in / g)
    v = torch.bmm(tokens.reshape(b * n, groups, cg).transpose(0, 1),
                  v_weight.view(groups, cg, cg).transpose(1, 2))
    return v.transpose(0, 1).reshape(b, n, c)


def output_projection(heads: torch.Tensor, proj_weight: torch.Tensor, proj_bias: Optional[torch.Tensor],
                      geometry: Geometry, *, in_chs: int, out_chs: int, b: int, n_q: int) -> torch.Tensor:
    """``sum_h heads_h W_out^h + bias`` (T-CNN eq. 5), ``heads`` ``(B, N_q * N_h, C_in)`` -> ``(B, N_q, C_out)``
    with the filter ``proj_weight`` ``(C_out, N_h, C_in // groups)`` (heads and groups: ``geometry``'s); dense and
    grouped layers (depthwise ones: ``GPSA._value_product`` with ``tcnn.layers.depthwise``)."""
    if geometry.groups == 1:
        # one GEMM over all B * N_q queries with the filter as (C_out, N_h * C_in), a free view
        return F.linear(heads.view(b, n_q, geometry.num_heads * in_chs), proj_weight.view(out_chs, -1), proj_bias)
    nh, g, c = geometry.num_heads, geometry.groups, in_chs
    # grouped: per head one batched GEMM over the groups, (g, B * N_q, C_in / g) x (g, C_in / g, C_out / g),
    # accumulated over the heads. The heads are read in place (a head's groups are a strided batch); a single
    # GEMM over (h, c) needs a group-major copy of the whole heads tensor first, and is slower (docs/benchmarks.md,
    # "Design choices of the GPSA layer").
    parts = heads.view(b * n_q, nh, g, c // g).unbind(1)
    taps = proj_weight.view(g, out_chs // g, nh, c // g).unbind(2)
    out = torch.bmm(parts[0].transpose(0, 1), taps[0].transpose(1, 2))  # (g, B * N_q, C_out / g)
    for h in range(1, nh):
        out = torch.baddbmm(out, parts[h].transpose(0, 1), taps[h].transpose(1, 2))
    return add_bias(out.transpose(0, 1).reshape(b, n_q, out_chs), proj_bias)


def add_bias(out: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``out + bias`` in ``out``'s dtype; ``out`` without a bias."""
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out


def upgrade_proj_weight(weight: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """A ``proj_weight`` in the current ``(C_out, N_h, C_in)`` layout of ``shape``: a filter of tcnn <= 0.1.0's
    ``(C_out, C_in * N_h)`` layout is reordered, anything else is returned unchanged."""
    if len(shape) == 3 and weight.shape == (shape[0], shape[1] * shape[2]):
        return weight.view(shape[0], shape[2], shape[1]).transpose(1, 2).contiguous()
    return weight
