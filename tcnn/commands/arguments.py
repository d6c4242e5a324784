"""What several commands share: parsing ``--img-size`` (with the model's input channels) and the file sizes their
summaries print. Light at import, like every command module: torch loads only where a model is at hand."""
import ast
import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from ..errors import TcnnError

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ['parse_img_size', 'parse_model_kwargs', 'in_chans', 'size_text', 'file_size_text']


def parse_img_size(text: Optional[str], in_chans: int) -> Optional[Tuple[int, int, int]]:
    """``'224'`` -> ``(C, 224, 224)``, ``'160x192'`` -> ``(C, 160, 192)``."""
    if text is None:
        return None
    parts = text.lower().replace(',', 'x').split('x')
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        raise TcnnError(f'--img-size takes N or HxW (e.g. 224 or 160x192), got {text!r}')
    height, width = sizes if len(sizes) == 2 else sizes * 2
    return in_chans, height, width


def parse_model_kwargs(values: Optional[Sequence[str]], flag: str = '--model-kwargs') -> Dict[str, Any]:
    """``['min_size=512', 'aux_loss=True', 'act=relu']`` -> ``{'min_size': 512, 'aux_loss': True, 'act': 'relu'}``:
    values are Python literals, else strings (as timm's train.py reads its ``--model-kwargs``)."""
    kwargs: Dict[str, Any] = {}
    for item in values or ():
        key, sep, value = item.partition('=')
        if not sep or not key.isidentifier():
            raise TcnnError(f'{flag} takes KEY=VALUE pairs (e.g. min_size=512 aux_loss=True), got {item!r}')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def in_chans(model: 'nn.Module') -> int:
    """The input channels of ``model``'s first conv (3 without one): the C of ``parse_img_size``."""
    import torch.nn as nn
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    return conv.in_channels if conv is not None else 3


def size_text(n: int) -> str:
    """``n`` bytes in words: ``1.5 MiB``, ``12.0 KiB``."""
    return f'{n / 2 ** 20:.1f} MiB' if n >= 2 ** 20 else f'{n / 2 ** 10:.1f} KiB'


def file_size_text(path: str) -> str:
    """The size of the file at ``path`` in words (``size_text``)."""
    return size_text(os.path.getsize(path))
