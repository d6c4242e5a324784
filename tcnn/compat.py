"""What tcnn needs from torch that its oldest supported release lacks: one stand-in per missing function, here only.

tcnn supports torch >= 2.5 (``MIN_TORCH``; CI runs the conversion, GPSA, file, timm-model, export and training tests
on torch 2.5.1 and the full suite on the newest torch). Importing this module on an older torch raises a one-line
``TcnnError`` naming the fix, before any feature is used, so that a missing torch function is never reported as
something else (a file that does not load, a model that does not convert).
"""
import re
import sys
from typing import Any, Dict, Tuple

import torch

from .errors import TcnnError

__all__ = ['MIN_TORCH', 'DYNAMO_ONNX_TORCH', 'DYNAMIC_SIZE_TORCH', 'AOTI_TORCH', 'torch_version', 'require_torch',
           'is_exporting', 'is_dtensor', 'rename_onnx_axes', 'rename_ir_axes']

MIN_TORCH = (2, 5)


def torch_version() -> Tuple[int, int]:
    """(major, minor) of the installed torch."""
    major, minor = re.match(r'(\d+)\.(\d+)', torch.__version__).groups()
    return int(major), int(minor)


def require_torch(version: Tuple[int, int], what: str, alternative: str = '') -> None:
    """Raise a one-line ``TcnnError`` saying that ``what`` needs torch >= ``version`` (and what else works:
    ``alternative``) where the installed torch is older."""
    if torch_version() < version:
        raise TcnnError(f'{what} needs torch >= {version[0]}.{version[1]} (this is {torch.__version__}): '
                        f"pip install -U 'torch>={version[0]}.{version[1]}' torchvision{alternative}")


require_torch(MIN_TORCH, 'tcnn')

# What works from a later torch than MIN_TORCH only (tcnn.export refuses it in one line before; checked on torch 2.5,
# 2.6, 2.8): the dynamo ONNX exporter of torch 2.5 fails inside torch on a dynamic batch, and that of 2.6 and 2.7 needs
# an onnxscript of its time (the newest fails in batch norm); torch 2.5's torch.export cannot make height and width
# dynamic besides the batch; AOTInductor packages need aot_inductor.check_lowerbound (torch 2.10) to take batch 1.
DYNAMO_ONNX_TORCH = (2, 8)
DYNAMIC_SIZE_TORCH = (2, 6)
AOTI_TORCH = (2, 10)

if hasattr(torch.compiler, 'is_exporting'):  # torch >= 2.7
    is_exporting = torch.compiler.is_exporting
else:
    def is_exporting() -> bool:
        """Whether ``torch.export`` records the forward. Before torch 2.7 torch says only that torch.export or
        torch.compile does (``is_compiling``): both then get what an exporter needs (plain-op forms that hold at every
        batch size), which equal the eager forms up to float rounding."""
        return torch.compiler.is_compiling()


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a ``torch.distributed.tensor.DTensor`` (the parameters of FSDP2's ``fully_shard`` and of
    tensor parallelism; public since torch 2.5). A DTensor exists only once its module is imported, so this imports
    nothing (0.3 s on first import) and is False on a torch built without distributed support."""
    module = sys.modules.get('torch.distributed.tensor')
    return module is not None and isinstance(tensor, getattr(module, 'DTensor', ()))


def rename_onnx_axes(onnx_program: Any, names: Dict[str, str]) -> None:
    """Rename the symbolic axes of a ``torch.onnx.export(..., dynamo=True)`` program in place (``names``: old name ->
    new name): ``ONNXProgram.rename_axes`` from torch 2.11, ``rename_ir_axes`` on the program's ONNX IR before."""
    if hasattr(onnx_program, 'rename_axes'):
        onnx_program.rename_axes(names)
    else:
        rename_ir_axes(onnx_program.model, names)


def rename_ir_axes(model: Any, names: Dict[str, str]) -> None:
    """``ONNXProgram.rename_axes`` of torch 2.11 on an ONNX IR model (``onnx_ir``): every value of the graph and
    its functions, the names inside shape expressions (``2*s0``) too, the longest first."""
    from onnxscript import ir
    longest_first = sorted(names.items(), key=lambda item: len(item[0]), reverse=True)

    def renamed(dim: Any) -> Any:
        if not isinstance(dim, ir.SymbolicDim):
            return dim
        if dim.value is None or dim.value in names:
            return names.get(dim.value)
        text = dim.value
        for old, new in longest_first:
            text = re.sub(rf'(?<!\w){re.escape(old)}(?!\w)', new, text)
        return text

    values = [*model.graph.inputs, *model.graph.initializers.values()]
    for graph in (model.graph, *model.functions.values()):
        values += [*(graph.inputs if graph is not model.graph else ()),
                   *(v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs)]
    for value in values:
        if value.shape is not None:
            dims = [renamed(dim) for dim in value.shape]
            if any(isinstance(dim, ir.SymbolicDim) and dim.value != new for dim, new in zip(value.shape, dims)):
                value.shape = ir.Shape(dims)
