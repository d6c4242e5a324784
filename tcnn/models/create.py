"""Creation of the ``t_*`` models that ``tcnn.models`` registers with timm: a timm CNN built, converted, loaded.

The models are built by timm's ``build_model_with_cfg`` (so ``features_only``, ``out_indices``, ``in_chans``,
``num_classes`` adaptation of pretrained weights etc. are timm's own code) from the source's own entrypoint, and
converted in place (``tcnn.convert.transform.reparameterize_``). Their weights are the source CNN's converted by
``_load_filter`` (T-CNN eq. 6), a T-CNN file's, or a Hub folder's own (checked to fit exactly); ``tcnn.models``
describes what each ``pretrained``/``pretrained_cfg_overlay`` choice loads. ``create_transformed`` is the whole
path, in steps that each take and return what they use (``SuppliedWeights``: the weights and what they fix).

Why the built model is re-classed (``model.__class__ = Transformed<Class>``, a subclass made with ``type()`` once per
source class). timm's entrypoints keep each variant's architecture inside the function (``resnet50d`` is
``ResNet(Bottleneck, [3, 4, 6, 3], stem_type='deep', avg_down=True)`` written in its body), so the source's own
entrypoint is the one way to build exactly that architecture for each of the registered models; and the T-CNN must
answer ``no_weight_decay()``, the method timm's ``create_optimizer_v2`` asks a model for. The plainer alternatives
fall short: subclasses constructed from the variant's arguments would copy those arguments out of timm for every
model; a wrapper module would prefix every state-dict key and break timm's loaders, pretrained configs and feature
wrappers; a function set on the instance is dropped by ``torch.jit.script`` (with a warning) and leaves the model no
type that says it is a T-CNN (``isinstance(model, TransformedModel)``). The
subclass adds methods only, no state (the same technique as ``torch.nn.utils.parametrize``), and is a module
attribute here, so its name resolves.

The registry's entrypoints import this module when called, never while timm loads: it imports ``tcnn.convert``,
``tcnn.files`` and ``tcnn.layers``, which may themselves be half-imported at the moment timm's import registers
the ``t_*`` names (``tcnn._registration``).
"""
import dataclasses
import functools
import os
from typing import Any, Dict, Optional, Set, Tuple, Type

import torch
import torch.nn as nn
from timm.models import build_model_with_cfg, get_pretrained_cfg, model_entrypoint, resolve_pretrained_cfg
from timm.models.resnet import ResNet

from ..errors import TcnnError
from ..files import tcnn_file
from ..files.hub_folder import check_folder_weights, folder_config, timm_location
from ..files.loading import tcnn_state_dict_settings
from ..files.sources import (T_PREFIX, classifier_names, create_cnn, file_weights_origin, record_source,
                            transformed_model_name)
from ..files.tcnn_file import match_grouped_storage
from ..files.weights import checkpoint_head, checkpoint_num_classes, gpsa_layer_names, load_state_dict_file
from ..layers.gpsa import GPSA
from ..convert.settings import CONVERSION_KEYS, ConversionSettings, gpsa_layers
from ..convert.stages import resolve_stages
from ..convert.transform import reparameterize_

__all__ = ['TransformedModel', 'TransformedResNet', 'transformed_class', 'no_weight_decay_names',
           'create_transformed']

# Factory kwargs that describe the wrapper or placement, not the architecture (not stored in tcnn_source).
_NON_ARCH_KWARGS = ('features_only', 'out_indices', 'feature_cls', 'feature_cfg', 'flatten_sequential', 'device',
                    'dtype', 'num_classes', 'cache_dir', 'pretrained_model_args')
# timm's load_pretrained takes its weights from pretrained_cfg; we hand it this placeholder and supply the weights
# in the filter fn, so that a state dict never enters pretrained_cfg (timm deep-copies that dict, tensors included).
_WEIGHTS_PLACEHOLDER = {'tcnn': 'weights supplied by tcnn.models.create'}


def no_weight_decay_names(model: nn.Module) -> Set[str]:
    """Names of the GPSA parameters of ``model`` that take no weight decay (timm's ``no_weight_decay()`` contract):
    positional and gating parameters, biases, per-channel value gains (``GPSA.no_weight_decay``)."""
    return {f'{name}.{p}' for name, layer in gpsa_layers(model) for p in layer.no_weight_decay()}


