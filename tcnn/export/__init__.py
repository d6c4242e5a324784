"""Export a model for deployment, checked against PyTorch, in the runtime that reads it, before the file is written.

Four formats, chosen by the output's extension: ``.onnx`` (checked in onnxruntime), ``.pt2`` (``torch.export``'s
archive, checked with ``torch.export.load``; with ``aoti`` an AOTInductor package, checked with its input checks on,
at sizes with odd stage inputs too), ``.pte`` (ExecuTorch with the XNNPACK backend, batch 1, checked in ExecuTorch's
runtime). All but ``.pte`` take a dynamic batch, and with ``dynamic_size`` a dynamic height and width. The exported
model is run against the PyTorch model on the same random inputs (batch 1 and 5); the file is written (atomically)
only when the largest logit error, relative to the largest logit as in ``tcnn.check_equivalence``, is within
tolerance.

Every family T-CNNs are made from exports (ResNet, ResNeXt, RegNet, ConvNeXt, EfficientNet, MobileNetV3, byobnet,
torchvision) because a depthwise GPSA layer switches to a plain-op form of its product while an exporter traces it
(``tcnn.layers.depthwise.attend_traceable``): the eager product picks its order and chunk plan from the batch size,
which ``torch.export`` turns into guards that fix the batch, and its small-shape order uses ``linalg.vecdot``, which
has no ONNX form in the TorchScript exporter.

One concept per module: ``options`` (the options, checked once, torch-free until valid), ``pipeline`` (``export``),
``onnx``, ``torch_export``, ``aoti`` and ``executorch`` (one format each), ``pooling`` (AOTInductor's ``ceil_mode``
pooling rewrite), ``checks`` (the comparison with PyTorch), ``metadata`` (names and tcnn's record in the file),
``quiet`` (what exporters print, reduced to one line), ``backbone`` (a detection or segmentation model's exportable
part). This package's names below load their module on first use (PEP 562): ``tcnn export`` checks its options
without importing torch.
"""
import importlib
from typing import Any, List

__all__ = ['export', 'export_checked', 'check_export_options', 'ExportOptions', 'ExportReport', 'ExportCheck',
           'ExportMismatchError', 'load_aoti', 'backbone_trunk', 'onnx_session', 'INPUT_NAME', 'OUTPUT_NAME',
           'METADATA_KEY', 'AOTI_CHECK_ENV']

# public name -> the submodule that defines it
_LAZY = {
    'export': 'pipeline', 'export_checked': 'pipeline', 'ExportReport': 'pipeline',
    'check_export_options': 'options', 'ExportOptions': 'options',
    'ExportCheck': 'checks', 'ExportMismatchError': 'checks',
    'load_aoti': 'aoti', 'AOTI_CHECK_ENV': 'aoti',
    'backbone_trunk': 'backbone',
    'onnx_session': 'onnx',
    'INPUT_NAME': 'metadata', 'OUTPUT_NAME': 'metadata', 'METADATA_KEY': 'metadata',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f'{__name__}.{_LAZY[name]}'), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
