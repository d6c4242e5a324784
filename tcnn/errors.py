"""Errors meant for the user: the CLI prints them as one line (no traceback) and exits non-zero."""
import math
from typing import Any, Optional

__all__ = ['TcnnError', 'InvalidArgumentError', 'check_number']


class TcnnError(Exception):
    """A user mistake or an unmet precondition, with a message that names the fix."""


class InvalidArgumentError(TcnnError, ValueError):
    """An argument outside its domain; also a ``ValueError``, as Python callers expect."""


def check_number(value: Any, name: str, *, gt: Optional[float] = None, ge: Optional[float] = None,
                 integer: bool = False) -> Any:
    """``value`` if it is a finite number (an int with ``integer``) within the bounds, else an
    ``InvalidArgumentError`` naming ``name`` (an API argument or a CLI flag)."""
    kind = 'an integer' if integer else 'a finite number'
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value):
        raise InvalidArgumentError(f'{name} must be {kind}, got {value!r}')
    if gt is not None and not value > gt:
        raise InvalidArgumentError(f'{name} must be > {gt:g}, got {value!r}')
    if ge is not None and not value >= ge:
        raise InvalidArgumentError(f'{name} must be >= {ge:g}, got {value!r}')
    return value
