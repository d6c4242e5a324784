"""ONNX files (``.onnx``), checked in onnxruntime.

Two exporters (torch 2.15, onnxruntime 1.32; docs/export.md has the measurements):

* ``'dynamo'`` (default): ``torch.export`` then the torch.export-based ONNX exporter, opsets 18 and later (it writes
  no earlier opset: asked for one, it writes 18). Torch's default exporter since 2.9; tcnn uses it from torch 2.8
  (``tcnn.compat``; ``'torchscript'`` before).
* ``'torchscript'``: the legacy tracing exporter, opsets 13 to 20 (13: GPSA's ``unflatten``; 20: the exporter's
  newest). Deprecated by torch, kept for runtimes that need an opset below 18.

Either way the symbolic axes are named ``batch`` (and ``height``, ``width``), the written opset is the one asked for
(the dynamo exporter falls back to another without failing), and tcnn's metadata goes into ``metadata_props``.
"""
import contextlib
import io
import warnings
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from .. import compat
from ..errors import TcnnError
from .checks import Runtime, Shape
from .metadata import INPUT_NAME, METADATA_KEY, OUTPUT_NAME, dynamic_axes, metadata_json
from .quiet import error_line, native_output_dropped
from .torch_export import trace

__all__ = ['export_bytes', 'onnx_session', 'runner']


def _dynamo(model: nn.Module, x: torch.Tensor, opset: int, dynamic_size: bool) -> Any:
    program = trace(model, x, dynamic_size)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # progress lines
            onnx_program = torch.onnx.export(program, (x,), dynamo=True, opset_version=opset, verbose=False,
                                             input_names=[INPUT_NAME], output_names=[OUTPUT_NAME])
    except Exception as e:
        raise TcnnError(f'the dynamo ONNX exporter cannot export this model at opset {opset}: {error_line(e)}') from e
    shape = onnx_program.model.graph.inputs[0].shape  # symbolic axes as the names the TorchScript exporter gives
    compat.rename_onnx_axes(onnx_program, {shape[axis].value: name for axis, name in
                                           dynamic_axes(dynamic_size).items() if not isinstance(shape[axis], int)})
    return onnx_program.model_proto


def _torchscript(model: nn.Module, x: torch.Tensor, opset: int, dynamic_size: bool) -> Any:
    import onnx
    buffer = io.BytesIO()
    axes = dynamic_axes(dynamic_size)
    try:
        with warnings.catch_warnings(), native_output_dropped():
            warnings.simplefilter('ignore', DeprecationWarning)  # the legacy exporter, chosen knowingly
            torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=opset, input_names=[INPUT_NAME],
                              output_names=[OUTPUT_NAME], dynamic_axes={INPUT_NAME: axes, OUTPUT_NAME: {0: 'batch'}})
    except Exception as e:
        raise TcnnError(f'the torchscript ONNX exporter cannot export this model at opset {opset}: '
                        f'{error_line(e)}') from e
    return onnx.load_from_string(buffer.getvalue())


def export_bytes(model: nn.Module, x: torch.Tensor, exporter: str, opset: int, dynamic_size: bool) -> bytes:
    """The ONNX model as bytes, with tcnn's metadata; checks the written opset (the dynamo exporter falls back to
    another without failing)."""
    fn = _dynamo if exporter == 'dynamo' else _torchscript
    proto = fn(model, x, opset, dynamic_size)
    written = next((o.version for o in proto.opset_import if o.domain in ('', 'ai.onnx')), None)
    if written != opset:
        raise TcnnError(f'--opset {opset}: the {exporter} exporter could not convert this model to opset {opset} (it '
                        f'wrote opset {written}); use a lower opset')
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata_json(model)
    try:
        return proto.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        raise TcnnError(f'the ONNX model is too large for one file ({error_line(e)})') from e


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


def _shape_of(value: Any) -> Shape:
    """An onnxruntime input/output shape, with symbolic axes by name."""
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape)


def runner(payload: bytes) -> Runtime:
    """The ONNX model loaded in an onnxruntime CPU session."""
    import onnxruntime as ort
    try:
        session = onnx_session(payload)
    except Exception as e:
        raise TcnnError(f'onnxruntime {ort.__version__} cannot load the exported model: {error_line(e)}') from e

    def run_onnx(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])

    return Runtime(run_onnx, f'onnxruntime {ort.__version__}', _shape_of(session.get_inputs()[0]),
                   _shape_of(session.get_outputs()[0]))
