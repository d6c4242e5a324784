"""torch.hub entrypoints of tcnn: the ``t_*`` T-CNNs it registers with timm, ``convert`` and ``load``.

    import torch
    t_model = torch.hub.load('OWNER/tcnn', 't_resnet50d')                    # random init, as timm's default
    t_model = torch.hub.load('OWNER/tcnn', 't_resnet50d', pretrained=True)   # resnet50d's timm weights, converted
    t_model = torch.hub.load('OWNER/tcnn', 'convert', 'resnet50d', pretrained=True)  # the same, verified exact first
    t_model = torch.hub.load('OWNER/tcnn', 'load', 't_resnet50d.pt')         # a file of tcnn.save / tcnn convert
    torch.hub.load('/path/to/a/clone', 't_resnet18d', source='local')        # a checkout, no download
    torch.hub.list('OWNER/tcnn'), torch.hub.help('OWNER/tcnn', 't_resnet50d')

One entrypoint per ``t_*`` model of the installed timm (``tcnn.models``: the ResNet-D and ResNet-RS backbones of the
T-CNN paper and about 300 more), each ``timm.create_model(name, ...)``. Pretrained weights need the network (or the
local cache): offline, ``pretrained=True`` fails within seconds with one line naming the fix, ``weights=PATH`` (a
local checkpoint of the CNN, or a T-CNN file) or ``pretrained=False``, as ``tcnn convert``'s ``--weights`` and
``--no-pretrained``. torch.hub imports this file with the checkout on ``sys.path``, so the ``tcnn`` it uses is the
checkout's (unless the process imported another one before). ``tests/test_torch_hub.py`` checks all of it on a clone.
"""
import os as _os
from typing import Any as _Any, Callable as _Callable, Optional as _Optional, Sequence as _Sequence

import timm as _timm
import torch.nn as _nn

import tcnn as _tcnn
import tcnn.models as _tcnn_models
from tcnn.files.sources import WeightsUnavailableError as _WeightsUnavailableError
from tcnn.files.sources import transformed_model_name as _transformed_model_name

# module names, as torch.hub looks them up (pillow is PIL, pyyaml is yaml): tcnn's install_requires that these
# entrypoints import (matplotlib is for plots only)
dependencies = ['torch', 'torchvision', 'timm', 'numpy', 'PIL', 'yaml', 'tqdm', 'safetensors']

# WeightsUnavailableError's fix in this API's terms (tcnn convert's are --weights PATH / --no-pretrained)
_HUB_HINT = 'pass weights=PATH (a local checkpoint) or pretrained=False (random init)'


def _create(name: str, pretrained: bool, weights: _Optional[str], kwargs: dict) -> _nn.Module:
    if weights is not None:  # the t_ models load a file given as their pretrained config's file (tcnn.models)
        kwargs['pretrained_cfg_overlay'] = dict(kwargs.get('pretrained_cfg_overlay') or {}, file=_os.fspath(weights))
        pretrained = True
    try:
        return _timm.create_model(name, pretrained=pretrained, **kwargs)
    except _WeightsUnavailableError as e:
        raise e.with_hint(_HUB_HINT) from None


def _entrypoint(source: str) -> _Callable[..., _nn.Module]:
    name = _transformed_model_name(source)

    def entrypoint(pretrained: bool = False, weights: _Optional[str] = None, **kwargs: _Any) -> _nn.Module:
        return _create(name, pretrained, weights, kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__doc__ = f"""T-CNN of timm's ``{source}``: ``timm.create_model('{name}', ...)`` (``tcnn.models``).

    Args:
        pretrained: Convert ``{source}``'s pretrained timm weights (downloaded, or from the local cache).
        weights: A local file instead: a checkpoint of ``{source}`` (converted) or a T-CNN file (``tcnn.save``).
        **kwargs: timm's (``num_classes``, ``features_only``, ...) and tcnn's conversion settings (``stages``,
            ``locality_strength``, ``gating_init``, ``qk_dim``).
    """
    return entrypoint


for _source in _tcnn_models.SOURCE_MODELS:
    globals()[_transformed_model_name(_source)] = _entrypoint(_source)


def convert(model_name: str, pretrained: bool = False, weights: _Optional[str] = None, *,
            num_classes: _Optional[int] = None, use_ema: bool = False, stages: _Any = None,
            locality_strength: float = 1.0, gating_init: float = 1.0, qk_dim: _Optional[int] = None,
            verify: bool = True, input_size: _Optional[_Sequence[int]] = None, tol: float = 1e-4,
            **kwargs: _Any) -> _nn.Module:
    """The T-CNN of a timm CNN (or ``'torchvision:NAME'``), as ``tcnn convert`` makes it: ``tcnn.reparameterize``,
    which checks it against the CNN in the exact configuration unless ``verify=False``.

    Args:
        model_name: The CNN, e.g. ``'resnet50d'``, ``'resnetrs50'``, ``'convnext_tiny'``, ``'torchvision:resnet50'``.
        pretrained: Its pretrained weights (timm's default: random init).
        weights: A local checkpoint of the CNN instead (``tcnn convert --weights``).
        num_classes: Classifier size (default: the checkpoint's head, else the model's).
        use_ema: The EMA weights of ``weights``.
        stages, locality_strength, gating_init, qk_dim, verify, input_size, tol: ``tcnn.reparameterize``'s.
        **kwargs: The CNN's timm (or torchvision) factory arguments.
    """
    from tcnn.files.sources import create_cnn  # builds the CNN as tcnn convert does: weights files, torchvision names
    try:
        cnn = create_cnn(model_name, pretrained=pretrained, weights=weights, num_classes=num_classes, use_ema=use_ema,
                         **kwargs)
    except _WeightsUnavailableError as e:
        raise e.with_hint(_HUB_HINT) from None
    return _tcnn.reparameterize(cnn, stages=stages, locality_strength=locality_strength, gating_init=gating_init,
                                qk_dim=qk_dim, verify=verify, input_size=input_size, tol=tol)


def load(path: str, map_location: _Any = 'cpu', ema: bool = False) -> _nn.Module:
    """A saved T-CNN, offline: ``tcnn.load`` of a T-CNN file (``tcnn.save``, ``tcnn convert``), a training checkpoint
    (``ema=True``: its EMA weights) or a Hub folder; in eval mode."""
    return _tcnn.load(path, map_location=map_location, ema=ema)