class TransformedModel:
    """Mixin of the ``t_*`` classes: a timm model whose k x k convs in ``stages`` are GPSA layers (arXiv:2106.05795).

    Everything else is the source class's (forward_features, forward_head, forward_intermediates, feature_info, grad
    checkpointing, TorchScript); the mixin only adds ``no_weight_decay()`` for timm's optimizer factory and
    ``from_model``, which converts a freshly built source model in place and re-classes it.
    """
    source_class: Type[nn.Module] = nn.Module

    @classmethod
    def from_model(cls, model: nn.Module, settings: ConversionSettings = ConversionSettings()) -> nn.Module:
        """Convert a freshly built source model in place and return it as an instance of ``cls``.

        timm's entrypoints keep each variant's arguments inside the entrypoint, so the registry builds the source
        with its own entrypoint and then re-classes it (the subclass adds no state, only methods: the same technique
        as ``torch.nn.utils.parametrize``).
        """
        if type(model) is not cls.source_class:
            raise TcnnError(f'expected a timm {cls.source_class.__name__}, got {type(model).__name__}')
        reparameterize_(model, settings, verify=False)
        model.__class__ = cls
        return model

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """GPSA centres, locality strengths, gates, biases and per-channel value gains (and the source's own
        exemptions): exempt from weight decay, so that timm's ``create_optimizer_v2`` decays what ``tcnn.param_groups``
        decays. The gates' own learning rate needs ``param_group_fn=tcnn.param_groups`` (docs/train.md)."""
        own = getattr(super(), 'no_weight_decay', None)
        return no_weight_decay_names(self) | (set(own()) if own is not None else set())


class TransformedResNet(TransformedModel, ResNet):
    """A timm ``ResNet`` whose k x k convs in ``stages`` are GPSA layers: a T-CNN (arXiv:2106.05795).

    Args:
        *args: ``ResNet`` arguments.
        stages: Which stages to convert (``tcnn.convert.transform.resolve_stages``); default the last one.
        locality_strength: Initial alpha of every head (1.0: the paper's fine-tuning init).
        gating_init: Initial lambda of every head (1.0: the paper's fine-tuning init).
        qk_dim: Per-head width of content queries/keys (default ``C_in // heads``, or a grouped conv's group
            width ``C_in // groups`` if smaller).
        **kwargs: ``ResNet`` keyword arguments.
    """
    source_class = ResNet

    def __init__(self, *args, **kwargs):
        settings = ConversionSettings.of({k: kwargs.pop(k) for k in CONVERSION_KEYS if k in kwargs})
        super().__init__(*args, **kwargs)
        reparameterize_(self, settings, verify=False)

    @classmethod
    def from_resnet(cls, model: ResNet, settings: ConversionSettings = ConversionSettings()) -> 'TransformedResNet':
        """``from_model`` under its original name."""
        return cls.from_model(model, settings)


_CLASSES: Dict[type, type] = {ResNet: TransformedResNet}


def transformed_class(source_class: Type[nn.Module]) -> type:
    """The ``t_*`` class of a timm model class: ``Transformed<Name>(TransformedModel, <Name>)``, made once.

    The class is a module attribute of ``tcnn.models.create`` (pickling finds it by name).
    """
    cls = _CLASSES.get(source_class)
    if cls is None:
        name = f'Transformed{source_class.__name__}'
        cls = type(name, (TransformedModel, source_class), {
            '__module__': __name__, '__qualname__': name, 'source_class': source_class,
            '__doc__': f'A timm ``{source_class.__name__}`` whose k x k convs in ``stages`` are GPSA layers: a T-CNN '
                       '(arXiv:2106.05795); see ``TransformedModel``.'})
        _CLASSES[source_class] = globals()[name] = cls
    return cls


# ---------------------------------------------------------------------------------------------- weights


