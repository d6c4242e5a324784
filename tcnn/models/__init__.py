"""``t_*`` models in timm's registry: ``timm.create_model('t_resnet50d')`` is the T-CNN of ``resnet50d``.

One entrypoint is registered per model of the timm families in ``FAMILIES`` (ResNet, ResNeXt and SE-ResNeXt of
timm's ``resnet`` and ``byobnet`` modules, RegNet, ConvNeXt, EfficientNet, MobileNetV3: ``t_resnet50d``,
``t_seresnext26d_32x4d``, ``t_resnext26ts``, ``t_regnety_002``, ``t_convnext_tiny``, ``t_efficientnet_b0``,
``t_mobilenetv3_large_100``, ...), each under its own name with ``register_model`` and as this module's
attribute of that name (``tcnn.models.t_resnet50d``, which ``register_model`` lists in ``__all__``: which models
there are depends on the installed timm, so the entrypoints are made from its model list, not written out one by
one), with pretrained configs that copy the source's tags, input sizes, normalisation and crop (T-CNN,
arXiv:2106.05795, fine-tunes at the source's data config), minus the weight locations: there are no converted weights
to download. Instead

* ``pretrained=True`` converts the source's pretrained weights on the fly (``tcnn.files.sources.create_cnn``, which
  fails within seconds offline);
* ``pretrained_cfg_overlay=dict(file=PATH)`` loads a T-CNN file (``tcnn.save``), a training checkpoint, or a plain
  checkpoint of the source CNN (converted on the fly); ``checkpoint_path=PATH`` loads a T-CNN file with timm's own
  loader;
* a Hub folder (``timm.create_model('local-dir:DIR' | 'hf-hub:ORG/NAME', pretrained=True)``, or
  ``pretrained_cfg_overlay=dict(file=DIR)`` / ``dict(hf_hub_id=ORG/NAME)``) rebuilds the T-CNN its config.json
  describes and loads the folder's own weights with timm's ``load_pretrained``, checked to fit exactly
  (``tcnn.files.hub_folder.check_folder_weights``). The models carry their conversion settings as timm's
  ``_model_args``, so ``save_for_hf`` writes such a folder.

The models are built from the source's own entrypoint by timm's ``build_model_with_cfg`` and stay instances of the
source's class (``tcnn.models.create``, which each entrypoint imports when called). Extra keyword arguments:
``stages``, ``locality_strength``, ``gating_init``, ``qk_dim`` (as in ``tcnn.reparameterize``).

This module is the registry only, and light on purpose: it is imported while timm itself is being imported
(``tcnn._registration``), possibly from inside a tcnn module that is half-imported at that moment, so at module level
it imports timm and ``tcnn.files.sources`` (the ``t_`` names; no tcnn module that imports timm) and nothing else of
tcnn.
"""
import dataclasses
from typing import Any, Callable, Dict, List, Tuple

import torch.nn as nn
from timm.models import generate_default_cfgs, get_arch_pretrained_cfgs, is_model, list_models, register_model

from ..files.sources import T_PREFIX, transformed_model_name

__all__ = ['Family', 'FAMILIES', 'SOURCE_MODELS']

PAPER_NAME = 'Transformed CNNs: recasting pre-trained convolutional layers with self-attention'
PAPER_ID = 'arXiv:2106.05795'


def _t_cfg(source_cfg: Any) -> Dict[str, Any]:
    """Pretrained config of a T-CNN: the source's data/head config, no weight location, the T-CNN paper."""
    cfg = source_cfg.to_dict(remove_source=True)
    for key in ('state_dict', 'architecture', 'tag', 'custom_load'):
        cfg.pop(key, None)
    source = source_cfg.architecture + (f'.{source_cfg.tag}' if source_cfg.tag else '')
    cfg.update(paper_name=PAPER_NAME, paper_ids=PAPER_ID, notes=(
        f'T-CNN of {source} (import tcnn): by name, pretrained=True converts its weights on the fly and '
        f'pretrained_cfg_overlay=dict(file=...) loads a converted file; a Hub folder (local-dir:, hf-hub:) loads '
        f'its own weights',))
    return cfg


@dataclasses.dataclass(frozen=True)
class Family:
    """A timm model module whose models get ``t_*`` entrypoints.

    Attributes:
        module: The timm module (``timm.list_models(module=...)``).
        feature_cfg: What its own entrypoints pass to ``build_model_with_cfg`` for ``features_only`` (stages that
            are not direct children need ``flatten_sequential``; ConvNeXt has 4 feature levels, not 5).
    """
    module: str
    feature_cfg: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def sources(self) -> List[str]:
        """Its models that convert exactly: timm's ``tf_*`` ports pad TensorFlow-style at run time (``Conv2dSame``,
        asymmetric) and ``*_cc_*`` models mix per-sample expert filters (``CondConv2d``); no GPSA layer reproduces
        either, so neither is registered."""
        return [n for n in list_models(module=self.module) if not n.startswith('tf_') and '_cc_' not in n]


FAMILIES: Tuple[Family, ...] = (
    Family('resnet'),  # ResNet, ResNet-D/-RS/-T, SE, ECA, ResNeXt, SE-ResNeXt, wide
    Family('byobnet', dict(flatten_sequential=True)),  # resnext26ts, seresnext26ts, gcresnext26ts, RepVGG, ...
    Family('regnet'),  # RegNetX/Y/V/Z: grouped 3x3
    Family('convnext', dict(out_indices=(0, 1, 2, 3), flatten_sequential=True)),  # depthwise 7x7
    Family('efficientnet', dict(flatten_sequential=True)),  # EfficientNet(V2), MixNet, MNASNet, ...: depthwise
    Family('mobilenetv3', dict(flatten_sequential=True)),  # MobileNetV3/V4, LCNet, FBNetV3: depthwise
)


def _make_entrypoint(source: str, family: Family) -> Callable[..., nn.Module]:
    variant = transformed_model_name(source)

    def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
        from .create import create_transformed  # at call time: see the module docstring
        return create_transformed(variant, source, family.feature_cfg, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = variant
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = (f"T-CNN of timm's ``{source}``: its last-stage k x k convs as GPSA layers "
                          '(arXiv:2106.05795). ``pretrained=True`` converts the source weights; see ``tcnn.models``.')
    return entrypoint



def _register_all() -> Tuple[str, ...]:
    sources = []
    for family in FAMILIES:
        for source in family.sources():
            if is_model(T_PREFIX + source):  # e.g. a timm model named t_* (none today): timm's name wins
                continue
            sources.append((source, family))
    cfgs = {}
    for source, _ in sources:
        for name, cfg in get_arch_pretrained_cfgs(source).items():  # default tag first
            cfgs[transformed_model_name(name)] = _t_cfg(cfg)
    globals()['default_cfgs'] = generate_default_cfgs(cfgs)  # register_model reads the module's default_cfgs
    for source, family in sources:
        fn = _make_entrypoint(source, family)
        globals()[fn.__name__] = fn
        register_model(fn)
    return tuple(source for source, _ in sources)


SOURCE_MODELS: Tuple[str, ...] = _register_all()
