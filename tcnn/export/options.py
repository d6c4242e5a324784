"""The options of an export, checked once before any work: the format (by the output's extension), the ONNX exporter
and opset, the tolerance, and what the format needs installed (a later torch, onnxruntime, ExecuTorch).

``tcnn.export.export`` runs ``check_export_options`` first; ``tcnn export`` runs it before it reads the model and then
exports with the options it returns (``export_checked``), so a mistake costs no model load and no export, and nothing
is checked twice. Nothing here imports torch until the options themselves are valid: an argument error of ``tcnn
export`` answers without the seconds that import takes.
"""
import dataclasses
import os
from typing import Optional, Tuple

from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number, first_line
from ..paths import check_output_file
from ..version import EXPORT_EXTENSIONS

__all__ = ['EXPORTERS', 'OPSETS', 'DEFAULT_OPSETS', 'ONNX_EXTRA', 'EXECUTORCH_EXTRA', 'ExportOptions',
           'check_export_options', 'require_onnx', 'require_executorch']

EXPORTERS = ('dynamo', 'torchscript')
# The opsets each ONNX exporter writes for a T-CNN (inclusive): the dynamo exporter's translations start at opset 18
# (asked for less, it silently writes 18); the TorchScript exporter's GPSA needs opset 13 (unflatten) and it stops at
# 20. The dynamo exporter's upper end is torch's; the written opset is compared with the one asked for anyway.
OPSETS = {'dynamo': (18, None), 'torchscript': (13, 20)}
# Defaults: the oldest opset each exporter writes, which the most runtimes read (onnxruntime >= 1.14, TensorRT >= 8.6)
DEFAULT_OPSETS = {'dynamo': 18, 'torchscript': 17}
ONNX_EXTRA = "pip install 'tcnn[onnx]'"
EXECUTORCH_EXTRA = "pip install 'tcnn[executorch]'"


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What ``check_export_options`` accepted: where an export goes and how it is made and checked."""
    path: str  # absolute
    format: str  # 'onnx', 'pt2' (a torch.export archive), 'aoti' (an AOTInductor package) or 'pte' (ExecuTorch)
    exporter: str  # the ONNX exporter, 'dynamo' or 'torchscript' (unused by the other formats)
    opset: Optional[int]  # the ONNX opset (DEFAULT_OPSETS[exporter] when not given); None for the other formats
    dynamic_size: bool  # height and width dynamic too, not only the batch
    tol: float  # largest accepted logit error relative to the largest logit


def check_export_options(path: str, exporter: str = 'dynamo', opset: Optional[int] = None, aoti: bool = False,
                         dynamic_size: bool = False, tol: float = 1e-4,
                         names: Tuple[str, str] = ('path', 'tol')) -> ExportOptions:
    """Check an export's options before any work; the arguments are those of ``tcnn.export.export``.

    In order: ``path`` can be written and its extension names a format (``EXPORT_EXTENSIONS``); the exporter, opset,
    ``aoti`` and ``dynamic_size`` make sense for that format; ``tol`` is positive; the installed torch can make the
    export and the packages the format's export and check need are installed. Only the last two import anything
    heavy (torch, onnxruntime, ExecuTorch).

    Args:
        names: How ``path`` and ``tol`` are named in messages (``tcnn export``: ``('--out', '--tol')``); the other
            options are named as on the command line, ``--opset``, ``--aoti``, ``--dynamic-size``.

    Raises:
        TcnnError: One line naming the fix (a missing package names its extra, ``pip install 'tcnn[onnx]'``).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'{names[0]} must be a file path, got {type(path).__name__}')
    path = check_output_file(os.fspath(path), names[0], EXPORT_EXTENSIONS)
    if exporter not in EXPORTERS:
        raise InvalidArgumentError(f'exporter must be one of {", ".join(EXPORTERS)}, got {exporter!r}')
    fmt = os.path.splitext(path)[1].lower().lstrip('.')
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
    check_number(tol, names[1], gt=0)
    _require_torch(fmt, exporter, dynamic_size)
    if fmt == 'onnx':
        require_onnx(exporter)
        opset = DEFAULT_OPSETS[exporter] if opset is None else int(opset)
    elif fmt == 'pte':
        require_executorch()
    return ExportOptions(path, fmt, exporter, opset, bool(dynamic_size), float(tol))


def _require_torch(fmt: str, exporter: str, dynamic_size: bool) -> None:
    """One line naming the torch that an export needs where the installed one is older (``tcnn.compat``)."""
    from .. import compat  # imports torch: only once the options are valid
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
