"""tcnn: Transformed CNNs. Reparameterise pretrained CNNs into CNN + GPSA hybrids that hold the CNN's filters.

``import tcnn`` is light: torch and timm load on first use of an attribute (PEP 562), so the ``tcnn`` command
answers ``--help``, argument errors and file checks without the seconds those imports take. The ``t_*`` models (and
the demo's CNN) still register with timm on ``import tcnn``: at once when timm is already imported, else the moment
timm is imported (``tcnn._registration``), so ``import tcnn; timm.create_model('t_resnet50d')`` works as before.
"""
import importlib
from typing import Any, List

from . import _registration
from .version import __version__  # noqa: F401  (tcnn.__version__)

__all__ = ['GPSA', 'reparameterize', 'reparameterize_', 'check_equivalence', 'exact_configuration', 'gpsa_layers',
           'gpsa_summary', 'ConversionError', 'EquivalenceReport', 'load', 'save', 'param_groups', 'models',
           'TcnnError']

# public name -> the submodule that defines it
_LAZY = {
    'GPSA': 'layers.gpsa',
    'reparameterize': 'convert', 'reparameterize_': 'convert', 'check_equivalence': 'convert',
    'exact_configuration': 'convert', 'gpsa_layers': 'convert', 'gpsa_summary': 'convert',
    'ConversionError': 'convert', 'EquivalenceReport': 'convert',
    'load': 'files.loading', 'save': 'files.tcnn_file',
    'param_groups': 'train.optim',
    'TcnnError': 'errors',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f'{__name__}.{_LAZY[name]}'), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name == 'models':
        return importlib.import_module(f'{__name__}.models')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))


_registration.register_when_timm_loads()
