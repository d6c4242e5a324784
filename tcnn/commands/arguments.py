"""What several commands share, defined once so that a flag means the same in every command that has it: ``--out``,
``--use-ema``, ``--img-size`` and ``--device`` (each ``add_*`` helper adds one), how a command reads the model a user
names (``check_model_file``, ``load_model``), ``--model-kwargs`` and the file sizes the summaries print.

Light at import, like every command module: torch loads only where a model is at hand. ``tcnn train`` takes its
flags from ``tcnn.train.args`` (a recipe's overrides), whose ``--device`` has this help too (``DEVICE_HELP``) and whose
``--img-size`` is read by the same parser (``parse_img_size``, defined beside the other argument checks in
``tcnn.errors`` so that training, below the command line, reaches it too).
"""
import argparse
import ast
import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from ..errors import ImageSize, TcnnError, parse_img_size
from ..paths import HUB_PREFIXES, check_input_file

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ['ImageSize', 'MODEL_FILE_EXTENSIONS', 'USE_EMA_HELP', 'IMG_SIZE_HELP', 'add_out', 'add_use_ema',
           'add_img_size', 'add_device', 'parse_img_size', 'input_size', 'check_model_file', 'load_model',
           'parse_model_kwargs', 'in_chans', 'size_text', 'file_size_text']

# What names a model file rather than a model (tcnn eval takes both)
MODEL_FILE_EXTENSIONS = ('.pt', '.pth', '.safetensors', '.bin', '.ckpt')

USE_EMA_HELP = ('read the EMA weights of the checkpoints given (state_dict_ema/model_ema: tcnn train --model-ema, '
                'timm\'s train.py --model-ema) instead of their raw weights, as timm\'s validate.py --use-ema; an '
                'error for a file that holds none')
IMG_SIZE_HELP = 'input size in pixels, N or HxW (e.g. 224 or 160x192)'


def add_out(parser: argparse.ArgumentParser, what: str, *, folder: bool = False, required: bool = False) -> None:
    """``--out``/``-o``: where the command writes what it makes, a file (``OUT``) or a folder (``DIR``), checked
    before any work (``tcnn.paths``). No argparse default: ``what`` says what is written there and, for an optional
    ``--out``, what the command does without it."""
    parser.add_argument('--out', '-o', metavar='DIR' if folder else 'OUT', required=required, help=what)


def add_use_ema(parser: argparse.ArgumentParser) -> None:
    """``--use-ema``: the EMA weights of the checkpoint the command reads (``USE_EMA_HELP``)."""
    parser.add_argument('--use-ema', action='store_true', help=USE_EMA_HELP)


def add_img_size(parser: 'argparse._ActionsContainer', of: str, default: str) -> None:
    """``--img-size SIZE``: the size of the images the model gets (``IMG_SIZE_HELP``), parsed by ``parse_img_size``
    when the command runs (a mistake is then one line, not argparse's usage).

    Args:
        parser: The command's parser, or a group of it (argparse's common base of both).
        of: What the images are, e.g. ``'of the equivalence check'``.
        default: What the command takes without the flag, e.g. ``"the model's pretrained input size"``.
    """
    parser.add_argument('--img-size', metavar='SIZE', help=f'{IMG_SIZE_HELP} {of} (default: {default})')


def add_device(parser: argparse.ArgumentParser, default: str = 'auto') -> None:
    """``--device``: where the model runs (``tcnn.runtime.devices.DEVICE_HELP``); ``auto`` unless a command has a
    reason for another default (``tcnn demo``'s, the CPU its documented numbers were measured on)."""
    from ..runtime.devices import DEVICE_HELP  # here: the commands without --device (tcnn info) skip its import
    parser.add_argument('--device', default=default, metavar='DEVICE', help=f'{DEVICE_HELP} (default {default})')


def input_size(size: Optional[ImageSize], model: 'nn.Module') -> Optional[Tuple[int, int, int]]:
    """``(C, H, W)`` of an image size for ``model`` (C: ``in_chans``); None stays None."""
    if size is None:
        return None
    height, width = (size, size) if isinstance(size, int) else size
    return in_chans(model), height, width


def check_model_file(spec: str, what: str) -> str:
    """A model file named on the command line, checked before torch loads: a file must exist and hold something
    (``tcnn.paths.check_input_file``: one line naming ``what``, e.g. ``'T-CNN file'``); a Hub folder (its path,
    ``local-dir:PATH``, ``hf-hub:ORG/NAME``) is checked as it loads."""
    if spec.startswith(HUB_PREFIXES) or os.path.isdir(spec):
        return spec
    return check_input_file(spec, what)


def _names_a_file(spec: str) -> bool:
    return os.path.exists(spec) or spec.startswith(HUB_PREFIXES) or spec.endswith(MODEL_FILE_EXTENSIONS) \
        or os.sep in spec


def load_model(spec: str, what: str = 'model file', *, use_ema: bool = False, names: bool = False) -> 'nn.Module':
    """The model a command reads, on the CPU and in eval mode: ``tcnn.load`` of a T-CNN file, a training checkpoint, a
    checkpoint of timm's train.py or a Hub folder (``check_model_file`` first).

    Args:
        spec: The file or folder, as the user gave it.
        what: Its role in messages (``'model file'``, ``'T-CNN file'``).
        use_ema: The checkpoint's EMA weights (``--use-ema``).
        names: A ``spec`` that names no file may be a timm or torchvision model name, built with its pretrained
            weights (``tcnn eval``'s CNN baselines).
    """
    if names and not _names_a_file(spec):
        if use_ema:
            raise TcnnError(f'--use-ema reads the EMA weights of training checkpoints; {spec} is a model name')
        from ..files.sources import WeightsUnavailableError, create_cnn
        try:
            return create_cnn(spec, pretrained=True).eval()
        except WeightsUnavailableError as e:  # no --weights/--no-pretrained here: a file is the way round
            raise e.with_hint('give a model file instead (a CNN saved with tcnn.save, a tcnn convert file '
                              'or a checkpoint)') from None
    check_model_file(spec, what)
    from ..files import loading
    return loading.load(spec, map_location='cpu', ema=use_ema)


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
    """The input channels of ``model``'s first conv (3 without one): the C of ``input_size``."""
    import torch.nn as nn
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    return conv.in_channels if conv is not None else 3


def size_text(n: int) -> str:
    """``n`` bytes in words: ``1.5 MiB``, ``12.0 KiB``."""
    return f'{n / 2 ** 20:.1f} MiB' if n >= 2 ** 20 else f'{n / 2 ** 10:.1f} KiB'


def file_size_text(path: str) -> str:
    """The size of the file at ``path`` in words (``size_text``)."""
    return size_text(os.path.getsize(path))
