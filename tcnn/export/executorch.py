"""ExecuTorch programs (``.pte``): lowered to the XNNPACK backend (ExecuTorch's CPU backend) where it can, checked in
ExecuTorch's runtime, batch 1 at the traced size.

ExecuTorch (1.5.1) runs a T-CNN or its CNN lowered with a dynamic batch at the traced batch only (another fails in the
runtime: "Attempted to resize a static tensor"): a ``.pte`` program takes batch 1, the on-device case, and must refuse
a second image.
"""
from typing import Tuple

import torch
import torch.nn as nn

from ..errors import TcnnError
from .checks import Runtime, Shape
from .quiet import error_line
from .torch_export import program_shapes, trace

__all__ = ['PTE_BATCH', 'export_bytes', 'runner']

PTE_BATCH = 1


def export_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> Tuple[bytes, Tuple[Shape, Shape]]:
    """An ExecuTorch program (``.pte``), lowered to the XNNPACK backend (ExecuTorch's CPU backend) where it can, and
    the input and output shapes of the ``torch.export`` program it was lowered from."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    program = trace(model, x[:PTE_BATCH], dynamic_size, dynamic_batch=False)
    try:
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as e:
        raise TcnnError(f'ExecuTorch cannot lower this model: {error_line(e)}') from e
    return lowered.buffer, program_shapes(program.graph_module)


def runner(payload: bytes, shapes: Tuple[Shape, Shape]) -> Runtime:
    """The program loaded in ExecuTorch's runtime; ``shapes``: those of the program it was lowered from."""
    import executorch
    from executorch.runtime import Runtime as ExecuTorchRuntime
    try:
        method = ExecuTorchRuntime.get().load_program(payload).load_method('forward')
    except Exception as e:
        raise TcnnError(f'ExecuTorch\'s runtime cannot load the lowered program: {error_line(e)}') from e

    def run_pte(x: torch.Tensor) -> torch.Tensor:
        return method.execute([x.contiguous()])[0]

    version = getattr(executorch, '__version__', None) or _distribution_version('executorch')
    return Runtime(run_pte, f'executorch.runtime {version}', *shapes)


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return '?'
