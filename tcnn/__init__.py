"""tcnn: Transformed CNNs. Reparameterise pretrained CNNs into CNN + GPSA hybrids that hold the CNN's filters.

``import tcnn`` is light: torch and timm load on first use of an attribute (PEP 562), so the ``tcnn`` command
answers ``--help``, argument errors and file checks without the seconds those imports take. The ``t_*`` models still
register with timm on ``import tcnn``: at once when timm is already imported, else the moment timm is imported
(``_register_when_timm_loads``), so ``import tcnn; timm.create_model('t_resnet50d')`` works as before.
"""
import importlib
import importlib.util
import sys
from typing import Any, List

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


class _RegisterOnImport:
    """timm's own loader, followed by the import of ``tcnn.models`` (whose ``register_model`` calls add the ``t_*``
    names). Everything else (``get_source``, resource readers, ...) is the wrapped loader's."""

    def __init__(self, loader: Any):
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        if name == 'loader':  # not set yet (e.g. mid-copy): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        try:
            importlib.import_module(f'{__name__}.models')
        except Exception as e:  # a broken tcnn must not make timm itself fail to import
            import warnings
            warnings.warn(f'tcnn could not register its t_* models with timm: {type(e).__name__}: {e}')


class _TimmImportHook:
    """Finds ``timm`` once, through the other finders, and wraps its loader in ``_RegisterOnImport``."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != 'timm':
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps the lookup below from coming back here
        spec = importlib.util.find_spec('timm')
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterOnImport(spec.loader)
        return spec


def _register_when_timm_loads() -> None:
    if 'timm' in sys.modules:
        importlib.import_module(f'{__name__}.models')
    elif not any(isinstance(f, _TimmImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TimmImportHook())


_register_when_timm_loads()
