"""``torch.export``: the trace every format but TorchScript ONNX starts from, and the ``.pt2`` archive
(``torch.export.save``), checked with ``torch.export.load``.

The trace names the batch dimension (export fails rather than fix it) and, with a dynamic size, leaves height and
width to ``torch.export`` (``Dim.DYNAMIC``), which may bound them (e.g. a minimum size) and enforces the bounds in the
exported program. The example batch is 2: ``torch.export`` specialises sizes 0 and 1, and 1 hides a batch baked into a
reshape.
"""
import io
from typing import Tuple

import torch
import torch.nn as nn

from ..errors import TcnnError
from .checks import Runtime, Shape
from .metadata import METADATA_KEY, dynamic_axes, metadata_json
from .quiet import error_line

__all__ = ['TRACE_BATCH', 'trace', 'program_shapes', 'export_bytes', 'runner']

TRACE_BATCH = 2


def trace(model: nn.Module, x: torch.Tensor, dynamic_size: bool,
          dynamic_batch: bool = True) -> 'torch.export.ExportedProgram':
    """``torch.export`` with a named batch dimension (export fails rather than fix it; unless not ``dynamic_batch``)
    and, with ``dynamic_size``, height and width that may carry constraints (e.g. a minimum size), which the exported
    program enforces."""
    dims = {0: torch.export.Dim('batch')} if dynamic_batch else {}
    if dynamic_size:
        dims.update({2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC})
    try:
        return torch.export.export(model, (x,), dynamic_shapes=(dims,))
    except Exception as e:  # torch.export raises many types (UserError, AssertionError, GuardOnDataDependent...)
        what = 'a dynamic batch' + (', height and width' if dynamic_size else '')
        raise TcnnError(f'torch.export cannot export this model with {what}: {error_line(e)}') from e


def program_shapes(module: torch.fx.GraphModule) -> Tuple[Shape, Shape]:
    """The input and output shapes of a traced program, with symbolic axes by name."""
    axes = dynamic_axes(True)

    def shape(t: torch.Tensor) -> Shape:
        return tuple(axes.get(i, n) if isinstance(n, torch.SymInt) else int(n) for i, n in enumerate(t.shape))

    placeholders = [n for n in module.graph.nodes if n.op == 'placeholder' and 'val' in n.meta]
    out = next(n for n in module.graph.nodes if n.op == 'output').args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    return shape(placeholders[-1].meta['val']), shape(out.meta['val'])


def export_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> bytes:
    """A ``torch.export`` archive (``.pt2``) of ``model`` traced on ``x``, with tcnn's metadata as an extra file."""
    program = trace(model, x, dynamic_size)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_KEY: metadata_json(model)})
    return buffer.getvalue()


def runner(payload: bytes) -> Runtime:
    """The archive loaded with ``torch.export.load``."""
    module = torch.export.load(io.BytesIO(payload)).module()

    def run_pt2(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(x)

    return Runtime(run_pt2, 'torch.export.load', *program_shapes(module))
