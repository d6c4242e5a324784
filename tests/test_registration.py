"""``import tcnn`` registers the ``t_*`` models and ``demo_resnet10`` with timm, whichever module imports timm first.

timm may be imported while a tcnn module that imports it is half-imported (``import tcnn.convert`` loads timm through
``tcnn.convert.fusion``); the registration then runs at that moment (``tcnn._registration``). tcnn 0.3.x's registry
imported ``tcnn.convert`` itself and failed there (a warning, and no ``t_*`` names). Each case runs in a fresh
interpreter with warnings as errors.
"""
import ast

import pytest

from helpers import fresh_python


def _fresh_python(code: str) -> str:
    """stdout of ``code`` in a new interpreter (warnings are errors) that imports this checkout's tcnn."""
    return fresh_python(code, '-W', 'error')


def _imports_timm_at_module_level(path: str) -> bool:
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ''] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        if any(name.split('.')[0] == 'timm' for name in names):
            return True
    return False


def test_the_registry_imports_no_tcnn_module_that_imports_timm():
    """What the registration imports must be complete whenever timm loads: the registry modules themselves (which
    tolerate being half-imported: they need nothing of each other) and tcnn modules that never import timm."""
    out = _fresh_python(
        'import sys\n'
        'import tcnn\n'
        'before = {m for m in sys.modules if m.split(".")[0] == "tcnn"}\n'
        'import timm\n'
        'from tcnn._registration import REGISTRY_MODULES\n'
        'for m in sorted(m for m in sys.modules if m.split(".")[0] == "tcnn" and m not in before\n'
        '                and m not in REGISTRY_MODULES):\n'
        '    print(m, sys.modules[m].__file__)\n'
        'print("registered", timm.is_model("t_resnet18d"), timm.is_model("demo_resnet10"))\n')
    lines = out.strip().splitlines()
    assert lines[-1] == 'registered True True', out
    loaded = dict(line.split() for line in lines[:-1])
    assert 'tcnn.convert' not in loaded and 'tcnn.layers' not in loaded, loaded
    assert [m for m, path in loaded.items() if _imports_timm_at_module_level(path)] == []


@pytest.mark.parametrize('first', [
    'tcnn.convert',  # -> transform -> fusion -> timm: the case 0.3.x failed
    'tcnn.files.tcnn_file',
    'tcnn.train.trainer',
    'tcnn.evaluation.scoring',
    'tcnn.demo.runner',
    'tcnn.demo.cnn',
])
def test_t_models_register_when_timm_loads_inside_a_tcnn_import(first):
    out = _fresh_python(
        f'import {first}\n'
        'import timm\n'
        'model = timm.create_model("t_resnet18d", num_classes=3)\n'
        'print(type(model).__name__, timm.models.model_entrypoint("t_resnet18d").__module__,\n'
        '      timm.models.model_entrypoint("demo_resnet10").__module__)\n')
    assert out.split() == ['TransformedResNet', 'tcnn.models', 'tcnn.demo.cnn'], out
