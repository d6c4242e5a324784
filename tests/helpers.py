"""Helpers the test files share, defined once (the fixtures are in ``conftest.py``): the relative error every
equivalence check measures, the random image batches the models get, what a failing ``torch.save`` leaves, a
fresh interpreter's output (what an import or a command imports, which this process has imported long ago) and
``torch.jit.script`` without a PyTorch flake that a long test session hits.

Imported by name, as ``formulas``, ``nontrivial`` and ``imagegen`` are: ``tests/`` has no ``__init__.py``, so pytest
puts it on ``sys.path`` (wherever the folder is: CI's oldest stack and the mutation runs' copies alike).
``tests/test_layout.py`` fails on a test file that defines one of these again.
"""
import os
import subprocess
import sys
from typing import Any, Tuple, Union

import torch

__all__ = ['rel_err', 'images', 'write_partial', 'fresh_python', 'script']


def rel_err(out: Any, ref: torch.Tensor) -> float:
    """The largest absolute difference of ``out`` from ``ref`` over the largest magnitude of ``ref``, in float64 on the
    CPU: the measure of tcnn's equivalence check (``tcnn.convert.verify``).

    One argument order everywhere: the output under test first, the reference it is measured against second (as
    ``torch.testing.assert_close(actual, expected)``); the reference's scale divides.

    Args:
        out: The output under test: a tensor or an array (an ONNX Runtime or OpenVINO output).
        ref: The reference output.
    """
    out, ref = torch.as_tensor(out).detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).abs().max() / ref.abs().max()).item()


def images(batch: int = 2, size: Union[int, Tuple[int, int]] = 64, *, chans: int = 3, seed: int = 0) -> torch.Tensor:
    """A batch of standard-normal "images" ``(batch, chans, H, W)``, the same for the same arguments (its own
    generator: the global RNG is left alone).

    Args:
        batch: Images in the batch.
        size: ``H = W = size``, or ``(H, W)``.
        chans: Channels.
        seed: The generator's seed.
    """
    height, width = (size, size) if isinstance(size, int) else size
    return torch.randn(batch, chans, height, width, generator=torch.Generator().manual_seed(seed))


def write_partial(f, data: bytes) -> None:
    """What a failing ``torch.save`` leaves: ``data`` written to ``f``, a path or an open file (tcnn gives torch.save
    an open file, so that the same object saves to the same bytes)."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, 'wb') as fh:
            fh.write(data)
    else:
        f.write(data)
        f.flush()


def fresh_python(code: str, *options: str) -> str:
    """stdout of ``code`` in a new interpreter that imports this checkout's tcnn (offline); fails the test if it fails.

    Args:
        code: Python source, run with ``python -c`` from the repository root.
        *options: The interpreter's options before ``-c`` (``'-W', 'error'``: warnings are errors).
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''), HF_HUB_OFFLINE='1')
    proc = subprocess.run([sys.executable, *options, '-c', code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script(module)``, first dropping the entries of TorchScript's builtin table that name a dead op.

    The table (``torch.jit._builtins``) maps ``id(op)`` to an op name and never forgets an id: when ``torch.library``
    defines a new overload of an op, the op's Python object is replaced and the old one freed, its id left behind. A
    module attribute allocated at that address later (a conv's padding list) is then taken for the op, and scripting
    fails with "builtin cannot be used as a value" (seen once in CI on torch 2.5.1, after ~400 tests; the mechanism is
    the same in torch 2.14). Every entry names a callable, and no two live objects share an id, so an entry at the id
    of a live attribute that is not callable is stale: only those are dropped.
    """
    table = torch.jit._builtins._get_builtin_table()
    for sub in module.modules():
        for value in vars(sub).values():
            if not callable(value):
                table.pop(id(value), None)
    return torch.jit.script(module)
