"""``export``: a model to a deployment file, checked against PyTorch in the runtime that reads it, written (atomically)
only when it passes.

The steps, each in its module: the options, checked once (``options``); the trace and the file's bytes, by format
(``onnx``, ``torch_export``, ``aoti``, ``executorch``); the file loaded in its runtime and compared with PyTorch
(``checks``); then the write. A model that computes non-finite logits is refused before exporting: it would fail the
comparison as if the exporter were wrong.
"""
import dataclasses
import tempfile
import time
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..atomic import atomic_open
from ..convert.verify import eval_mode
from ..data.config import data_config
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_module, check_size
from ..files.integrity import check_finite_outputs
from . import aoti, executorch, onnx, torch_export
from .checks import CHECK_BATCHES, ExportCheck, Runtime, check_refuses, check_tolerance, compare
from .options import ExportOptions, check_export_options
from .quiet import quiet_loggers

__all__ = ['ExportReport', 'export', 'export_checked']

# how each format is made, for the report (ONNX: the exporter's name)
_HOW = {'pt2': 'torch.export', 'aoti': 'torch.export + AOTInductor', 'pte': 'torch.export + ExecuTorch (XNNPACK)'}


@dataclasses.dataclass
class ExportReport:
    """What ``export`` wrote and how it was checked."""
    path: str
    format: str  # 'onnx', 'pt2' (torch.export archive), 'aoti' (AOTInductor package) or 'pte' (ExecuTorch)
    exporter: str  # 'dynamo', 'torchscript', 'torch.export', 'torch.export + AOTInductor', ...
    opset: Optional[int]
    input_shape: Tuple[Union[int, str], ...]  # symbolic axes by name: ('batch', 3, 224, 224)
    output_shape: Tuple[Union[int, str], ...]
    runtime: str  # what ran the exported model for the checks
    checks: List[ExportCheck]
    tol: float
    size_bytes: int
    seconds: float

    @property
    def max_rel_err(self) -> float:
        return max(c.max_rel_err for c in self.checks)


def export(
        model: nn.Module,
        path: str,
        *,
        input_size: Optional[Sequence[int]] = None,
        exporter: str = 'dynamo',
        opset: Optional[int] = None,
        dynamic_size: bool = False,
        tol: float = 1e-4,
        aoti: bool = False,
) -> ExportReport:
    """Export ``model`` to ``path`` (``.onnx``, ``.pt2`` or ``.pte``) with a dynamic batch, check it against PyTorch
    at batch 1 and 5, and write it atomically if it passes.

    Args:
        model: A float32 CPU model (a T-CNN or any CNN); exported in eval mode, left in its mode.
        path: Output file; its extension picks the format: ``.onnx`` (checked in onnxruntime), ``.pt2`` (a
            ``torch.export`` archive, or with ``aoti`` an AOTInductor package), ``.pte`` (ExecuTorch, XNNPACK; batch 1
            and a static size only; checked in ExecuTorch's runtime).
        input_size: ``(C, H, W)`` of the traced and checked input (default: the model's data config).
        exporter: ONNX exporter, ``'dynamo'`` or ``'torchscript'`` (ignored for ``.pt2``).
        opset: ONNX opset (default ``DEFAULT_OPSETS[exporter]``); the file gets exactly this one or an error.
        dynamic_size: Also make height and width dynamic (checked at a second size, ``+32`` px).
        tol: Largest accepted logit error relative to the largest logit.
        aoti: Compile the ``.pt2`` with AOTInductor (a package for ``torch._inductor.aoti_load_package`` or
            ``load_aoti``, C++ ``AOTIModelPackageLoader``); checked with its input checks on, also at sizes whose stage
            inputs are odd with ``dynamic_size``, and that it refuses an input it was not compiled for.

    Returns:
        The report: shapes, opset, and the error of every check.

    Raises:
        ExportMismatchError: The exported model's logits differ from PyTorch's above ``tol`` (nothing written).
        TcnnError: Unknown format, an exporter that cannot export the model (at this opset), missing onnxruntime
            (``pip install 'tcnn[onnx]'``) or executorch, a path that cannot be written, a model that computes
            non-finite logits (named before exporting), an export that needs a later torch (``tcnn.compat``: the
            dynamo exporter, ``dynamic_size``, ``aoti``).
    """
    options = check_export_options(path, exporter, opset, aoti, dynamic_size, tol)
    return export_checked(model, options, input_size)


