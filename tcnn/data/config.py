"""A model's eval preprocessing (timm's data config: input size, interpolation, mean, std, crop), the one place tcnn
asks for it: T-CNN files store it, exported files carry it, evaluation and the CLI's images use it, a training run
overrides it with its recipe (``tcnn.train.data``). Nothing here opens a dataset: saving and exporting a model import
this module only.
"""
from typing import Any, Dict, Optional, Tuple, Union

import torch.nn as nn
from timm.data import resolve_data_config

from ..errors import check_number, check_size


__all__ = ['DATA_CONFIG_KEYS', 'data_config', 'dense_data_config', 'check_image_options']

# The preprocessing a model needs at evaluation (timm's data config keys), stored in T-CNN files.
DATA_CONFIG_KEYS = ('input_size', 'interpolation', 'mean', 'std', 'crop_pct', 'crop_mode')


def data_config(model: nn.Module, img_size: Optional[Union[int, Tuple[int, int]]] = None,
                crop_pct: Optional[float] = None, use_test_size: bool = False) -> Dict[str, Any]:
    """The eval preprocessing of ``model`` (``DATA_CONFIG_KEYS``): the one place tcnn asks for it.

    timm's ``resolve_data_config`` reads the model's ``pretrained_cfg`` (``tcnn.load`` puts a T-CNN file's stored
    config there); a torchvision model has none, so its default weights' eval transform is used instead of timm's
    ImageNet defaults (a torchvision ResNet is evaluated at resize 232 / crop 224, not 224 / 0.875).

    Args:
        model: The model itself (not a DDP wrapper: ``tcnn.save`` unwraps before asking).
        img_size: Input size instead of the model's: N (square) or ``(H, W)``, as timm's ``img_size``.
        crop_pct: Centre-crop fraction instead of the model's.
        use_test_size: The model's test size and crop (``test_input_size``, ``test_crop_pct`` of its
            ``pretrained_cfg``, as timm's ``validate.py`` uses by default) where it has them, instead of its
            ``input_size`` and ``crop_pct`` (for timm's pretrained CNNs, often the smaller training size: resnetrs50
            160 px vs 224 px at test).
    """
    check_image_options(img_size, crop_pct)
    config = None
    source = (getattr(model, 'tcnn_source', None) or {}).get('model', '')
    if not getattr(model, 'pretrained_cfg', None) and source.startswith('torchvision:'):
        config = _torchvision_data_config(source.split(':', 1)[1])
    if config is None:
        config = resolve_data_config(model=model, use_test_size=use_test_size)  # it sets every key, crop_mode too
    config = {k: config[k] for k in DATA_CONFIG_KEYS if k in config}
    if img_size is not None:
        height, width = img_size if isinstance(img_size, (tuple, list)) else (img_size, img_size)
        config['input_size'] = (3, int(height), int(width))
    if crop_pct is not None:
        config['crop_pct'] = float(crop_pct)
    return config


def _torchvision_data_config(arch: str) -> Optional[Dict[str, Any]]:
    """The eval transform of torchvision's default weights for ``arch`` (resize, crop, mean/std), timm-style; None
    without one (no weights, or a detection or segmentation transform: ``dense_data_config``)."""
    import torchvision  # only for torchvision models: importing it costs ~0.5 s
    try:
        transform = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):
        return None
    if not hasattr(transform, 'crop_size'):
        return None
    crop, resize = transform.crop_size[0], transform.resize_size[0]
    return {'input_size': (3, crop, crop), 'interpolation': transform.interpolation.value,
            'mean': tuple(transform.mean), 'std': tuple(transform.std), 'crop_pct': crop / resize,
            'crop_mode': 'center'}


def dense_data_config(name: str) -> Dict[str, Any]:
    """What applies of a data config to the torchvision detection or segmentation model ``'torchvision:NAME'``.

    A detection model takes images in [0, 1] of any size and resizes and normalises them itself (its ``transform``,
    set by the builder's ``min_size``, ``max_size``, ``image_mean``, ``image_std``): nothing applies, ``{}``. A
    segmentation model's weights normalise beforehand (``mean``, ``std``, ``interpolation`` of the resize); any size
    goes in, so there is no ``input_size`` or crop.
    """
    import torchvision
    try:
        transform = torchvision.models.get_model_weights(name.split(':', 1)[-1]).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):
        return {}
    if not hasattr(transform, 'mean'):  # ObjectDetection: only converts to float in [0, 1]
        return {}
    return {'interpolation': transform.interpolation.value, 'mean': tuple(transform.mean),
            'std': tuple(transform.std)}


def check_image_options(img_size: Optional[Union[int, Tuple[int, int]]], crop_pct: Optional[float],
                        names: Tuple[str, str] = ('img_size', 'crop_pct')) -> None:
    """An input size (a positive int, or a pair of them: height and width) and a centre-crop fraction in (0, 1], each
    optional; ``names`` are the arguments (or flags) named in messages."""
    if isinstance(img_size, (tuple, list)):
        check_size(img_size, names[0], 2, what='(H, W)')
    elif img_size is not None:
        check_number(img_size, names[0], ge=1, integer=True)
    if crop_pct is not None:
        check_number(crop_pct, names[1], gt=0, le=1)
