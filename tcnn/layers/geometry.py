"""The geometry of a GPSA layer as one frozen value: the conv it stands for (kernel, stride, padding, dilation,
padding mode, groups), the query's place in the receptive field and the heads.

A layer makes its ``Geometry`` once, in its constructor (``GPSA.geometry``), and passes it whole to the pure functions
of ``tcnn.layers`` (projections, content and positional attention), which decide every branch from it: plain ints and
a string, no tensor, so that FX and the exporters record those branches as decided and TorchScript compiles them.

Why a ``NamedTuple`` and not a frozen dataclass: TorchScript compiles a ``NamedTuple`` as an argument and as a module
attribute (the module's class annotates the attribute, else TorchScript sees a plain tuple without its field names),
while it cannot script a frozen dataclass (it looks for the source of the generated ``__init__``). FX, ``torch.export``
and ``torch.compile`` read its fields as Python constants, as they read the ints it replaces.
"""
from typing import NamedTuple, Tuple

__all__ = ['Geometry', 'conv_geometry']


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
