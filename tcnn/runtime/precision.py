"""Mixed precision, for training and evaluation alike: what ``--amp`` takes (``auto``, ``bf16``, ``fp16``, ``none``;
a bare ``--amp`` is ``bf16``) and the autocast dtype a mode gives on a device.

Torch-free at import, as the rest of ``tcnn.runtime``: ``AMP_MODES`` and ``AMP_HELP`` are ``tcnn train``'s and
``tcnn eval``'s ``--amp`` (and the recipe key ``amp``), whose argument errors answer before torch loads.
"""
from typing import TYPE_CHECKING, Optional

from ..errors import TcnnError

if TYPE_CHECKING:
    import torch

__all__ = ['AMP_MODES', 'AMP_HELP', 'AMP_BARE', 'amp_dtype']

# What --amp takes, in every command that has it (each states its default), and what a bare --amp means
AMP_MODES = ('auto', 'bf16', 'fp16', 'none')
AMP_HELP = 'mixed precision: auto (bf16 on GPU, none on CPU), bf16, fp16 or none'
AMP_BARE = 'bf16'


def amp_dtype(mode: str, device: 'torch.device') -> Optional['torch.dtype']:
    """The autocast dtype of ``mode`` (one of ``AMP_MODES``) on ``device``: None for full precision.

    Raises:
        TcnnError: ``fp16`` off a GPU (tcnn runs float16, and training's loss scaling, on CUDA only).
    """
    import torch
    if mode == 'auto':
        mode = 'bf16' if device.type == 'cuda' else 'none'
    if mode == 'fp16' and device.type != 'cuda':
        raise TcnnError('amp fp16 needs a GPU (use bf16 or none on CPU)')
    return {'bf16': torch.bfloat16, 'fp16': torch.float16, 'none': None}[mode]
