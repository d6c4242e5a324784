"""Errors meant for the user: the CLI prints them as one line (no traceback) and exits non-zero.

The ``check_*`` helpers validate an argument where it enters (an API argument or a CLI flag, named in the message)
before any work. They import nothing heavy at module level, so the CLI can call them before torch loads.
"""
import math
import numbers
from typing import Any, Dict, Optional, Sequence, Tuple, Union

__all__ = ['TcnnError', 'InvalidArgumentError', 'InvalidTypeError', 'check_number', 'check_size', 'check_module',
           'check_device', 'check_conversion_settings', 'first_line', 'ImageSize', 'parse_img_size']

ImageSize = Union[int, Tuple[int, int]]  # N (square) or (H, W), as timm's img_size


class TcnnError(Exception):
    """A user mistake or an unmet precondition, with a message that names the fix."""


class InvalidArgumentError(TcnnError, ValueError):
    """An argument outside its domain; also a ``ValueError``, as Python callers expect."""


class InvalidTypeError(TcnnError, TypeError):
    """An argument of the wrong type; also a ``TypeError``, as Python callers expect."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none), for a one-line report."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _type_name(value: Any) -> str:
    return 'None' if value is None else type(value).__name__


def check_number(value: Any, name: str, *, gt: Optional[float] = None, ge: Optional[float] = None,
                 le: Optional[float] = None, integer: bool = False) -> Any:
    """``value`` if it is a finite real number (an integer with ``integer``) within the bounds.

    Raises:
        InvalidTypeError: Not a number (booleans are not numbers here), or not an integer with ``integer``.
        InvalidArgumentError: NaN, infinite or out of bounds. Both messages name ``name`` (an argument or a flag).
    """
    kind = 'an integer' if integer else 'a finite number'
    ok_type = isinstance(value, numbers.Integral) if integer else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not ok_type:
        raise InvalidTypeError(f'{name} must be {kind}, got {value!r} ({_type_name(value)})')
    if not math.isfinite(value):
        raise InvalidArgumentError(f'{name} must be {kind}, got {value!r}')
    for ok, op, bound in ((gt is None or value > gt, '>', gt), (ge is None or value >= ge, '>=', ge),
                          (le is None or value <= le, '<=', le)):
        if not ok:
            raise InvalidArgumentError(f'{name} must be {op} {bound:g}, got {value!r}')
    return value


def check_size(value: Any, name: str, length: int, *, what: str = '(C, H, W)') -> Tuple[int, ...]:
    """``value`` as a tuple of ``length`` positive integers (e.g. an input size ``(C, H, W)``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != length:
        raise InvalidTypeError(f'{name} must be {length} positive integers {what}, got {value!r}')
    return tuple(int(check_number(v, name, ge=1, integer=True)) for v in value)


def parse_img_size(text: Optional[str]) -> Optional[ImageSize]:
    """The ``--img-size`` of every command that has it: ``'224'`` -> ``224``, ``'160x192'`` -> ``(160, 192)`` (a
    square ``'224x224'`` -> ``224``); None stays None."""
    if text is None:
        return None
    parts = text.lower().replace(',', 'x').split('x')
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2):
        raise TcnnError(f'--img-size takes N or HxW (e.g. 224 or 160x192), got {text!r}')
    if min(sizes) < 1:
        raise TcnnError(f'--img-size must be >= 1, got {text}')
    return sizes[0] if len(sizes) == 1 or sizes[0] == sizes[1] else (sizes[0], sizes[1])


def check_module(value: Any, name: str) -> Any:
    """``value`` if it is a ``torch.nn.Module``."""
    import torch.nn as nn
    if not isinstance(value, nn.Module):
        raise InvalidTypeError(f'{name} must be a torch.nn.Module, got {_type_name(value)}')
    return value


def check_device(value: Any, name: str) -> Any:
    """``value`` as a ``torch.device`` (None stays None); an unknown name is the caller's mistake."""
    if value is None:
        return None
    import torch
    if not isinstance(value, (str, torch.device)) or isinstance(value, bool):
        raise InvalidTypeError(f'{name} must be a device name or torch.device, got {_type_name(value)}')
    try:
        return torch.device(value)
    except RuntimeError:
        raise InvalidArgumentError(f"{name} {value!r} is not a device (e.g. 'cpu', 'cuda', 'cuda:0')") from None


def check_conversion_settings(locality_strength: float, gating_init: float, qk_dim: Optional[int], tol: float,
                              names: Optional[Dict[str, str]] = None) -> None:
    """Refuse conversion settings that would build a broken model silently (a NaN alpha gives NaN logits, an
    infinite lambda a gate stuck at 1, ``qk_dim=0`` no content attention). Here rather than in ``tcnn.convert`` so
    that ``tcnn convert`` checks its flags before importing torch. ``names`` renames the arguments in messages (the
    CLI's flags)."""
    names = names or {}
    check_number(locality_strength, names.get('locality_strength', 'locality_strength'), gt=0)
    check_number(gating_init, names.get('gating_init', 'gating_init'))
    if qk_dim is not None:
        check_number(qk_dim, names.get('qk_dim', 'qk_dim'), ge=1, integer=True)
    check_number(tol, names.get('tol', 'tol'), gt=0)

