"""The positional attention of a GPSA layer as pure functions of its geometry (as ``timm.layers.pos_embed_rel``).

Head ``h`` attends with ``softmax_k(-alpha_h * |delta_qk - Delta_h|^2)``, ``delta = key - query`` (T-CNN
arXiv:2106.05795 eq. 4, ConViT arXiv:2103.10697 eq. 5), where ``Delta_h`` is the head's centre (its kernel tap at
init) and ``alpha_h`` its locality strength. Keys are the positions of the padded input, queries the conv's output
positions (``anchor + stride * i`` along each axis).

Why the positional softmax is separable: the logit ``-alpha |d - Delta|^2`` splits into a row term plus a column term,
and keys form a full grid, so the 2-D softmax is the outer product of a row softmax and a column softmax. That is
exact (not an approximation), cheaper, and computed once per forward for the whole batch, from the input's shape only
(any size, different call after call, nothing cached on the module by these functions).
"""
from typing import Tuple

import torch

from .geometry import Geometry, output_size

__all__ = ['axis_offsets', 'positional_factors', 'outer']


def _offsets(size: int, n_out: int, stride: int, anchor: int, device: torch.device,
             dtype: torch.dtype) -> torch.Tensor:
    """Key-minus-query offsets along one axis, ``(n_out, size)``: queries at ``anchor + stride * i``, keys at every
    position of the padded axis."""
    query = torch.arange(n_out, device=device, dtype=dtype) * stride + anchor
    key = torch.arange(size, device=device, dtype=dtype)
    return key[None, :] - query[:, None]


torch.fx.wrap('_offsets')  # a leaf for FX: the sizes are the input's (FX before torch 2.9 cannot record arange)


def axis_offsets(height: int, width: int, geometry: Geometry, *, device: torch.device,
                 dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """Key-minus-query offsets ``(H_out, H_pad)`` and ``(W_out, W_pad)`` in ``dtype`` for an input of ``height x
    width``, and whether the two axes have the same geometry (then both are the same tensor). Under FX tracing the
    sizes are symbolic: the axes are then treated as different (no branch on the input's size)."""
    kernel_size, stride, padding, dilation = geometry.kernel_size, geometry.stride, geometry.padding, geometry.dilation
    anchor = geometry.anchor
    hp = height + 2 * padding[0]
    wp = width + 2 * padding[1]
    h_out, w_out = output_size(height, width, geometry)
    dy = _offsets(hp, h_out, stride[0], anchor[0], device, dtype)
    if isinstance(height, int) and isinstance(width, int) and (
            height == width and padding[0] == padding[1] and stride[0] == stride[1] and anchor[0] == anchor[1]
            and kernel_size[0] == kernel_size[1] and dilation[0] == dilation[1]):
        return dy, dy, True
    return dy, _offsets(wp, w_out, stride[1], anchor[1], device, dtype), False


def positional_factors(alpha: torch.Tensor, centers: torch.Tensor, offsets: Tuple[torch.Tensor, torch.Tensor, bool],
                       geometry: Geometry, *, height: int, width: int,
                       real_keys: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column factors ``(N_h, H_out, H_pad)``, ``(N_h, W_out, W_pad)`` of the separable softmax, from the
    heads' ``alpha`` ``(N_h,)``, their ``centers`` ``(2, N_h)`` and ``axis_offsets``; with ``real_keys``, their
    columns of the unpadded input only (``H``, ``W``; ``geometry``'s padding cut off), still normalised over the
    padded axis.

    The logit of key offset ``d`` from the query along one axis is ``-alpha_h (d - Delta_h)^2``. Where both axes
    have the same geometry (a square input and a symmetric conv, the usual case), the two factors are one softmax
    over a ``(2, N_h, n, k)`` tensor, cut to the real keys once and unbound: half the element-wise kernels
    forward and backward, the same values.
    """
    ph, pw = geometry.padding
    neg_alpha = -alpha[:, None, None]
    dy, dx, same_axes = offsets
    if same_axes:
        both = ((dy - centers[:, :, None, None]) ** 2 * neg_alpha).softmax(dim=-1)  # (2, N_h, n, k)
        if real_keys:
            both = both[..., ph:ph + height]
        py, px = both.unbind(0)
        return py, px
    py = ((dy - centers[0, :, None, None]) ** 2 * neg_alpha).softmax(dim=-1)
    px = ((dx - centers[1, :, None, None]) ** 2 * neg_alpha).softmax(dim=-1)
    if real_keys:
        py, px = py[..., ph:ph + height], px[..., pw:pw + width]
    return py, px


def outer(py: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
    """2-D positional attention from its factors: ``(N_h, n_y, k_y)`` x ``(N_h, n_x, k_x)`` ->
    ``(N_h, n_y * n_x, k_y, k_x)`` (queries and keys row-major)."""
    pos = py[:, :, None, :, None] * px[:, None, :, None, :]  # (N_h, n_y, n_x, k_y, k_x)
    return pos.reshape(py.shape[0], py.shape[1] * px.shape[1], py.shape[2], px.shape[2])

