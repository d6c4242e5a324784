"""The part of a torchvision detection or segmentation model that exports as one checked tensor: its backbone's
ResNet (image -> the last stage's features, where the GPSA layers are). A detector's resizing, anchors and NMS give a
varying number of boxes and a segmentation model returns a dict; neither is one tensor an export can check.
"""
import collections

import torch.nn as nn

from ..errors import TcnnError

__all__ = ['backbone_trunk']


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