def export_checked(model: nn.Module, options: ExportOptions, input_size: Optional[Sequence[int]] = None
                   ) -> ExportReport:
    """``export`` with options that ``check_export_options`` returned: what ``tcnn export`` runs once it has checked
    them, before reading the model (``export`` itself checks them first)."""
    start = time.perf_counter()
    check_module(model, 'model')
    if not isinstance(options, ExportOptions):
        raise InvalidTypeError(f'options must be the ExportOptions of check_export_options, got '
                               f'{type(options).__name__}')
    _check_model(model)
    size = check_size(input_size, 'input_size', 3) if input_size is not None else \
        tuple(data_config(model)['input_size'])
    fmt, dynamic_size = options.format, options.dynamic_size
    x = torch.randn(torch_export.TRACE_BATCH, *size, generator=torch.Generator().manual_seed(0))
    with eval_mode(model), torch.no_grad(), quiet_loggers(), tempfile.TemporaryDirectory(prefix='tcnn-') as folder:
        # a model that computes NaN would fail the check below as if the exporter were wrong
        check_finite_outputs(model(x), model, f'cannot export {type(model).__name__}')
        if fmt == 'onnx':
            payload = onnx.export_bytes(model, x, options.exporter, options.opset, dynamic_size)
            runtime = onnx.runner(payload)
        elif fmt == 'pt2':
            payload = torch_export.export_bytes(model, x, dynamic_size)
            runtime = torch_export.runner(payload)
        elif fmt == 'aoti':
            payload, shapes = aoti.export_bytes(model, x, dynamic_size)
            runtime = aoti.runner(payload, folder, shapes)
        else:
            payload, shapes = executorch.export_bytes(model, x, dynamic_size)
            runtime = executorch.runner(payload, shapes)
        checks = _compare(model, runtime, size, options)
    check_tolerance(checks, options.tol, runtime.name)
    try:
        with atomic_open(options.path, 'wb') as f:
            f.write(payload)
    except OSError as e:
        raise TcnnError(f'cannot write {options.path}: {e.strerror or e}') from e
    return ExportReport(options.path, fmt, options.exporter if fmt == 'onnx' else _HOW[fmt], options.opset,
                        runtime.input_shape, runtime.output_shape, runtime.name, checks, options.tol, len(payload),
                        time.perf_counter() - start)


def _compare(model: nn.Module, runtime: Runtime, size: Tuple[int, int, int],
             options: ExportOptions) -> List[ExportCheck]:
    """The checks of ``checks.compare`` as the format needs them: AOTInductor also at sizes whose stage inputs are
    odd, ExecuTorch at its one batch; both must refuse an input they were not made for."""
    fmt = options.format
    checks = compare(model, runtime.run, size, options.dynamic_size,
                     size_offsets=aoti.AOTI_SIZE_OFFSETS if fmt == 'aoti' else (),
                     batches=(executorch.PTE_BATCH,) * 2 if fmt == 'pte' else CHECK_BATCHES)
    if fmt in ('aoti', 'pte'):
        check_refuses(runtime.run, size, options.dynamic_size, runtime.name,
                      static_batch=executorch.PTE_BATCH if fmt == 'pte' else None)
    return checks


def _check_model(model: nn.Module) -> None:
    bad = next((t for t in list(model.parameters()) + list(model.buffers())
                if t.is_floating_point() and (t.device.type != 'cpu' or t.dtype != torch.float32)), None)
    if bad is not None:
        raise InvalidArgumentError(f'export takes a float32 model on the CPU, this one has {bad.dtype} tensors on '
                                   f'{bad.device}: export model.float().cpu()')
