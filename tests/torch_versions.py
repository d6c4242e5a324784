"""Skip markers for features that tcnn supports from a later torch than its oldest one (``tcnn.compat``): they skip
on an older torch only, saying which torch they need."""
import pytest
import torch

from tcnn import compat


def needs_torch(version, what: str):
    """Skip where the installed torch is older than ``version``."""
    return pytest.mark.skipif(compat.torch_version() < version,
                              reason=f'{what} needs torch >= {version[0]}.{version[1]} (this is {torch.__version__})')


DYNAMO_ONNX = needs_torch(compat.DYNAMO_ONNX_TORCH, 'the dynamo ONNX exporter')
DYNAMIC_SIZE = needs_torch(compat.DYNAMIC_SIZE_TORCH, 'exporting with a dynamic height and width')
AOTI = needs_torch(compat.AOTI_TORCH, 'AOTInductor packages')
