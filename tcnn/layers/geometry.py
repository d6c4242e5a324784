"""The geometry of a GPSA layer as one frozen value: the conv it stands for (kernel, stride, padding, dilation,
padding mode, groups), the query's place in the receptive field and the heads; and what follows from it alone (the
output size, the heads' kernel taps, whether every pixel is a query).

A layer makes its ``Geometry`` once, in its constructor (``GPSA.geometry``), and passes it whole to the pure functions
of ``tcnn.layers`` (projections, content and positional attention), which decide every branch from it: plain ints and
a string, no tensor, so that FX and the exporters record those branches as decided and TorchScript compiles them.

Why a ``NamedTuple`` and not a frozen dataclass: TorchScript compiles a ``NamedTuple`` as an argument and as a module
attribute (the module's class annotates the attribute, else TorchScript sees a plain tuple without its field names),
while it cannot script a frozen dataclass (it looks for the source of the generated ``__init__``). FX, ``torch.export``
and ``torch.compile`` read its fields as Python constants, as they read the ints it replaces.
"""
from typing import NamedTuple, Tuple

import torch

__all__ = ['Geometry', 'conv_geometry', 'output_size', 'kernel_centers', 'queries_are_tokens']


class Geometry(NamedTuple):
    """The geometry of a GPSA layer (``GPSA.geometry``), each pair as (rows, columns).

    Attributes:
        kernel_size: Kernel size ``(kh, kw)`` of the conv the layer stands for.
        stride: Stride of the conv: queries are its output positions.
        padding: Symmetric padding of the conv.
        dilation: Dilation of the conv: it spaces the attention centres.
        anchor: Query position inside the receptive field, in padded coordinates (the centre tap for odd kernels).
        padding_mode: ``'zeros'``, ``'reflect'``, ``'replicate'`` or ``'circular'``, as in ``nn.Conv2d``.
        groups: Groups of the conv (``C_in`` for depthwise).
        num_heads: Heads, one per kernel tap: ``kh * kw``.
    """
    kernel_size: Tuple[int, int]
    stride: Tuple[int, int]
    padding: Tuple[int, int]
    dilation: Tuple[int, int]
    anchor: Tuple[int, int]
    padding_mode: str
    groups: int
    num_heads: int


def conv_geometry(kernel_size: Tuple[int, int], stride: Tuple[int, int], padding: Tuple[int, int],
                  dilation: Tuple[int, int], padding_mode: str, groups: int) -> Geometry:
    """The ``Geometry`` of the GPSA layer of a conv with these (checked) settings: one head per kernel tap, and the
    query (anchor) at the centre tap of the receptive field for odd kernels, ``(k - 1) // 2`` dilated taps from its
    first."""
    (kh, kw), (dy, dx) = kernel_size, dilation
    anchor = ((kh - 1) // 2 * dy, (kw - 1) // 2 * dx)
    return Geometry(kernel_size=(kh, kw), stride=stride, padding=padding, dilation=dilation, anchor=anchor,
                    padding_mode=padding_mode, groups=groups, num_heads=kh * kw)


def output_size(height: int, width: int, geometry: Geometry) -> Tuple[int, int]:
    """Spatial size of the output for an input of ``height x width`` (the conv's formula)."""
    kernel_size, stride, padding, dilation = geometry.kernel_size, geometry.stride, geometry.padding, geometry.dilation
    hp = height + 2 * padding[0]
    wp = width + 2 * padding[1]
    h_out = (hp - dilation[0] * (kernel_size[0] - 1) - 1) // stride[0] + 1
    w_out = (wp - dilation[1] * (kernel_size[1] - 1) - 1) // stride[1] + 1
    return h_out, w_out


def kernel_centers(geometry: Geometry) -> torch.Tensor:
    """Attention centres of the kernel taps, ``(N_h, 2)`` as (row, col) offsets from the query, row-major."""
    (kh, kw), dilation, anchor = geometry.kernel_size, geometry.dilation, geometry.anchor
    ky = torch.arange(kh, dtype=torch.float32) * dilation[0] - anchor[0]
    kx = torch.arange(kw, dtype=torch.float32) * dilation[1] - anchor[1]
    return torch.cartesian_prod(ky, kx)  # (ky[i], kx[j]) pairs, row-major


def queries_are_tokens(geometry: Geometry) -> bool:
    """Stride 1 and 'same' padding: every input pixel is a query (decided from the layer's geometry alone)."""
    (sy, sx), (ay, ax), (ph, pw) = geometry.stride, geometry.anchor, geometry.padding
    (kh, kw), (dy, dx) = geometry.kernel_size, geometry.dilation
    return sy == 1 and sx == 1 and ay == ph and ax == pw and 2 * ph == dy * (kh - 1) and 2 * pw == dx * (kw - 1)
