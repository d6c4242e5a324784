"""Export a model for deployment, checked against PyTorch, in the runtime that reads it, before the file is written.

Four formats, chosen by the output's extension: ``.onnx`` (checked in onnxruntime), ``.pt2`` (``torch.export``'s
archive, checked with ``torch.export.load``; with ``aoti`` an AOTInductor package, checked with its input checks on,
at sizes with odd stage inputs too), ``.pte`` (ExecuTorch with the XNNPACK backend, batch 1, checked in ExecuTorch's
runtime). All but ``.pte`` take a dynamic batch, and with ``dynamic_size`` a dynamic height and width. The exported
model is run against the PyTorch model on the same random inputs (batch 1 and 5); the file is written (atomically)
only when the largest logit error, relative to the largest logit as in ``tcnn.check_equivalence``, is within
tolerance. A model that computes non-finite logits is refused before exporting.

The ONNX exporters (torch 2.15, onnxruntime 1.32; docs/export.md has the measurements):

* ``'dynamo'`` (default): ``torch.export`` then the torch.export-based ONNX exporter, opsets 18 and later (it writes
  no earlier opset: asked for one, it writes 18). Torch's default exporter since 2.9; tcnn uses it from torch 2.8
  (``tcnn.compat``; ``'torchscript'`` before).
* ``'torchscript'``: the legacy tracing exporter, opsets 13 to 20 (13: GPSA's ``unflatten``; 20: the exporter's
  newest). Deprecated by torch, kept for runtimes that need an opset below 18.

Both export every family T-CNNs are made from (ResNet, ResNeXt, RegNet, ConvNeXt, EfficientNet, MobileNetV3,
byobnet, torchvision) because a depthwise GPSA layer switches to a plain-op form of its product while an exporter
traces it (``tcnn.layers.depthwise.attend_traceable``): the eager product picks its order and chunk plan from the batch
size, which ``torch.export`` turns into guards that fix the batch, and its small-shape order uses ``linalg.vecdot``,
which has no ONNX form in the TorchScript exporter.
"""
import collections
import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import compat, data
from .atomic import atomic_open
from .convert.verify import eval_mode, output_errors
from .errors import (InvalidArgumentError, InvalidTypeError, TcnnError, check_module, check_number, check_size,
                     first_line)
from .files.integrity import check_finite_outputs
from .paths import check_output_file
from .version import EXPORT_EXTENSIONS, __version__

__all__ = ['export', 'ExportReport', 'ExportCheck', 'ExportMismatchError', 'EXPORTERS', 'OPSETS', 'DEFAULT_OPSETS',
           'ONNX_EXTRA', 'EXECUTORCH_EXTRA', 'AOTI_CHECK_ENV', 'check_export_options', 'require_onnx',
           'require_executorch', 'onnx_session', 'load_aoti', 'backbone_trunk']

EXPORTERS = ('dynamo', 'torchscript')
# The opsets each ONNX exporter writes for a T-CNN (inclusive): the dynamo exporter's translations start at opset 18
# (asked for less, it silently writes 18); the TorchScript exporter's GPSA needs opset 13 (unflatten) and it stops at
# 20. The dynamo exporter's upper end is torch's; the written opset is compared with the one asked for anyway.
OPSETS = {'dynamo': (18, None), 'torchscript': (13, 20)}
# Defaults: the oldest opset each exporter writes, which the most runtimes read (onnxruntime >= 1.14, TensorRT >= 8.6)
DEFAULT_OPSETS = {'dynamo': 18, 'torchscript': 17}
ONNX_EXTRA = "pip install 'tcnn[onnx]'"
EXECUTORCH_EXTRA = "pip install 'tcnn[executorch]'"
# AOTInductor compiles its input checks (dtype, device, every static size, the bounds of dynamic ones) into every
# package, but runs them only when this variable is set (not '0') when the package first runs: torch 2.15 has no
# switch at compile time. tcnn's check and tcnn.export.load_aoti set it.
AOTI_CHECK_ENV = 'AOTI_RUNTIME_CHECK_INPUTS'
# With a dynamic size, the AOTInductor check also runs at these offsets from the traced size (batch 2): sizes whose
# stage inputs are odd, which a ceil_mode pooling (ResNet-D's shortcut) meets and AOTInductor once computed wrongly.
AOTI_SIZE_OFFSETS = (-16, -8, 1, 16)
CHECK_BATCHES = (1, 5)
# The example batch of the trace: torch.export specialises sizes 0 and 1, and 1 hides a batch baked into a reshape.
TRACE_BATCH = 2
# With a dynamic size, the check also runs at the traced size + 32 (one more token per row and column of a stride-32
# last stage) at this batch.
SIZE_STEP = 32
SIZE_CHECK_BATCH = 2
# ExecuTorch (1.5.1) runs a T-CNN or its CNN lowered with a dynamic batch at the traced batch only (another fails in
# the runtime: "Attempted to resize a static tensor"): a .pte program takes batch 1, the on-device case
PTE_BATCH = 1
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