def _load_filter(
        state_dict: Dict[str, Any],
        model: nn.Module,
        weights: Optional[Dict[str, torch.Tensor]] = None,
) -> Dict[str, torch.Tensor]:
    """timm ``pretrained_filter_fn``: turn CNN weights into T-CNN weights for ``model``.

    The filter of every replaced conv becomes the output projection of its GPSA layer (T-CNN eq. 6) with values
    = identity and the positional init of the model's ``tcnn_config``; state dicts that already hold GPSA
    parameters pass through unchanged (a grouped layer whose filter is stored dense, as tcnn 0.2.0 wrote it, is
    rebuilt dense in ``model`` to load it: ``match_grouped_storage``).
    """
    out = dict(weights if weights is not None else state_dict)
    match_grouped_storage(model, out)
    cfg = model.tcnn_config
    for name, layer in gpsa_layers(model):
        weight = out.pop(f'{name}.weight', None)
        if weight is None:
            continue  # a T-CNN state dict
        bias = out.pop(f'{name}.bias', None)
        if weight.ndim != 4 or layer.in_chs % weight.shape[1]:
            raise TcnnError(f'{name}.weight of shape {tuple(weight.shape)} does not fit {layer}')
        conv = nn.Conv2d(
            layer.in_chs, layer.out_chs, layer.kernel_size, stride=layer.stride, padding=layer.padding,
            dilation=layer.dilation, groups=layer.in_chs // weight.shape[1], bias=bias is not None,
            padding_mode=layer.padding_mode, device='meta')
        conv.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            conv.bias = nn.Parameter(bias, requires_grad=False)
        gpsa = GPSA.from_conv(conv, cfg['locality_strength'], cfg['gating_init'], qk_dim=layer.qk_dim)
        out.update({f'{name}.{k}': v for k, v in gpsa.state_dict().items()})
    return out


@dataclasses.dataclass(frozen=True)
class SuppliedWeights:
    """Weights that tcnn hands to timm's loader for ``pretrained=True`` (all but a Hub folder's own), and what they fix.

    Attributes:
        state_dict: The weights, a CNN's (converted by ``_load_filter``) or a T-CNN's.
        origin: Where the source CNN's weights came from (``tcnn_source['weights']``; None when not recorded).
        file_dict: The T-CNN file's dict they came from (its records go to the model's ``pretrained_cfg``), or None.
        conversion: Conversion settings the weights fix, over the requested ones (a file's ``qk_dim`` and stages).
        file_stages: ``(file, its stages)`` when the caller gave stages too: compared on the built model (``_build``),
            where ``stages=4`` and ``['layer4']`` resolve to the same modules.
        cfg_defaults: Pretrained-config entries the weights set unless the caller's overlay does (the class count,
            a T-CNN file's data config).
    """
    state_dict: Dict[str, torch.Tensor]
    origin: Optional[str] = None
    file_dict: Optional[Dict[str, Any]] = None
    conversion: Dict[str, Any] = dataclasses.field(default_factory=dict)
    file_stages: Optional[Tuple[str, Any]] = None
    cfg_defaults: Dict[str, Any] = dataclasses.field(default_factory=dict)


def _state_dict_weights(path: str, state_dict: Dict[str, torch.Tensor], source: str, conversion: Dict[str, Any],
                        head: Optional[Tuple[str, int]], num_classes: Optional[int]) -> SuppliedWeights:
    """A plain checkpoint: the source CNN's weights (converted by the filter), or a T-CNN's state dict, whose GPSA
    layers show its conversion settings."""
    defaults = {'num_classes': head[1]} if head is not None else {}
    if not gpsa_layer_names(state_dict):
        return SuppliedWeights(state_dict, origin=file_weights_origin(path), cfg_defaults=defaults)
    given = {k: conversion[k] for k in ('stages', 'qk_dim') if conversion.get(k) is not None}
    found = tcnn_state_dict_settings(transformed_model_name(source), state_dict, path,
                                     head[1] if head is not None else num_classes, dict(given))
    # the source CNN's weights are not recorded in a state dict
    return SuppliedWeights(state_dict, conversion={k: v for k, v in found.items() if k not in given},
                           cfg_defaults=defaults)


def _tcnn_file_weights(path: str, d: Dict[str, Any], source: str, conversion: Dict[str, Any],
                       head: Optional[Tuple[str, int]]) -> SuppliedWeights:
    """A T-CNN file or training checkpoint of ``source``: its conversion settings, class count and data config are
    adopted where the caller gave none (a conflicting ``qk_dim`` or stages is an error)."""
    file_source = d['source']['model']
    if file_source.split('.')[0] != source:
        raise TcnnError(f'{path} holds a model of {file_source}, not {source}: create '
                        f'{T_PREFIX}{file_source.split(".")[0]} instead (or use tcnn.load)')
    file_conversion = d['conversion'] or {}
    if not file_conversion:
        raise TcnnError(f'{path} holds a plain CNN (no GPSA layers); load it with tcnn.load or timm.create_model'
                        f'({source!r}, checkpoint_path=...)')
    if conversion.get('qk_dim') is not None and conversion['qk_dim'] != file_conversion['qk_dim']:
        raise TcnnError(f'qk_dim={conversion["qk_dim"]!r} conflicts with {path} (qk_dim={file_conversion["qk_dim"]!r})')
    fixed, file_stages = {'qk_dim': file_conversion['qk_dim']}, None
    if conversion.get('stages') is None:
        fixed['stages'] = file_conversion['stages']
    else:
        file_stages = (path, file_conversion['stages'])
    defaults = {'num_classes': head[1] if head is not None else d['num_classes']}
    defaults.update({k: tuple(v) if isinstance(v, list) else v for k, v in (d.get('data_config') or {}).items()})
    return SuppliedWeights(d['state_dict'], origin=d['source'].get('weights'), file_dict=d, conversion=fixed,
                           file_stages=file_stages, cfg_defaults=defaults)


