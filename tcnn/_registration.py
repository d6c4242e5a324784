"""How ``import tcnn`` registers tcnn's models with timm without importing timm (which takes seconds).

``tcnn.models`` (the ``t_*`` names) and ``tcnn.demo.cnn`` (``demo_resnet10``) call timm's ``register_model`` when
imported. ``import tcnn`` imports them at once when timm is already imported; otherwise it puts a one-shot finder on
``sys.meta_path`` that wraps timm's loader, so that they are imported right after timm itself, wherever timm's import
comes from (``import timm`` in the user's code, in a timm script, or in a tcnn module).

Why a hook rather than importing timm in ``import tcnn``: importing timm (and with it torch and torchvision) takes
seconds, ``import tcnn`` and the registry itself a few tens of milliseconds (docs/benchmarks.md, "Start-up and
offline costs"). Registering eagerly would make ``import tcnn``, and every ``tcnn`` command's argument check, pay
timm's import; the hook is one small finder. timm has no plug-in entry points for models to register through
instead.

The registry modules import only timm and tcnn modules that import no timm (``tcnn.files.sources``, ``tcnn.errors``):
the hook may fire while a tcnn module that imports timm is half-imported (``import tcnn.convert`` first, then timm), and
a registry that imported such a module would find it incomplete. ``tests/test_registration.py`` imports each of those
modules first, then timm, with warnings as errors.
"""
import importlib
import importlib.util
import sys
from typing import Any

__all__ = ['REGISTRY_MODULES', 'register_when_timm_loads']

REGISTRY_MODULES = ('tcnn.models', 'tcnn.demo.cnn')  # their import registers their models with timm


def _register() -> None:
    for module in REGISTRY_MODULES:
        importlib.import_module(module)


class _RegisterOnImport:
    """timm's own loader, followed by the import of the ``REGISTRY_MODULES`` (whose ``register_model`` calls add
    tcnn's names). Everything else (``get_source``, resource readers, ...) is the wrapped loader's."""

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
            _register()
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


def register_when_timm_loads() -> None:
    """Register tcnn's models with timm now if timm is imported, else the moment it is (``import tcnn`` calls this)."""
    if 'timm' in sys.modules:
        _register()
    elif not any(isinstance(f, _TimmImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TimmImportHook())
