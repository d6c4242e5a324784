"""What every exported file carries besides the graph: the names of its input and output, the names of its dynamic
axes, and tcnn's record of the model as JSON (the preprocessing a deployment needs, the source CNN, the conversion).

The record goes where each format keeps extra data: an ONNX file's ``metadata_props``, an extra file of a
``torch.export`` archive, an AOTInductor package's compiled-in metadata (``get_metadata()``), all under
``METADATA_KEY``.
"""
import json
from typing import Dict

import torch.nn as nn

from ..data.config import data_config
from ..version import __version__

__all__ = ['INPUT_NAME', 'OUTPUT_NAME', 'METADATA_KEY', 'dynamic_axes', 'metadata_json']

INPUT_NAME, OUTPUT_NAME = 'input', 'logits'
METADATA_KEY = 'tcnn'  # ONNX metadata_props key / .pt2 extra file holding what the model needs (JSON)


def dynamic_axes(dynamic_size: bool) -> Dict[int, str]:
    """The input's dynamic axes by name: the batch, and with ``dynamic_size`` height and width."""
    return {0: 'batch', 2: 'height', 3: 'width'} if dynamic_size else {0: 'batch'}


def metadata_json(model: nn.Module) -> str:
    """What a deployment needs besides the graph, as JSON: the preprocessing, the source CNN, the conversion."""
    return json.dumps({
        'tcnn_version': __version__,
        'source': (getattr(model, 'tcnn_source', None) or {}).get('model'),
        'conversion': getattr(model, 'tcnn_config', None),
        'data_config': data_config(model),
        'input': INPUT_NAME, 'output': OUTPUT_NAME,
    }, default=list)