def check_export_options(path: str, exporter: str = 'dynamo', opset: Optional[int] = None,
                         aoti: bool = False, dynamic_size: bool = False) -> str:
    """The format of ``path``: ``'onnx'``, ``'pt2'`` (a ``torch.export`` archive), ``'aoti'`` (``.pt2`` with
    ``aoti``: an AOTInductor package) or ``'pte'`` (ExecuTorch), by its extension, which ``check_output_file`` has
    checked, after checking that the exporter and opset make sense for it; one-line ``TcnnError``s otherwise (named
    as on the command line)."""
    if exporter not in EXPORTERS:
        raise InvalidArgumentError(f'exporter must be one of {", ".join(EXPORTERS)}, got {exporter!r}')
    fmt = os.path.splitext(str(path))[1].lower().lstrip('.')
    if aoti and fmt != 'pt2':
        raise InvalidArgumentError('--aoti compiles an AOTInductor package, a .pt2 file: give --out NAME.pt2')
    if fmt == 'pte' and dynamic_size:
        raise InvalidArgumentError('--dynamic-size: a .pte program (ExecuTorch) takes batch 1 at the traced size only; '
                                   'export one per input size')
    if fmt != 'onnx':
        if opset is not None:
            raise InvalidArgumentError(f'--opset applies to .onnx files; a .{fmt} file has no opset')
        fmt = 'aoti' if aoti else fmt
    elif opset is not None:
        check_number(opset, '--opset', ge=1, integer=True)
        if not _writes(exporter, opset):
            other = next(e for e in EXPORTERS if e != exporter)
            hint = f'; --exporter {other} writes it' if _writes(other, opset) else ''
            raise InvalidArgumentError(f'--opset {opset}: the {exporter} exporter writes opsets '
                                       f'{_opsets_text(exporter)}{hint}')
    _require_torch(fmt, exporter, dynamic_size)
    return fmt


def _require_torch(fmt: str, exporter: str, dynamic_size: bool) -> None:
    """One line naming the torch that an export needs where the installed one is older (``tcnn.compat``)."""
    if fmt == 'onnx' and exporter == 'dynamo':
        compat.require_torch(compat.DYNAMO_ONNX_TORCH, 'the dynamo ONNX exporter (the default)',
                             ', or --exporter torchscript')
    if fmt == 'aoti':
        compat.require_torch(compat.AOTI_TORCH, '--aoti (an AOTInductor package)', ', or a .pt2 without --aoti')
    if dynamic_size:
        compat.require_torch(compat.DYNAMIC_SIZE_TORCH, '--dynamic-size', ', or a fixed size per export')


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


def require_executorch() -> None:
    """Raise one line naming the ``executorch`` extra when ExecuTorch (its exporter and runtime) is missing."""
    try:
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
    except ImportError as e:
        raise TcnnError(f'exporting to ExecuTorch (.pte) needs executorch (to lower the model and to check it in '
                        f'ExecuTorch\'s runtime; {first_line(e)}): {EXECUTORCH_EXTRA}') from e


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


