"""Export a model for deployment, checked against PyTorch before the file is written.

Two formats, chosen by the output's extension: ``.onnx`` (onnxruntime, TensorRT, ...) and ``.pt2`` (``torch.export``'s
archive: AOTInductor, ExecuTorch, ``torch.export.load``). Both take a dynamic batch, and with ``dynamic_size`` a
dynamic height and width. The exported model is then run against the PyTorch model on the same random inputs at
batch 1 and 5 (onnxruntime for ``.onnx``, the exported program for ``.pt2``); the file is written (atomically) only
when the largest logit error, relative to the largest logit as in ``tcnn.check_equivalence``, is within tolerance.

The ONNX exporters (torch 2.15, onnxruntime 1.32; docs/export.md has the measurements):

* ``'dynamo'`` (default): ``torch.export`` then the torch.export-based ONNX exporter, opsets 18 and later (it writes
  no earlier opset: asked for one, it writes 18). Torch's default exporter since 2.9.
* ``'torchscript'``: the legacy tracing exporter, opsets 13 to 20 (13: GPSA's ``unflatten``; 20: the exporter's
  newest). Deprecated by torch, kept for runtimes that need an opset below 18.

Both export every family T-CNNs are made from (ResNet, ResNeXt, RegNet, ConvNeXt, EfficientNet, MobileNetV3,
byobnet, torchvision) because a depthwise GPSA layer switches to a plain-op form of its product while an exporter
traces it (``tcnn.depthwise.attend_traceable``): the eager product picks its order and chunk plan from the batch
size, which ``torch.export`` turns into guards that fix the batch, and its small-shape order uses ``linalg.vecdot``,
which has no ONNX form in the TorchScript exporter.
"""
import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from . import data
from .atomic import atomic_open
from .convert import _errors, eval_mode
from .errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_module, check_number, check_size
from .paths import check_output_file
from .version import EXPORT_EXTENSIONS, __version__

__all__ = ['export', 'ExportReport', 'ExportCheck', 'ExportMismatchError', 'EXPORTERS', 'OPSETS', 'DEFAULT_OPSETS',
           'ONNX_EXTRA', 'check_export_options', 'require_onnx', 'onnx_session']

EXPORTERS = ('dynamo', 'torchscript')
# The opsets each ONNX exporter writes for a T-CNN (inclusive): the dynamo exporter's translations start at opset 18
# (asked for less, it silently writes 18); the TorchScript exporter's GPSA needs opset 13 (unflatten) and it stops at
# 20. The dynamo exporter's upper end is torch's; the written opset is compared with the one asked for anyway.
OPSETS = {'dynamo': (18, None), 'torchscript': (13, 20)}
# Defaults: the oldest opset each exporter writes, which the most runtimes read (onnxruntime >= 1.14, TensorRT >= 8.6)
DEFAULT_OPSETS = {'dynamo': 18, 'torchscript': 17}
ONNX_EXTRA = "pip install 'tcnn[onnx]'"
CHECK_BATCHES = (1, 5)
# The example batch of the trace: torch.export specialises sizes 0 and 1, and 1 hides a batch baked into a reshape.
TRACE_BATCH = 2
# With a dynamic size, the check also runs at the traced size + 32 (one more token per row and column of a stride-32
# last stage) at this batch.
SIZE_STEP = 32
SIZE_CHECK_BATCH = 2
INPUT_NAME, OUTPUT_NAME = 'input', 'logits'
METADATA_KEY = 'tcnn'  # ONNX metadata_props key / .pt2 extra file holding what the model needs (JSON)


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


@dataclasses.dataclass
class ExportReport:
    """What ``export`` wrote and how it was checked."""
    path: str
    format: str  # 'onnx' or 'pt2'
    exporter: str  # 'dynamo', 'torchscript' or 'torch.export'
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


def check_export_options(path: str, exporter: str = 'dynamo', opset: Optional[int] = None) -> str:
    """The format of ``path`` (``'onnx'`` or ``'pt2'``, by its extension, which ``check_output_file`` has checked),
    after checking that the exporter and opset make sense for it; one-line ``TcnnError``s otherwise (named as on the
    command line)."""
    if exporter not in EXPORTERS:
        raise InvalidArgumentError(f'exporter must be one of {", ".join(EXPORTERS)}, got {exporter!r}')
    fmt = 'pt2' if str(path).lower().endswith('.pt2') else 'onnx'
    if fmt == 'pt2':
        if opset is not None:
            raise InvalidArgumentError('--opset applies to .onnx files; a .pt2 file (torch.export) has no opset')
        return fmt
    if opset is not None:
        check_number(opset, '--opset', ge=1, integer=True)
        if not _writes(exporter, opset):
            other = next(e for e in EXPORTERS if e != exporter)
            hint = f'; --exporter {other} writes it' if _writes(other, opset) else ''
            raise InvalidArgumentError(f'--opset {opset}: the {exporter} exporter writes opsets '
                                       f'{_opsets_text(exporter)}{hint}')
    return fmt