def _file_weights(path: str, source: str, conversion: Dict[str, Any], num_classes: Optional[int]) -> SuppliedWeights:
    """Weights from ``pretrained_cfg_overlay['file']``: a T-CNN file / training checkpoint, or a plain checkpoint.

    The class count is the file's head's unless ``num_classes`` is given, as in ``tcnn.files.sources.create_cnn`` (the
    same helper, ``checkpoint_num_classes``: a dropped head is one warning); timm's loader then drops a head whose size
    differs from the count recorded in the pretrained config."""
    try:
        d = tcnn_file.read(path)
        state_dict = d['state_dict']
    except tcnn_file.NotTcnnFileError:
        d, state_dict = None, load_state_dict_file(path)
    classifiers = classifier_names(source)
    checkpoint_num_classes(state_dict, classifiers, num_classes, where=path)
    head = checkpoint_head(state_dict, classifiers)
    if d is None:
        return _state_dict_weights(path, state_dict, source, conversion, head, num_classes)
    return _tcnn_file_weights(path, d, source, conversion, head)


def _supplied_weights(source: str, tag: Optional[str], cfg: Dict[str, Any], overlay: Dict[str, Any],
                      conversion: Dict[str, Any], num_classes: Optional[int]) -> SuppliedWeights:
    """The weights that ``pretrained=True`` loads when tcnn supplies them (see ``tcnn.models``): a state dict given
    in the overlay, a file, or the source CNN's pretrained weights (which fail fast offline, naming the fix)."""
    if overlay.get('state_dict') is not None:
        return SuppliedWeights(overlay['state_dict'])
    if cfg.get('file'):
        return _file_weights(cfg['file'], source, conversion, num_classes)
    name = f'{source}.{tag}' if tag else source
    return SuppliedWeights(create_cnn(name, pretrained=True).state_dict(), origin='pretrained')