def _torch_export(model: nn.Module, x: torch.Tensor, dynamic_size: bool,
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
    compat.rename_onnx_axes(onnx_program, {shape[axis].value: name for axis, name in
                                           _dynamic_axes(dynamic_size).items() if not isinstance(shape[axis], int)})
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


# ------------------------------------------------------------------------------------------------- AOTInductor


class _FloorModePool2d(nn.Module):
    """A ``ceil_mode`` max or average pooling as explicit padding and a floor-mode pooling: the same output (to float
    rounding), as AOTInductor computes it right under a dynamic size. AOTInductor in torch 2.15 sizes a ``ceil_mode``
    pooling's output by flooring when the input size is symbolic: at an odd size (5 px into ResNet-D's 2x2/2 shortcut
    pooling: 2 px out instead of 3) the rest of the network reads memory the package never wrote (garbage or NaN).

    Only for poolings whose last window never starts in the right padding (``padding <= kernel - stride``, e.g. 2x2/2
    unpadded, 3x3/2 padded by 1): PyTorch drops such a window, a rule that would make the output size depend on a
    comparison of sizes, which ``torch.export`` would turn into a guard."""

    def __init__(self, pool: nn.Module) -> None:
        super().__init__()
        self.is_max = isinstance(pool, nn.MaxPool2d)
        pair = nn.modules.utils._pair
        self.kernel, self.stride, self.padding = pair(pool.kernel_size), pair(pool.stride or pool.kernel_size), \
            pair(pool.padding)
        self.dilation = pair(pool.dilation) if self.is_max else (1, 1)
        self.count_include_pad = not self.is_max and pool.count_include_pad

    @staticmethod
    def replaces(pool: nn.Module) -> bool:
        if type(pool) not in (nn.AvgPool2d, nn.MaxPool2d) or not pool.ceil_mode:  # subclasses (timm's *Same) pad
            return False
        if isinstance(pool, nn.MaxPool2d) and pool.return_indices or \
                isinstance(pool, nn.AvgPool2d) and pool.divisor_override is not None:
            return False
        pair = nn.modules.utils._pair
        k, st, p = pair(pool.kernel_size), pair(pool.stride or pool.kernel_size), pair(pool.padding)
        d = pair(pool.dilation) if isinstance(pool, nn.MaxPool2d) else (1, 1)
        return all(p[i] <= d[i] * (k[i] - 1) + 1 - st[i] for i in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ceil mode has ceil((L + 2p - k_eff) / s) + 1 windows: floor mode gets as many when the right end is padded by
        # p + e (e: the last window's reach past the right padding)
        pads, extensions = [], []
        for size, k, s, p, d in zip((x.shape[-1], x.shape[-2]), self.kernel[::-1], self.stride[::-1],
                                    self.padding[::-1], self.dilation[::-1]):
            k_eff = d * (k - 1) + 1
            windows = (size + 2 * p - k_eff + s - 1) // s + 1
            extension = (windows - 1) * s + k_eff - size - 2 * p
            pads += [p, p + extension]
            extensions += [0, extension]
        if self.is_max:
            return F.max_pool2d(F.pad(x, pads, value=float('-inf')), self.kernel, self.stride, 0, self.dilation)
        # each window's sum over the number of elements PyTorch counts there: the real ones, with count_include_pad
        # the padding's too, never the extension (a ceil-mode window counts only what input and padding cover)
        total = F.avg_pool2d(F.pad(x, pads), self.kernel, self.stride, 0, divisor_override=1)
        ones = x.new_ones((1, 1) + tuple(x.shape[-2:]))
        if self.count_include_pad:
            counted = F.pad(F.pad(ones, [pads[0], pads[0], pads[2], pads[2]], value=1.0), extensions)
        else:
            counted = F.pad(ones, pads)
        return total / F.avg_pool2d(counted, self.kernel, self.stride, 0, divisor_override=1)


def _floor_mode_pools(model: nn.Module) -> nn.Module:
    """``model``, or a copy of it with its ``ceil_mode`` poolings in floor-mode form (``_FloorModePool2d``)."""
    names = [name for name, m in model.named_modules() if _FloorModePool2d.replaces(m)]
    if not names:
        return model
    model = copy.deepcopy(model)
    for name in names:
        parent, _, attr = name.rpartition('.')
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, _FloorModePool2d(getattr(owner, attr)))
    return model


def _aoti_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> Tuple[bytes, Tuple[Tuple, Tuple]]:
    """An AOTInductor package (``.pt2``) of ``model``, with tcnn's metadata compiled in (``get_metadata()``), and the
    input and output shapes of the program it was compiled from."""
    program = _torch_export(_floor_mode_pools(model), x, dynamic_size)
    with tempfile.TemporaryDirectory(prefix='tcnn-aoti-') as folder:
        path = os.path.join(folder, 'model.pt2')
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=path, inductor_configs={
                    'aot_inductor.metadata': {METADATA_KEY: _metadata(model)},
                    # torch.export gives a traced batch of 2 the range [2, inf) (it specialises 0 and 1): checked, the
                    # lower bounds would refuse batch 1 (and the size's lower bound, e.g. 33 px, goes unchecked)
                    'aot_inductor.check_lowerbound': False})
        except Exception as e:  # a missing C++ compiler, an op inductor cannot lower, ...
            raise TcnnError(f'AOTInductor cannot compile this model: {_first_line(e)}') from e
        with open(path, 'rb') as f:
            return f.read(), _program_shapes(program.graph_module)