def _writes(exporter: str, opset: int) -> bool:
    low, high = OPSETS[exporter]
    return low <= opset and (high is None or opset <= high)


def _opsets_text(exporter: str) -> str:
    low, high = OPSETS[exporter]
    return f'{low}-{high}' if high is not None else f'{low} and later'


def require_onnx(exporter: str = 'dynamo') -> None:
    """Raise one line naming the ``onnx`` extra when a package the ONNX export or its check needs is missing."""
    needed = ['onnx', 'onnxruntime'] + (['onnxscript'] if exporter == 'dynamo' else [])
    missing = []
    for name in needed:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise TcnnError(f'exporting to ONNX needs {" and ".join(missing)} (to export and to check the export '
                        f'against PyTorch): {ONNX_EXTRA}')


def onnx_session(model: Union[str, bytes], threads: Optional[int] = None) -> Any:
    """An onnxruntime CPU session for an ONNX file or its bytes (``threads``: intra-op threads, default
    onnxruntime's), logging errors only."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=['CPUExecutionProvider'])


@contextlib.contextmanager
def _quiet_loggers(names: Sequence[str] = ('torch', 'onnxscript', 'onnx_ir')) -> Iterator[None]:
    """Silence the exporters' log records inside the block (progress, and tracebacks of fallbacks they recover from
    or that ``export`` reports in one line); the levels are restored after."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _native_output_dropped() -> Iterator[None]:
    """Drop what native code writes to file descriptors 1 and 2 inside the block: the TorchScript exporter's C++ side
    prints the whole graph when an op has no ONNX form, which ``export`` reports in one line instead."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        with open(os.devnull, 'wb') as sink:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return f'{type(e).__name__}: {lines[0] if lines else ""}'.rstrip(': ')


def _metadata(model: nn.Module) -> str:
    """What a deployment needs besides the graph, as JSON: the preprocessing, the source CNN, the conversion."""
    return json.dumps({
        'tcnn_version': __version__,
        'source': (getattr(model, 'tcnn_source', None) or {}).get('model'),
        'conversion': getattr(model, 'tcnn_config', None),
        'data_config': data.data_config(model),
        'input': INPUT_NAME, 'output': OUTPUT_NAME,
    }, default=list)


def _dynamic_axes(dynamic_size: bool) -> Dict[int, str]:
    return {0: 'batch', 2: 'height', 3: 'width'} if dynamic_size else {0: 'batch'}


def _torch_export(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> 'torch.export.ExportedProgram':
    """``torch.export`` with a named batch dimension (export fails rather than fix it) and, with ``dynamic_size``,
    height and width that may carry constraints (e.g. a minimum size), which the exported program enforces."""
    dims = {0: torch.export.Dim('batch')}
    if dynamic_size:
        dims.update({2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC})
    try:
        return torch.export.export(model, (x,), dynamic_shapes=(dims,))
    except Exception as e:  # torch.export raises many types (UserError, AssertionError, GuardOnDataDependent...)
        what = 'a dynamic batch' + (', height and width' if dynamic_size else '')
        raise TcnnError(f'torch.export cannot export this model with {what}: {_first_line(e)}') from e


def _onnx_dynamo(model: nn.Module, x: torch.Tensor, opset: int, dynamic_size: bool) -> Any:
    program = _torch_export(model, x, dynamic_size)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # progress lines
            onnx_program = torch.onnx.export(program, (x,), dynamo=True, opset_version=opset, verbose=False,
                                             input_names=[INPUT_NAME], output_names=[OUTPUT_NAME])
    except Exception as e:
        raise TcnnError(f'the dynamo ONNX exporter cannot export this model at opset {opset}: {_first_line(e)}') from e
    shape = onnx_program.model.graph.inputs[0].shape  # symbolic axes as the names the TorchScript exporter gives
    onnx_program.rename_axes({shape[axis]: name for axis, name in _dynamic_axes(dynamic_size).items()
                              if not isinstance(shape[axis], int)})
    return onnx_program.model_proto


def _onnx_torchscript(model: nn.Module, x: torch.Tensor, opset: int, dynamic_size: bool) -> Any:
    import onnx
    buffer = io.BytesIO()
    axes = _dynamic_axes(dynamic_size)
    try:
        with warnings.catch_warnings(), _native_output_dropped():
            warnings.simplefilter('ignore', DeprecationWarning)  # the legacy exporter, chosen knowingly
            torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=opset, input_names=[INPUT_NAME],
                              output_names=[OUTPUT_NAME], dynamic_axes={INPUT_NAME: axes, OUTPUT_NAME: {0: 'batch'}})
    except Exception as e:
        raise TcnnError(f'the torchscript ONNX exporter cannot export this model at opset {opset}: '
                        f'{_first_line(e)}') from e
    return onnx.load_from_string(buffer.getvalue())


def _onnx_bytes(model: nn.Module, x: torch.Tensor, exporter: str, opset: int, dynamic_size: bool) -> bytes:
    """The ONNX model as bytes, with tcnn's metadata; checks the written opset (the dynamo exporter falls back to
    another without failing)."""
    fn = _onnx_dynamo if exporter == 'dynamo' else _onnx_torchscript
    proto = fn(model, x, opset, dynamic_size)
    written = next((o.version for o in proto.opset_import if o.domain in ('', 'ai.onnx')), None)
    if written != opset:
        raise TcnnError(f'--opset {opset}: the {exporter} exporter could not convert this model to opset {opset} (it '
                        f'wrote opset {written}); use a lower opset')
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, _metadata(model)
    try:
        return proto.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        raise TcnnError(f'the ONNX model is too large for one file ({_first_line(e)})') from e


def _pt2_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> bytes:
    program = _torch_export(model, x, dynamic_size)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_KEY: _metadata(model)})
    return buffer.getvalue()


def _shape_of(value: Any) -> Tuple[Union[int, str], ...]:
    """An onnxruntime input/output shape, with symbolic axes by name."""
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape)


def _runner(fmt: str, payload: bytes) -> Tuple[Callable[[torch.Tensor], torch.Tensor], str, Tuple, Tuple]:
    """A function running the exported model, the runtime's name, and the input and output shapes."""
    if fmt == 'onnx':
        import onnxruntime as ort
        try:
            session = onnx_session(payload)
        except Exception as e:
            raise TcnnError(f'onnxruntime {ort.__version__} cannot load the exported model: {_first_line(e)}') from e

        def run_onnx(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])

        return (run_onnx, f'onnxruntime {ort.__version__}', _shape_of(session.get_inputs()[0]),
                _shape_of(session.get_outputs()[0]))
    module = torch.export.load(io.BytesIO(payload)).module()
    axes = _dynamic_axes(True)

    def run_pt2(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(x)

    def shape(t: torch.Tensor) -> Tuple[Union[int, str], ...]:
        return tuple(axes.get(i, n) if isinstance(n, torch.SymInt) else int(n) for i, n in enumerate(t.shape))

    placeholders = [n for n in module.graph.nodes if n.op == 'placeholder' and 'val' in n.meta]
    out = next(n for n in module.graph.nodes if n.op == 'output').args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    return run_pt2, 'torch.export.load', shape(placeholders[-1].meta['val']), shape(out.meta['val'])


def _check(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int, int],
           dynamic_size: bool) -> List[ExportCheck]:
    """Logits of the exported model against PyTorch's, on the same random inputs: batch 1 and 5 at ``size``, with a
    dynamic size also batch 2 at a larger one."""
    c, height, width = size
    cases = [(b, height, width) for b in CHECK_BATCHES]
    if dynamic_size:
        cases.append((SIZE_CHECK_BATCH, height + SIZE_STEP, width + SIZE_STEP))
    generator = torch.Generator().manual_seed(0)
    checks = []
    for b, h, w in cases:
        x = torch.randn(b, c, h, w, generator=generator)
        with torch.no_grad():
            reference = model(x)
        try:
            out = run(x)
        except Exception as e:
            raise ExportMismatchError(f'the exported model fails on a {b}x{c}x{h}x{w} input: {_first_line(e)}; '
                                      'nothing written') from e
        if out.shape != reference.shape:
            raise ExportMismatchError(f'the exported model gives logits of shape {tuple(out.shape)} for a '
                                      f'{b}x{c}x{h}x{w} input, PyTorch {tuple(reference.shape)}; nothing written')
        max_abs, max_rel, _ = _errors(reference, out)
        checks.append(ExportCheck(b, h, w, max_abs, max_rel))
    return checks


