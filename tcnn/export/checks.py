"""The exported model against PyTorch, in the runtime that reads it, before the file is written.

Both run on the same random inputs (batch 1 and 5 at the traced size; with a dynamic size also batch 2 at a larger
one, and for AOTInductor at sizes whose stage inputs are odd); the logit error is relative to the largest logit, as in
``tcnn.check_equivalence``. A runtime that compiled its input checks in (AOTInductor, ExecuTorch) must also refuse an
input it was not made for instead of computing garbage.
"""
import dataclasses
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..convert.verify import output_errors
from ..errors import TcnnError
from .quiet import error_line, native_output_dropped

__all__ = ['ExportMismatchError', 'ExportCheck', 'Runtime', 'CHECK_BATCHES', 'SIZE_STEP', 'SIZE_CHECK_BATCH',
           'compare', 'check_refuses', 'check_tolerance']

CHECK_BATCHES = (1, 5)
# With a dynamic size, the check also runs at the traced size + 32 (one more token per row and column of a stride-32
# last stage) at this batch.
SIZE_STEP = 32
SIZE_CHECK_BATCH = 2

Shape = Tuple[Union[int, str], ...]  # symbolic axes by name: ('batch', 3, 224, 224)


class ExportMismatchError(TcnnError):
    """The exported model computes other logits than the PyTorch model (above tolerance): nothing was written."""


@dataclasses.dataclass
class ExportCheck:
    """One comparison of the exported model with PyTorch: input shape and logit errors (relative to the largest
    logit)."""
    batch: int
    height: int
    width: int
    max_abs_err: float
    max_rel_err: float


class Runtime(NamedTuple):
    """The exported model loaded in the runtime that reads its format."""
    run: Callable[[torch.Tensor], torch.Tensor]  # images -> logits
    name: str  # the runtime and its version, for the report and messages
    input_shape: Shape
    output_shape: Shape


def compare(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int, int],
            dynamic_size: bool, size_offsets: Sequence[int] = (),
            batches: Sequence[int] = CHECK_BATCHES) -> List[ExportCheck]:
    """Logits of the exported model against PyTorch's, on the same random inputs: ``batches`` (1 and 5) at ``size``;
    with a dynamic size also batch 2 at ``SIZE_STEP`` px more and at each of ``size_offsets`` from ``size``.

    Raises:
        ExportMismatchError: The exported model fails on an input or gives logits of another shape.
    """
    c, height, width = size
    cases = [(b, height, width) for b in batches]
    if dynamic_size:
        offsets = (SIZE_STEP,) + tuple(size_offsets)
        cases += [(SIZE_CHECK_BATCH, height + d, width + d) for d in offsets if min(height, width) + d >= 33]
    generator = torch.Generator().manual_seed(0)
    checks = []
    for b, h, w in cases:
        x = torch.randn(b, c, h, w, generator=generator)
        with torch.no_grad():
            reference = model(x)
        try:
            out = run(x)
        except Exception as e:
            raise ExportMismatchError(f'the exported model fails on a {b}x{c}x{h}x{w} input: {error_line(e)}; '
                                      'nothing written') from e
        if out.shape != reference.shape:
            raise ExportMismatchError(f'the exported model gives logits of shape {tuple(out.shape)} for a '
                                      f'{b}x{c}x{h}x{w} input, PyTorch {tuple(reference.shape)}; nothing written')
        max_abs, max_rel, _ = output_errors(reference, out)
        checks.append(ExportCheck(b, h, w, max_abs, max_rel))
    return checks


def check_refuses(run: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int, int], dynamic_size: bool,
                  runtime: str, static_batch: Optional[int] = None) -> None:
    """The exported model raises on an input it was not made for (one more channel; with a static size, 32 px more;
    with a ``static_batch``, one more image) instead of computing garbage.

    Raises:
        ExportMismatchError: It ran the wrong input.
    """
    c, h, w = size
    wrong = (1, c + 1, h, w) if dynamic_size else (1, c, h + SIZE_STEP, w + SIZE_STEP)
    if static_batch is not None:
        wrong = (static_batch + 1, c, h, w)
    try:
        with native_output_dropped():  # the runtimes print their refusal too
            run(torch.zeros(wrong))
    except Exception:
        return
    raise ExportMismatchError(f'the exported model ({runtime}) runs a {"x".join(map(str, wrong))} input it was not '
                              'made for instead of refusing it; nothing written')


def check_tolerance(checks: Sequence[ExportCheck], tol: float, runtime: str) -> None:
    """Every check within ``tol`` (a NaN error fails too).

    Raises:
        ExportMismatchError: Names the worst check.
    """
    worst = max(checks, key=lambda c: c.max_rel_err if c.max_rel_err == c.max_rel_err else float('inf'))
    if not worst.max_rel_err <= tol:  # NaN fails too
        raise ExportMismatchError(
            f'the exported model differs from PyTorch: max rel err {worst.max_rel_err:.2g} at batch {worst.batch}, '
            f'{worst.height}x{worst.width} ({runtime}; tolerance {tol:g}); nothing written')
