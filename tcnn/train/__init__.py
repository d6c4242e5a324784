"""Fine-tuning: ``tcnn train``, ``python -m tcnn.train`` and ``torchrun -m tcnn.train`` (the same arguments).

``main``, ``run`` and ``Trainer`` load on first use (PEP 562), so that importing one light module of this package
(e.g. ``tcnn.train.recipe`` for ``tcnn --help``) does not import the trainer and everything it needs.
"""
import importlib
from typing import Any

__all__ = ['main', 'run', 'Trainer']


_HOMES = {'main': 'launch', 'run': 'launch', 'Trainer': 'trainer'}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f'{__name__}.{_HOMES[name]}'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