def load_aoti(path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load an AOTInductor package (``export(..., aoti=True)``) with its input checks on: a wrong input (size,
    channels, dtype, device) raises instead of computing garbage. ``torch._inductor.aoti_load_package(path)`` after
    setting ``AOTI_RUNTIME_CHECK_INPUTS=1`` for this process (the compiled code reads it once, at its first call)."""
    os.environ[AOTI_CHECK_ENV] = '1'
    try:
        return torch._inductor.aoti_load_package(os.fspath(path))
    except Exception as e:
        raise TcnnError(f'{path}: cannot load the AOTInductor package: {_first_line(e)}') from e


def _aoti_runner(payload: bytes, folder: str) -> Callable[[torch.Tensor], torch.Tensor]:
    path = os.path.join(folder, 'model.pt2')
    with open(path, 'wb') as f:
        f.write(payload)
    compiled = load_aoti(path)

    def run_aoti(x: torch.Tensor) -> torch.Tensor:
        return compiled(x)

    return run_aoti


def _check_refuses(run: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int, int], dynamic_size: bool,
                   runtime: str, static_batch: bool = False) -> None:
    """The exported model raises on an input it was not made for (one more channel; with a static size, 32 px more;
    with ``static_batch``, one more image) instead of computing garbage."""
    c, h, w = size
    wrong = (1, c + 1, h, w) if dynamic_size else (1, c, h + SIZE_STEP, w + SIZE_STEP)
    if static_batch:
        wrong = (PTE_BATCH + 1, c, h, w)
    try:
        with _native_output_dropped():  # the runtimes print their refusal too
            run(torch.zeros(wrong))
    except Exception:
        return
    raise ExportMismatchError(f'the exported model ({runtime}) runs a {"x".join(map(str, wrong))} input it was not '
                              'made for instead of refusing it; nothing written')


# ------------------------------------------------------------------------------------------------- ExecuTorch


def _pte_bytes(model: nn.Module, x: torch.Tensor, dynamic_size: bool) -> Tuple[bytes, Tuple[Tuple, Tuple]]:
    """An ExecuTorch program (``.pte``), lowered to the XNNPACK backend (ExecuTorch's CPU backend) where it can, and
    the input and output shapes of the ``torch.export`` program it was lowered from."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    program = _torch_export(model, x[:PTE_BATCH], dynamic_size, dynamic_batch=False)
    try:
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as e:
        raise TcnnError(f'ExecuTorch cannot lower this model: {_first_line(e)}') from e
    return lowered.buffer, _program_shapes(program.graph_module)


def _pte_runner(payload: bytes) -> Tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    import executorch
    from executorch.runtime import Runtime
    try:
        method = Runtime.get().load_program(payload).load_method('forward')
    except Exception as e:
        raise TcnnError(f'ExecuTorch\'s runtime cannot load the lowered program: {_first_line(e)}') from e

    def run_pte(x: torch.Tensor) -> torch.Tensor:
        return method.execute([x.contiguous()])[0]

    version = getattr(executorch, '__version__', None) or _distribution_version('executorch')
    return run_pte, f'executorch.runtime {version}'


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return '?'


def _shape_of(value: Any) -> Tuple[Union[int, str], ...]:
    """An onnxruntime input/output shape, with symbolic axes by name."""
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape)


def _runner(fmt: str, payload: bytes, folder: str, shapes: Optional[Tuple[Tuple, Tuple]] = None
            ) -> Tuple[Callable[[torch.Tensor], torch.Tensor], str, Tuple, Tuple]:
    """A function running the exported model, the runtime's name, and the input and output shapes (for AOTInductor
    and ExecuTorch, ``shapes``: those of the ``torch.export`` program they were compiled from; ``folder``: where a
    runtime that reads files only may put one)."""
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
    if fmt in ('aoti', 'pte'):
        run, runtime = (_aoti_runner(payload, folder), 'AOTInductor (input checks on)') if fmt == 'aoti' else \
            _pte_runner(payload)
        return run, runtime, shapes[0], shapes[1]
    module = torch.export.load(io.BytesIO(payload)).module()

    def run_pt2(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(x)

    return (run_pt2, 'torch.export.load') + _program_shapes(module)


def _program_shapes(module: torch.fx.GraphModule) -> Tuple[Tuple[Union[int, str], ...], Tuple[Union[int, str], ...]]:
    """The input and output shapes of a traced program, with symbolic axes by name."""
    axes = _dynamic_axes(True)

    def shape(t: torch.Tensor) -> Tuple[Union[int, str], ...]:
        return tuple(axes.get(i, n) if isinstance(n, torch.SymInt) else int(n) for i, n in enumerate(t.shape))

    placeholders = [n for n in module.graph.nodes if n.op == 'placeholder' and 'val' in n.meta]
    out = next(n for n in module.graph.nodes if n.op == 'output').args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    return shape(placeholders[-1].meta['val']), shape(out.meta['val'])


def _check(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], size: Tuple[int, int, int],
           dynamic_size: bool, odd_sizes: bool = False, batches: Sequence[int] = CHECK_BATCHES) -> List[ExportCheck]:
    """Logits of the exported model against PyTorch's, on the same random inputs: ``batches`` (1 and 5) at ``size``,
    with a dynamic size also batch 2 at a larger one (and with ``odd_sizes`` at the ``AOTI_SIZE_OFFSETS`` too)."""
    c, height, width = size
    cases = [(b, height, width) for b in batches]
    if dynamic_size:
        offsets = (SIZE_STEP,) + (AOTI_SIZE_OFFSETS if odd_sizes else ())
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
            raise ExportMismatchError(f'the exported model fails on a {b}x{c}x{h}x{w} input: {_first_line(e)}; '
                                      'nothing written') from e
        if out.shape != reference.shape:
            raise ExportMismatchError(f'the exported model gives logits of shape {tuple(out.shape)} for a '
                                      f'{b}x{c}x{h}x{w} input, PyTorch {tuple(reference.shape)}; nothing written')
        max_abs, max_rel, _ = output_errors(reference, out)
        checks.append(ExportCheck(b, h, w, max_abs, max_rel))
    return checks


def backbone_trunk(model: nn.Module) -> nn.Module:
    """The ResNet of a torchvision detection or segmentation model as one image -> features module: the children of
    its ``IntermediateLayerGetter`` (``backbone.body``, ``backbone``) in order, up to the last stage it returns, whose
    features it outputs; the same parameters (no copy), and the model's ``tcnn_*`` records and data config."""
    from torchvision.models._utils import IntermediateLayerGetter
    backbone = getattr(model, 'backbone', None)
    body = getattr(backbone, 'body', backbone)
    if not isinstance(body, IntermediateLayerGetter):
        raise TcnnError(f'{type(model).__name__} has no torchvision backbone (backbone.body or backbone, an '
                        'IntermediateLayerGetter) to export')
    trunk = nn.Sequential(collections.OrderedDict(body.named_children()))
    for key in ('tcnn_source', 'tcnn_config', 'pretrained_cfg'):
        if getattr(model, key, None) is not None:
            setattr(trunk, key, getattr(model, key))
    return trunk.train(model.training)


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
    start = time.perf_counter()
    check_module(model, 'model')
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'path must be a file path, got {type(path).__name__}')
    path = check_output_file(os.fspath(path), 'path', EXPORT_EXTENSIONS)  # the format too, by extension
    fmt = check_export_options(path, exporter, opset, aoti, dynamic_size)
    check_number(tol, 'tol', gt=0)
    if fmt == 'onnx':
        require_onnx(exporter)
        opset = DEFAULT_OPSETS[exporter] if opset is None else int(opset)
    elif fmt == 'pte':
        require_executorch()
    _check_model(model)
    size = check_size(input_size, 'input_size', 3) if input_size is not None else \
        tuple(data.data_config(model)['input_size'])
    x = torch.randn(TRACE_BATCH, *size, generator=torch.Generator().manual_seed(0))
    with eval_mode(model), torch.no_grad(), _quiet_loggers(), tempfile.TemporaryDirectory(prefix='tcnn-') as folder:
        # a model that computes NaN would fail the check below as if the exporter were wrong
        check_finite_outputs(model(x), model, f'cannot export {type(model).__name__}')
        shapes = None
        if fmt == 'onnx':
            payload = _onnx_bytes(model, x, exporter, opset, dynamic_size)
        elif fmt == 'pt2':
            payload = _pt2_bytes(model, x, dynamic_size)
        else:
            payload, shapes = (_aoti_bytes if fmt == 'aoti' else _pte_bytes)(model, x, dynamic_size)
        run, runtime, input_shape, output_shape = _runner(fmt, payload, folder, shapes)
        checks = _check(model, run, size, dynamic_size, odd_sizes=fmt == 'aoti',
                        batches=(PTE_BATCH,) * 2 if fmt == 'pte' else CHECK_BATCHES)
        if fmt in ('aoti', 'pte'):
            _check_refuses(run, size, dynamic_size, runtime, fmt == 'pte')
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
    how = {'onnx': exporter, 'aoti': 'torch.export + AOTInductor', 'pte': 'torch.export + ExecuTorch (XNNPACK)'}
    return ExportReport(path, fmt, how.get(fmt, 'torch.export'), opset if fmt == 'onnx' else None,
                        input_shape, output_shape, runtime, checks, float(tol), len(payload),
                        time.perf_counter() - start)