def _model_args(model: nn.Module, arch_kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """What timm's ``save_for_hf`` writes as config.json's ``model_args``, and ``create_model('local-dir:...')``
    passes back to the entrypoint: the source's keyword arguments and every conversion setting (the stages as
    resolved module names), so that the folder rebuilds this architecture with no other input. (``timm.create_model``
    then lays the caller's own arguments over these, e.g. ``stages='layer3'`` as given: the same stages.)"""
    return dict(arch_kwargs, **ConversionSettings.of(model.tcnn_config).kwargs())


# ---------------------------------------------------------------------------------------------- creation


def _build(source: str, conversion: Dict[str, Any], file_stages: Optional[Tuple[str, Any]], **kwargs) -> nn.Module:
    """``model_cls`` for ``build_model_with_cfg``: the source's own entrypoint (random init), converted with
    ``conversion``; ``file_stages`` (``SuppliedWeights``) must name the same modules as the requested stages."""
    cnn = model_entrypoint(source)(pretrained=False, **kwargs)
    if file_stages is not None:
        path, stages = file_stages
        if resolve_stages(cnn, conversion['stages']) != resolve_stages(cnn, stages):
            raise TcnnError(f'stages={conversion["stages"]!r} conflicts with {path} (stages={stages!r})')
        conversion = dict(conversion, stages=stages)
    return transformed_class(type(cnn)).from_model(cnn, ConversionSettings.of(conversion))


def _resolve_tag(variant: str, pretrained_cfg: Any) -> Optional[str]:
    if isinstance(pretrained_cfg, str):
        return pretrained_cfg
    if isinstance(pretrained_cfg, dict):
        return pretrained_cfg.get('tag')
    if pretrained_cfg is not None:
        return getattr(pretrained_cfg, 'tag', None)
    default = get_pretrained_cfg(variant)
    return default.tag if default is not None else None


def _hub_folder_request(overlay: Dict[str, Any]) -> Dict[str, str]:
    """The Hub folder that ``pretrained_cfg_overlay`` names (``file=DIR`` or ``hf_hub_id=ORG/NAME``: loaded as
    ``'local-dir:DIR'`` / ``'hf-hub:ORG/NAME'`` would be), else an empty dict."""
    if overlay.get('file') and os.path.isdir(overlay['file']):
        return {'file': overlay['file']}
    if overlay.get('hf_hub_id') and overlay.get('source') != 'hf-hub':
        return {'hf_hub_id': overlay['hf_hub_id']}
    return {}


def create_transformed(variant: str, source: str, family_feature_cfg: Dict[str, Any], pretrained: bool = False,
                       **kwargs) -> nn.Module:
    """The model of the ``t_*`` entrypoint ``variant``: ``source`` built by its own entrypoint, converted, with the
    weights that ``pretrained`` and ``pretrained_cfg_overlay`` ask for (``tcnn.models``); ``family_feature_cfg`` is
    what the family's own entrypoints pass for ``features_only`` (``tcnn.models.Family``).

    The steps: split the arguments (conversion settings, pretrained config and overlay, the rest for timm); take a
    Hub folder's ``model_args`` as defaults; choose the weights (a Hub location that timm's loader fetches and
    ``check_folder_weights`` checks, or ``SuppliedWeights``); build and load with timm's ``build_model_with_cfg``;
    record where the model came from.
    """
    conversion = {k: kwargs.pop(k) for k in CONVERSION_KEYS if k in kwargs}
    overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
    pretrained_cfg = kwargs.pop('pretrained_cfg', None)
    folder = _hub_folder_request(overlay) if pretrained else {}
    if folder:  # the folder's config.json: its pretrained config, and its model_args as defaults of the arguments
        pretrained_cfg, model_args = folder_config(variant, folder)
        overlay = {k: v for k, v in overlay.items() if k not in folder}
        conversion = {**{k: v for k, v in model_args.items() if k in CONVERSION_KEYS}, **conversion}
        kwargs = {**{k: v for k, v in model_args.items() if k not in CONVERSION_KEYS}, **kwargs}
    tag = _resolve_tag(variant, pretrained_cfg)
    arch_kwargs = {k: v for k, v in kwargs.items() if k not in _NON_ARCH_KWARGS}
    features = bool(kwargs.get('features_only'))
    filter_fn, weights_origin, file_dict, file_stages = _load_filter, 'random', None, None
    if pretrained:
        cfg = resolve_pretrained_cfg(variant, pretrained_cfg, overlay).to_dict()
        location = None if overlay.get('state_dict') is not None else timm_location(cfg)
        if location is not None:  # timm's load_pretrained fetches the T-CNN's own weights; we check them
            filter_fn = functools.partial(check_folder_weights, where=location, features=features)
            weights_origin = None  # the source CNN's weights are not recorded in the folder's config
        else:
            supplied = _supplied_weights(source, tag, cfg, overlay, conversion, kwargs.get('num_classes'))
            conversion = {**conversion, **supplied.conversion}
            # timm's loader needs a weight location in the config to call the filter, which supplies the weights
            overlay = {**supplied.cfg_defaults, **overlay, 'state_dict': _WEIGHTS_PLACEHOLDER}
            filter_fn = functools.partial(_load_filter, weights=supplied.state_dict)
            weights_origin, file_dict, file_stages = supplied.origin, supplied.file_dict, supplied.file_stages
    if features:  # the family's feature wrapper settings (what its own entrypoint passes)
        kwargs['feature_cfg'] = {**family_feature_cfg, **(kwargs.get('feature_cfg') or {})}
    model = build_model_with_cfg(
        functools.partial(_build, source, conversion, file_stages), variant, pretrained,
        pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay, pretrained_filter_fn=filter_fn, **kwargs)
    model.pretrained_cfg.pop('state_dict', None)
    if file_dict is not None:  # a T-CNN file's records (test size, class names, weights' origin), as tcnn.load reads
        if kwargs.get('num_classes') not in (None, file_dict['num_classes']):  # a new head: the file's names go
            file_dict = dict(file_dict, num_classes=kwargs['num_classes'], label_names=None)
        model.pretrained_cfg = model.default_cfg = tcnn_file.pretrained_cfg_of(model.pretrained_cfg, file_dict,
                                                                               cfg['file'])
    if not features:
        record_source(model, f'{source}.{tag}' if tag else source, model.num_classes, arch_kwargs, weights_origin)
        model._model_args = _model_args(model, arch_kwargs)
    return model
