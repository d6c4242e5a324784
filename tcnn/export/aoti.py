"""AOTInductor packages (``.pt2`` with ``aoti``): a ``torch.export`` program compiled to native code, checked with its
input checks on, at sizes whose stage inputs are odd too, and that it refuses an input it was not compiled for.

AOTInductor compiles its input checks (dtype, device, every static size, the bounds of dynamic ones) into every
package but runs them only when ``AOTI_RUNTIME_CHECK_INPUTS`` is set when the package first runs (torch 2.15 has no
switch at compile time): tcnn's check and ``load_aoti`` set it. Its ``ceil_mode`` poolings are compiled in floor-mode
form (``tcnn.export.pooling``).
"""
import os
import tempfile
from typing import Callable, Tuple

import torch
import torch.nn as nn

from ..errors import TcnnError
from .checks import Runtime, Shape
from .metadata import METADATA_KEY, metadata_json
from .pooling import floor_mode_pools
from .quiet import error_line
from .torch_export import program_shapes, trace

__all__ = ['AOTI_CHECK_ENV', 'AOTI_SIZE_OFFSETS', 'export_bytes', 'load_aoti', 'runner']

AOTI_CHECK_ENV = 'AOTI_RUNTIME_CHECK_INPUTS'
# With a dynamic size, the AOTInductor check also runs at these offsets from the traced size (batch 2): sizes whose
# stage inputs are odd, which a ceil_mode pooling (ResNet-D's shortcut) meets and AOTInductor once computed wrongly.
AOTI_SIZE_OFFSETS = (-16, -8, 1, 16)


def export_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> Tuple[bytes, Tuple[Shape, Shape]]:
    """An AOTInductor package (``.pt2``) of ``model``, with tcnn's metadata compiled in (``get_metadata()``), and the
    input and output shapes of the program it was compiled from."""
    program = trace(floor_mode_pools(model), x, dynamic_size)
    with tempfile.TemporaryDirectory(prefix='tcnn-aoti-') as folder:
        path = os.path.join(folder, 'model.pt2')
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=path, inductor_configs={
                    'aot_inductor.metadata': {METADATA_KEY: metadata_json(model)},
                    # torch.export gives a traced batch of 2 the range [2, inf) (it specialises 0 and 1): checked, the
                    # lower bounds would refuse batch 1 (and the size's lower bound, e.g. 33 px, goes unchecked)
                    'aot_inductor.check_lowerbound': False})
        except Exception as e:  # a missing C++ compiler, an op inductor cannot lower, ...
            raise TcnnError(f'AOTInductor cannot compile this model: {error_line(e)}') from e
        with open(path, 'rb') as f:
            return f.read(), program_shapes(program.graph_module)


def load_aoti(path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load an AOTInductor package (``export(..., aoti=True)``) with its input checks on: a wrong input (size,
    channels, dtype, device) raises instead of computing garbage. ``torch._inductor.aoti_load_package(path)`` after
    setting ``AOTI_RUNTIME_CHECK_INPUTS=1`` for this process (the compiled code reads it once, at its first call)."""
    os.environ[AOTI_CHECK_ENV] = '1'
    try:
        return torch._inductor.aoti_load_package(os.fspath(path))
    except Exception as e:
        raise TcnnError(f'{path}: cannot load the AOTInductor package: {error_line(e)}') from e


def runner(payload: bytes, folder: str, shapes: Tuple[Shape, Shape]) -> Runtime:
    """The package loaded with its input checks on (``load_aoti`` reads files only: it is written to ``folder``);
    ``shapes``: those of the program it was compiled from."""
    path = os.path.join(folder, 'model.pt2')
    with open(path, 'wb') as f:
        f.write(payload)
    compiled = load_aoti(path)

    def run_aoti(x: torch.Tensor) -> torch.Tensor:
        return compiled(x)

    return Runtime(run_aoti, 'AOTInductor (input checks on)', *shapes)