def _check_model(model: nn.Module) -> None:
    bad = next((t for t in list(model.parameters()) + list(model.buffers())
                if t.is_floating_point() and (t.device.type != 'cpu' or t.dtype != torch.float32)), None)
    if bad is not None:
        raise InvalidArgumentError(f'export takes a float32 model on the CPU, this one has {bad.dtype} tensors on '
                                   f'{bad.device}: export model.float().cpu()')


def export(
        model: nn.Module,
        path: str,
        *,
        input_size: Optional[Sequence[int]] = None,
        exporter: str = 'dynamo',
        opset: Optional[int] = None,
        dynamic_size: bool = False,
        tol: float = 1e-4,
) -> ExportReport:
    """Export ``model`` to ``path`` (``.onnx`` or ``.pt2``) with a dynamic batch, check it against PyTorch at batch 1
    and 5, and write it atomically if it passes.

    Args:
        model: A float32 CPU model (a T-CNN or any CNN); exported in eval mode, left in its mode.
        path: Output file; its extension picks the format.
        input_size: ``(C, H, W)`` of the traced and checked input (default: the model's data config).
        exporter: ONNX exporter, ``'dynamo'`` or ``'torchscript'`` (ignored for ``.pt2``).
        opset: ONNX opset (default ``DEFAULT_OPSETS[exporter]``); the file gets exactly this one or an error.
        dynamic_size: Also make height and width dynamic (checked at a second size, ``+32`` px).
        tol: Largest accepted logit error relative to the largest logit.

    Returns:
        The report: shapes, opset, and the error of every check.

    Raises:
        ExportMismatchError: The exported model's logits differ from PyTorch's above ``tol`` (nothing written).
        TcnnError: Unknown format, an exporter that cannot export the model (at this opset), missing onnxruntime
            (``pip install 'tcnn[onnx]'``), a path that cannot be written.
    """
    start = time.perf_counter()
    if not hasattr(torch.compiler, 'is_exporting'):  # the depthwise layers' traceable form depends on it
        raise TcnnError(f'exporting needs torch >= 2.6 (this is {torch.__version__}): pip install -U torch')
    check_module(model, 'model')
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'path must be a file path, got {type(path).__name__}')
    path = check_output_file(os.fspath(path), 'path', EXPORT_EXTENSIONS)  # the format too, by extension
    fmt = check_export_options(path, exporter, opset)
    check_number(tol, 'tol', gt=0)
    if fmt == 'onnx':
        require_onnx(exporter)
        opset = DEFAULT_OPSETS[exporter] if opset is None else int(opset)
    _check_model(model)
    size = check_size(input_size, 'input_size', 3) if input_size is not None else \
        tuple(data.data_config(model)['input_size'])
    x = torch.randn(TRACE_BATCH, *size, generator=torch.Generator().manual_seed(0))
    with eval_mode(model), torch.no_grad(), _quiet_loggers():
        payload = _onnx_bytes(model, x, exporter, opset, dynamic_size) if fmt == 'onnx' else \
            _pt2_bytes(model, x, dynamic_size)
        run, runtime, input_shape, output_shape = _runner(fmt, payload)
        checks = _check(model, run, size, dynamic_size)
    worst = max(checks, key=lambda c: c.max_rel_err if c.max_rel_err == c.max_rel_err else float('inf'))
    if not worst.max_rel_err <= tol:  # NaN fails too
        raise ExportMismatchError(
            f'the exported model differs from PyTorch: max rel err {worst.max_rel_err:.2g} at batch {worst.batch}, '
            f'{worst.height}x{worst.width} ({runtime}; tolerance {tol:g}); nothing written')
    try:
        with atomic_open(path, 'wb') as f:
            f.write(payload)
    except OSError as e:
        raise TcnnError(f'cannot write {path}: {e.strerror or e}') from e
    return ExportReport(path, fmt, exporter if fmt == 'onnx' else 'torch.export', opset if fmt == 'onnx' else None,
                        input_shape, output_shape, runtime, checks, float(tol), len(payload),
                        time.perf_counter() - start)
