"""The T-CNN file format: save a converted or plain CNN with what it takes to rebuild it offline, read the file back
as a validated dict, and rebuild the model from that dict.

``FILE.pt`` is a plain dict, readable with ``torch.load(path, weights_only=True)``::

    {'format': 'tcnn', 'version': 2, 'tcnn_version': '0.7.0',  # version 3 when it holds grouped GPSA layers
     'source': {'model': 'resnet50d', 'kwargs': {...},   # tcnn.files.sources.create_cnn arguments
                'weights': 'pretrained'},                # or 'random', 'file:NAME', None (weights.record_source)
     'conversion': {'architecture', 'stages', 'layers', 'locality_strength', 'gating_init', 'qk_dim'} or None,
     'data_config': {'input_size', 'interpolation', 'mean', 'std', 'crop_pct', 'crop_mode',
                     'test_input_size', 'test_crop_pct'},  # test size: timm's use_test_size (validate.py)
     'num_classes': 1000,
     'label_names': ['cat', 'dog', ...],          # optional: class names by output index (timm's label_names)
     'parameters': {'total': int, 'cnn': int},   # counts, so that `tcnn info` need not rebuild the models
     'report': {'max_rel_err', ...} or None,      # the verified conversion's EquivalenceReport (report_to_dict)
     'state_dict': {name: tensor}}

``FILE.safetensors`` holds the state dict as its tensors and everything else as JSON in the metadata entry
``'tcnn'``. Only tensors and plain Python values are stored, never pickled code. ``read`` also reads training
checkpoints (a dict whose ``'model_file'`` entry is such a dict). ``tcnn.load`` (``tcnn.files.loading``) rebuilds
the model of such a file, and of the other files tcnn reads (Hub folders, checkpoints of timm's train.py).
"""
import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import timm
import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file
from timm.models._features import FeatureDictNet, FeatureGetterNet, FeatureHookNet
from timm.models._features_fx import FeatureGraphNet

from ..data.config import data_config, dense_data_config
from ..atomic import atomic_torch_save, atomic_write
from ..convert.fusion import FusedBranches
from ..convert.settings import ConversionSettings, gpsa_layers
from ..convert.transform import reparameterize
from ..convert.verify import EquivalenceReport
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_module
from ..layers.gpsa import GPSA
from ..layers.projections import upgrade_proj_weight
from ..paths import check_output_file
from ..version import EXTENSIONS, FORMAT_NAME, FORMAT_VERSION, PLAIN_FORMAT_VERSION, __version__
from .integrity import safetensors_damage, tensor_checksums, verify_checksums
from .safetensors_header import METADATA_KEY
from .sources import (classifier_layer, create_cnn, dense_num_classes, dense_source_kwargs, model_task, record_source,
                      source_model_name, split_model_name, torchvision_task, transformed_model_name)
from .weights import (PICKLE_MAGIC, ZIP_MAGIC, check_map_location, check_path, error_reason, file_head,
                      gpsa_layer_names, load_torch_file, state_dict_misfit)

__all__ = ['FORMAT_NAME', 'FORMAT_VERSION', 'PLAIN_FORMAT_VERSION', 'EXTENSIONS', 'NotTcnnFileError', 'save', 'read',
           'read_raw', 'check_dict', 'validated', 'model_to_dict', 'model_from_dict', 'pretrained_cfg_of',
           'check_extension', 'report_to_dict', 'report_from_dict', 'CHECKSUMS_KEY', 'EMA_CHECKSUMS_KEY',
           'unwrap_model', 'safetensors_tensors', 'safetensors_error', 'match_grouped_storage']

# The tensors' checksums (tcnn.files.integrity): an entry of a T-CNN dict (in .pt files, the .safetensors settings and a
# training checkpoint's model_file) and 'ema_checksums' in a training checkpoint (a Hub folder's model.safetensors has
# its own, tcnn.files.hub_folder.HUB_CHECKSUMS_KEY). Files without them (tcnn 0.3.x) load unchecked.
CHECKSUMS_KEY = 'checksums'
EMA_CHECKSUMS_KEY = 'ema_checksums'


class NotTcnnFileError(TcnnError):
    """A readable weights file that is not a T-CNN file (e.g. a plain state_dict)."""


# ---------------------------------------------------------------------------------------------- model -> dict


def unwrap_model(model: nn.Module) -> nn.Module:
    """The raw model inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, '_orig_mod', None), nn.Module):
            model = model._orig_mod
        else:
            return model


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON-compatible Python (tuples become lists); raises on anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, f'{where}.{k}') for k, v in value.items()}
    raise TcnnError(f'cannot store {where} = {value!r} in a T-CNN file (only plain values: numbers, strings, lists, '
                    'dicts); create the model with plain keyword arguments')


def _source_of(model: nn.Module) -> Dict[str, Any]:
    """How to rebuild the architecture: ``model.tcnn_source`` (set by ``tcnn.files.sources.create_cnn`` and the ``t_*``
    registry), else the timm architecture name and factory kwargs that timm records."""
    source = getattr(model, 'tcnn_source', None)
    task = model_task(model)
    if source and task:
        return _dense_source(model, source, task)
    if source:
        return {'model': source['model'], 'kwargs': dict(source.get('kwargs') or {}), 'weights': source.get('weights')}
    if task:
        raise TcnnError(f'cannot tell which torchvision builder made this {type(model).__name__}: create it with '
                        f"tcnn.files.sources.create_cnn('torchvision:NAME', pretrained=False, num_classes=N, **kwargs) "
                        f"or set model.tcnn_source = {{'model': 'torchvision:NAME', 'kwargs': {{...}}}} (the builder's "
                        f'arguments, e.g. min_size; NAME e.g. {_builder_example(model)})')
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    arch = cfg.get('architecture')
    if not arch:
        raise TcnnError(f'cannot tell which architecture this {type(model).__name__} is: create it with '
                        'tcnn.files.sources.create_cnn (or timm.create_model), or set model.tcnn_source = '
                        '{"model": NAME, "kwargs": {...}}')
    if source_model_name(arch) is not None:
        raise TcnnError(f'{arch} model without tcnn_source: create it with timm.create_model({arch!r})')
    name = f'{arch}.{cfg["tag"]}' if cfg.get('tag') else arch
    # timm.create_model (timm >= 1.0.31) records the architecture arguments only: not its own parameters
    # (pretrained_cfg, cache_dir, ...) nor the placement (device, dtype); features_only models are refused before
    # (model_to_dict); the class count is the file's own field. A model built by its entrypoint has no record:
    # saved without its arguments it could load as another model (global_pool='max' would load as 'avg')
    args = getattr(model, '_model_args', None)
    if args is None:
        raise TcnnError(f'cannot tell which arguments this {arch} was built with (timm.create_model records them, '
                        f'its entrypoint does not): build it with timm.create_model({arch!r}, ...), or set '
                        'model.tcnn_source = {"model": NAME, "kwargs": {...}}')
    kwargs = {k: v for k, v in args.items() if k != 'num_classes'}
    return {'model': name, 'kwargs': kwargs, 'weights': None}  # timm does not record where its weights came from


def _builder_example(model: nn.Module) -> str:
    names = {'FasterRCNN': 'fasterrcnn_resnet50_fpn', 'MaskRCNN': 'maskrcnn_resnet50_fpn', 'FCN': 'fcn_resnet50',
             'RetinaNet': 'retinanet_resnet50_fpn', 'DeepLabV3': 'deeplabv3_resnet50', 'FCOS': 'fcos_resnet50_fpn',
             'KeypointRCNN': 'keypointrcnn_resnet50_fpn', 'SSD': 'ssd300_vgg16', 'LRASPP': 'lraspp_mobilenet_v3_large'}
    return names.get(type(model).__name__, 'fasterrcnn_resnet50_fpn')


def _dense_source(model: nn.Module, source: Dict[str, Any], task: str) -> Dict[str, Any]:
    """The source of a torchvision detection or segmentation model: its ``tcnn_source`` with what its modules
    show (``tcnn.files.sources.dense_source_kwargs``)."""
    name = source.get('model')
    if torchvision_task(name) != task:
        found = torchvision_task(name)
        raise TcnnError(f'this {type(model).__name__} is a torchvision {task} model, but its tcnn_source names '
                        f'{name!r} ({found + " model" if found else "not a torchvision builder"}): set '
                        f"model.tcnn_source = {{'model': 'torchvision:NAME', 'kwargs': {{...}}}}, NAME e.g. "
                        f'{_builder_example(model)}')
    kwargs = dense_source_kwargs(model, {k: v for k, v in (source.get('kwargs') or {}).items() if k != 'num_classes'})
    return {'model': name, 'kwargs': kwargs, 'weights': source.get('weights')}


# nn.Module's own attributes (training flag, hooks, parameter dicts): not the architecture's settings
_MODULE_ATTRIBUTES = frozenset(vars(nn.Module()))


def _settings(module: nn.Module) -> Dict[str, Any]:
    """A module's plain-valued attributes (numbers, strings, tuples, dicts of them: torchvision's ``min_size``,
    ``score_thresh``, ``_pre_nms_top_n``, a batch norm's ``eps``), what a builder's arguments set besides shapes."""
    def plain(v: Any) -> bool:
        if v is None or isinstance(v, (bool, int, float, str)):
            return True
        if isinstance(v, (list, tuple)):
            return all(plain(x) for x in v)
        return isinstance(v, dict) and all(isinstance(k, str) and plain(x) for k, x in v.items())
    return {k: v for k, v in vars(module).items()
            if k not in _MODULE_ATTRIBUTES and not k.startswith('tcnn_') and plain(v)}


def _check_rebuilds(model: nn.Module, d: Dict[str, Any]) -> None:
    """Raise unless the source recorded in the T-CNN dict ``d`` rebuilds ``model``'s architecture: the same
    modules, state dict shapes and settings (a torchvision detection or segmentation model's builder arguments do
    not all show in its state dict: ``min_size``, score thresholds, ``frozen_batchnorm``)."""
    with torch.device('meta'):
        rebuilt = _build(d)
    source = d['source']
    arguments = ', '.join(f'{k}={v!r}' for k, v in dict(num_classes=d['num_classes'], **source['kwargs']).items())
    built = f'{source["model"]}({arguments})'
    fix = ("set model.tcnn_source = {'model': 'torchvision:NAME', 'kwargs': {...}} to the builder and arguments that "
           'made it (or build it with tcnn.files.sources.create_cnn)')
    misfit = state_dict_misfit(rebuilt, model.state_dict())
    if misfit:
        raise TcnnError(f'cannot save this {type(model).__name__}: {built} would rebuild other weights ({misfit}); '
                        f'{fix}')
    modules = dict(model.named_modules())
    for name, module in rebuilt.named_modules():
        mine = modules.get(name)
        where = name or 'the model'
        if type(mine) is not type(module):
            found = type(mine).__name__ if mine is not None else 'nothing'
            raise TcnnError(f'cannot save this {type(model).__name__}: {built} would rebuild {where} as '
                            f'{type(module).__name__}, it is {found}; {fix}')
        expected, actual = _settings(module), _settings(mine)
        # None at construction: what a forward caches (MultiScaleRoIAlign's scales), not a setting
        differs = sorted(k for k in expected if k in actual and expected[k] is not None and expected[k] != actual[k])
        if differs:
            k = differs[0]
            raise TcnnError(f'cannot save this {type(model).__name__}: {built} would rebuild {where}.{k} = '
                            f'{expected[k]!r}, it is {actual[k]!r}; {fix}')


def _num_classes(model: nn.Module) -> int:
    if model_task(model):
        classes = dense_num_classes(model)
        if classes is None:
            raise TcnnError(f'cannot tell the class count of this {type(model).__name__}: its head is not one of '
                            'torchvision\'s (box_predictor.cls_score, classification_head, classifier)')
        return classes
    if isinstance(getattr(model, 'num_classes', None), int):
        return model.num_classes
    _, head = classifier_layer(model)  # torchvision's: fc, classifier.1, classifier.2, heads.head ...
    if head is not None:
        return head.out_features
    raise TcnnError(f'cannot tell the class count of this {type(model).__name__} (no num_classes, no linear layer)')


def _parameter_counts(model: nn.Module) -> Dict[str, int]:
    """Parameters of the model and of its source CNN (every GPSA layer counted as the conv it stands for)."""
    total = sum(p.numel() for p in model.parameters())
    layers = [layer for _, layer in gpsa_layers(model)]
    extra = sum(sum(p.numel() for p in layer.parameters()) - layer.conv_parameters() for layer in layers)
    return {'total': total, 'cnn': total - extra}


def report_to_dict(report: Optional[EquivalenceReport]) -> Optional[Dict[str, Any]]:
    """A conversion's ``EquivalenceReport`` as plain values (a non-finite number as None: strict JSON), or None."""
    if report is None:
        return None
    d = dataclasses.asdict(report)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else list(v) if isinstance(v, tuple) else v)
            for k, v in d.items()}


def report_from_dict(d: Dict[str, Any]) -> EquivalenceReport:
    """The inverse of ``report_to_dict`` (a missing sensitivity reads as not measured, NaN)."""
    fields = {f.name for f in dataclasses.fields(EquivalenceReport)}
    values = {k: v for k, v in d.items() if k in fields}
    values['input_size'] = tuple(values.get('input_size') or ())
    if values.get('sensitivity') is None:
        values['sensitivity'] = float('nan')
    return EquivalenceReport(**values)


def _stored_data_config(model: nn.Module, overrides: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The data config a file stores: the model's (``tcnn.data.config.data_config``) with its test size and crop
    (``test_input_size``, ``test_crop_pct``: what ``use_test_size=True`` resolves), then ``overrides``.

    As in timm's ``save_config_for_hf``, an overridden ``input_size`` / ``crop_pct`` replaces the test size / crop
    unless the overrides give those too: a fine-tuned model is evaluated as it was validated, not at its source
    CNN's test size. Always storing both tells ``model_from_dict`` that the file's config is complete.
    """
    if model_task(model):
        config = _plain(dense_data_config(_source_of(model)['model']), 'data_config')
        config.update(_plain(dict(overrides or {}), 'data_config'))
        return config
    config = _plain(data_config(model), 'data_config')
    test = data_config(model, use_test_size=True)
    config.update(test_input_size=list(test['input_size']), test_crop_pct=test['crop_pct'])
    overrides = _plain(dict(overrides or {}), 'data_config')
    for key, test_key in (('input_size', 'test_input_size'), ('crop_pct', 'test_crop_pct')):
        if key in overrides:
            config[test_key] = overrides[key]
    config.update(overrides)
    return config


def _label_names(model: nn.Module, label_names: Optional[Sequence[str]], num_classes: int) -> Optional[List[str]]:
    """The class names to store: ``label_names``, else the model's (``pretrained_cfg['label_names']``, as timm and
    ``tcnn.load`` keep them) when they name each of its outputs; None when there are none."""
    if label_names is None:
        label_names = (getattr(model, 'pretrained_cfg', None) or {}).get('label_names')
        if not (isinstance(label_names, (list, tuple)) and len(label_names) == num_classes):
            return None  # timm's label names of another head (e.g. ImageNet's for a new 3-class head), or none
    return _check_label_names(label_names, num_classes, 'label_names')


def _check_label_names(label_names: Any, num_classes: Any, where: str) -> List[str]:
    if not (isinstance(label_names, (list, tuple)) and all(isinstance(n, str) for n in label_names)):
        raise TcnnError(f'{where} must be a list of class names (strings), got {type(label_names).__name__}')
    if len(label_names) != num_classes:
        raise TcnnError(f'{where} has {len(label_names)} names for {num_classes} classes')
    return list(label_names)


def model_to_dict(model: nn.Module, *, data_config: Optional[Dict[str, Any]] = None,
                  label_names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The plain dict that ``save`` writes to ``.pt``: format, version, source architecture, conversion settings
    (None for a plain CNN), data config, class count (and names) and state_dict.

    Args:
        model: A T-CNN (``tcnn.reparameterize``, ``t_*`` models, ``tcnn.load``) or a plain CNN; DDP and
            ``torch.compile`` wrappers are unwrapped.
        data_config: Overrides of the data config (default: the model's, ``tcnn.data.config.data_config``, with its test
            size); an ``input_size`` or ``crop_pct`` given here is also the test size or crop unless
            ``test_input_size`` / ``test_crop_pct`` are given too.
        label_names: Class names by output index (default: the model's ``pretrained_cfg['label_names']`` when they
            fit its head, else none).
    """
    model = unwrap_model(model)
    # timm's wrappers, and the feature classes some families build themselves (MobileNetV3Features, ...)
    if (isinstance(model, (FeatureDictNet, FeatureHookNet, FeatureGetterNet, FeatureGraphNet))
            or (getattr(model, '_model_args', None) or {}).get('features_only')):
        raise TcnnError('cannot save a features_only model: save the classification model it was made from')
    layers = [name for name, _ in gpsa_layers(model)]
    conversion = getattr(model, 'tcnn_config', None)
    if layers and not conversion:
        raise TcnnError('the model has GPSA layers but no tcnn_config: convert it with tcnn.reparameterize')
    if conversion:
        conversion = _plain(dict(conversion), 'conversion')
        if conversion['layers'] != layers:
            if any(isinstance(m, FusedBranches) for m in model.modules()):
                raise TcnnError('cannot save a model fused by timm.utils.reparameterize_model (its GPSA layers moved '
                                'into the fused blocks): save the model before fusing, and fuse after tcnn.load')
            raise TcnnError(f'the model\'s GPSA layers {layers} differ from its tcnn_config {conversion["layers"]}')
    grouped = any(layer.groups > 1 for _, layer in gpsa_layers(model))
    num_classes = _num_classes(model)
    names = _label_names(model, label_names, num_classes)
    d = {
        'format': FORMAT_NAME,
        'version': FORMAT_VERSION if grouped else PLAIN_FORMAT_VERSION,  # older tcnn reads what it can
        'tcnn_version': __version__,
        'source': _plain(_source_of(model), 'source'),
        'conversion': conversion or None,
        'data_config': _stored_data_config(model, data_config),
        'num_classes': num_classes,
        **({'label_names': names} if names else {}),
        'parameters': _parameter_counts(model),
        'report': report_to_dict(getattr(model, 'tcnn_report', None)),
        'state_dict': {k: v.detach() for k, v in model.state_dict().items()},
    }
    if model_task(model):
        _check_rebuilds(model, d)
    return d


# ---------------------------------------------------------------------------------------------- dict -> model


LIGHTNING_KEY = 'pytorch-lightning_version'  # in every checkpoint of Lightning's Trainer (lightning 1.x and 2.x)


def check_dict(d: Any, where: str) -> Dict[str, Any]:
    """Validate a T-CNN dict (format, version, fields); a training checkpoint yields its ``model_file`` (with
    ``'training'``: epoch and best top-1, and ``'recipe'``: the run's resolved recipe, if a dict)."""
    if isinstance(d, dict) and isinstance(d.get('model_file'), dict) and 'format' not in d:
        training = {k: d[k] for k in ('epoch', 'best_top1') if k in d and not isinstance(d[k], torch.Tensor)}
        recipe = d.get('config') if isinstance(d.get('config'), dict) else None
        if d.get('ema_weights'):
            training['weights'] = 'ema'
        d = dict(d['model_file'], training=training, recipe=recipe)
    if not isinstance(d, dict):
        raise NotTcnnFileError(f'{where} is not a T-CNN file (it holds a {type(d).__name__}, not a dict)')
    if d.get('format') != FORMAT_NAME:
        if d and all(isinstance(v, torch.Tensor) for v in d.values()):
            layers = gpsa_layer_names(d)
            if layers:  # torch.save(t_model.state_dict()), timm's clean_checkpoint.py of a T-CNN
                raise NotTcnnFileError(f'{where} is the state dict of a T-CNN ({len(layers)} GPSA layers), not a T-CNN '
                                       f'file: make one with `tcnn convert t_MODEL --weights {where} --out FILE`, '
                                       't_MODEL the T-CNN it was saved from (e.g. t_resnet50d)')
            raise NotTcnnFileError(f'{where} is a plain state_dict, not a T-CNN file: convert it with '
                                   f'`tcnn convert MODEL --weights {where} --out FILE`, MODEL the CNN it was saved '
                                   'from (e.g. resnet50d)')
        if LIGHTNING_KEY in d and isinstance(d.get('state_dict'), dict):  # Lightning's Trainer.save_checkpoint
            model = ('t_MODEL --weights {w} --out FILE`, t_MODEL the T-CNN it trained (e.g. t_resnet50d)'
                     if gpsa_layer_names(d['state_dict']) else
                     'MODEL --weights {w} --out FILE`, MODEL the CNN it trained (e.g. resnet50d)').format(w=where)
            raise NotTcnnFileError(f'{where} is a Lightning checkpoint, which does not record its model\'s '
                                   f'architecture: make a T-CNN file of its weights with `tcnn convert {model}')
        raise NotTcnnFileError(f'{where} is not a T-CNN file (format {d.get("format")!r}, expected {FORMAT_NAME!r}; '
                               f'keys: {", ".join(sorted(map(str, d))[:8])})')
    version = d.get('version')
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TcnnError(f'{where}: invalid T-CNN format version {version!r}')
    if version > FORMAT_VERSION:
        raise TcnnError(f'{where} was written in T-CNN format version {version} (by tcnn '
                        f'{d.get("tcnn_version", "?")}); this tcnn reads versions up to {FORMAT_VERSION}: upgrade tcnn')
    source, state_dict = d.get('source'), d.get('state_dict')
    if not isinstance(source, dict) or not isinstance(source.get('model'), str):
        raise TcnnError(f'{where}: corrupt T-CNN file (no source architecture)')
    if not (isinstance(state_dict, dict) and state_dict
            and all(isinstance(v, torch.Tensor) for v in state_dict.values())):
        raise TcnnError(f'{where}: corrupt T-CNN file (no state_dict of tensors)')
    conversion = d.get('conversion')
    if conversion is not None and not (isinstance(conversion, dict) and isinstance(conversion.get('layers'), list)):
        raise TcnnError(f'{where}: corrupt T-CNN file (bad conversion settings)')
    return d


def _build(d: Dict[str, Any]) -> nn.Module:
    """The architecture of a T-CNN dict with untrained weights: the ``t_*`` registry model for timm ResNets (a
    ``TransformedResNet``), else ``create_cnn`` + ``reparameterize``."""
    source, conversion = d['source'], d['conversion']
    name, kwargs = source['model'], dict(source.get('kwargs') or {})
    num_classes = d.get('num_classes')
    kind, arch = split_model_name(name)
    try:
        if conversion and kind == 'timm' and source_model_name(transformed_model_name(arch)) is not None:
            return timm.create_model(
                transformed_model_name(arch), pretrained=False, num_classes=num_classes,
                **ConversionSettings.of(conversion).kwargs(), **kwargs)
        model = create_cnn(name, pretrained=False, num_classes=num_classes, **kwargs)
        if conversion:
            model = reparameterize(model, **ConversionSettings.of(conversion).kwargs(), verify=False)
        return model
    except TcnnError:
        raise
    except (TypeError, ValueError, RuntimeError, AssertionError, KeyError) as e:
        raise TcnnError(f'cannot rebuild {name} with {kwargs}: {type(e).__name__}: {e}') from e


def match_grouped_storage(model: nn.Module, state_dict: Dict[str, torch.Tensor]) -> List[str]:
    """Rebuild with dense storage (``groups=1``) every grouped GPSA layer of ``model`` for which ``state_dict``
    holds a dense filter, so that the state dict loads; returns the names of the rebuilt layers.

    tcnn 0.2.0 and earlier stored a grouped conv's filter as its dense block-diagonal equivalent, with a dense
    ``W_val`` and the dense default ``qk_dim``; fine-tuning may have filled the off-diagonal blocks, so such a layer
    is not cut back to its groups but loaded as the dense layer it is (``conv_groups`` keeps the source conv's groups
    for parameter counts). A filter is dense when it has ``C_out * N_h * C_in`` elements (either stored layout);
    ``qk_dim`` is read from the stored ``q_weight``. The model's layers are replaced in place (on their device and
    dtype, meta included); a ``model`` that is itself a GPSA layer is left alone (build it with ``groups=1``).
    """
    rebuilt = []
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, GPSA) or layer.groups == 1 or not name:
            continue
        weight, q = state_dict.get(f'{name}.proj_weight'), state_dict.get(f'{name}.q_weight')
        if not isinstance(weight, torch.Tensor) or weight.numel() != layer.out_chs * layer.num_heads * layer.in_chs:
            continue
        qk_dim = q.shape[0] // layer.num_heads if isinstance(q, torch.Tensor) and q.ndim == 2 else layer.qk_dim
        dense = GPSA(layer.in_chs, layer.out_chs, layer.kernel_size, layer.stride, layer.padding, layer.dilation,
                     bias=layer.proj_bias is not None, padding_mode=layer.padding_mode, qk_dim=qk_dim,
                     device=layer.proj_weight.device, dtype=layer.proj_weight.dtype)
        dense.conv_groups = layer.conv_groups
        dense.train(layer.training)
        model.set_submodule(name, dense)
        rebuilt.append(name)
    return rebuilt


def _load_weights(model: nn.Module, state_dict: Dict[str, torch.Tensor], where: str, assign: bool) -> None:
    match_grouped_storage(model, state_dict)  # files of tcnn 0.2.0 and earlier: grouped filters dense
    expected = model.state_dict()
    state_dict = {k: upgrade_proj_weight(v, expected[k].shape) if k.endswith('proj_weight') and k in expected else v
                  for k, v in state_dict.items()}  # format version 1 (tcnn 0.1.0) stored GPSA filters in 2-D
    misfit = state_dict_misfit(model, state_dict)
    if misfit:
        raise TcnnError(f'{where}: the weights do not fit the rebuilt model: {misfit}')
    model.load_state_dict(state_dict, strict=True, assign=assign)


def model_from_dict(
        d: Dict[str, Any],
        map_location: Union[str, torch.device, None] = 'cpu',
        *,
        where: str = 'the T-CNN dict',
) -> nn.Module:
    """Rebuild the model of a T-CNN dict (``model_to_dict``'s output, or a training checkpoint) offline and load
    its weights strictly.

    Args:
        d: The dict.
        map_location: Device of the weights (None: keep the dict's tensors where they are).
        where: Name of the dict's origin in error messages (e.g. its file).

    Returns:
        The model in eval mode.
    """

    d = check_dict(d, where)
    state_dict = d['state_dict']
    if map_location is not None:
        state_dict = {k: v.to(map_location) for k, v in state_dict.items()}
    # Build on the meta device (no random init, no memory) and adopt the file's tensors (assign=True); rebuild for
    # real if some tensor is not in the state dict (non-persistent buffers) and would stay on meta.
    with torch.device('meta'):
        model = _build(d)
    assign = not any(b.is_meta for n, b in model.named_buffers() if n not in state_dict)
    if not assign:
        model = _build(d).to(next(iter(state_dict.values())).device)
    layers = [name for name, _ in gpsa_layers(model)]
    expected_layers = (d['conversion'] or {}).get('layers', [])
    if layers != expected_layers:
        raise TcnnError(f'{where}: this tcnn/timm builds GPSA layers {layers}, the file has {expected_layers}')
    _load_weights(model, state_dict, where, assign)
    source = d['source']
    record_source(model, source['model'], d.get('num_classes'), source.get('kwargs') or {}, source.get('weights'))
    if d['conversion']:
        model.tcnn_config = dict(d['conversion'])
    if isinstance(d.get('report'), dict):
        model.tcnn_report = report_from_dict(d['report'])
    model.pretrained_cfg = pretrained_cfg_of(getattr(model, 'pretrained_cfg', None) or {}, d, where)
    model.default_cfg = model.pretrained_cfg
    return model.eval()


_TEST_SIZE_KEYS = ('test_input_size', 'test_crop_pct', 'test_pool_size')
# pretrained_cfg entries of the source CNN's published weights (timm's registry gives a t_* model its source's):
# they do not describe weights from elsewhere (a user's file, a random init)
_PUBLISHED_WEIGHTS_KEYS = ('tag', 'license', 'origin_url', 'description', 'notes')


def _weights_note(d: Dict[str, Any]) -> Optional[str]:
    """pretrained_cfg's ``notes`` for a model whose source weights are not timm's published ones, else None."""
    source = d['source']
    origin = source.get('weights')
    if not isinstance(origin, str) or origin == 'pretrained':
        return None  # timm's pretrained weights, or not recorded (tcnn 0.3): the registry's config stands
    where = (f"the local file {origin[len('file:'):]}" if origin.startswith('file:') else
             'a random initialisation' if origin == 'random' else origin)
    kind = 'T-CNN' if d['conversion'] else 'CNN'
    return (f'{kind} of {source["model"].split(".")[0]} (tcnn) whose source weights came from {where}, not from a '
            'published checkpoint: license unknown')


def pretrained_cfg_of(cfg: Dict[str, Any], d: Dict[str, Any], where: str) -> Dict[str, Any]:
    """The ``pretrained_cfg`` of a model rebuilt from the T-CNN dict ``d`` (what timm's ``resolve_data_config`` and
    ``save_for_hf`` read): the built model's ``cfg`` with the file's data config, class count and names.

    The source's test size (timm's ``use_test_size``) stays only where the file does not say otherwise: files of
    this tcnn store their test size, and a training checkpoint of tcnn 0.3 (which did not) holds the data config
    its run validated with. The source's tag, license and notes go when the weights did not come from timm's
    published ones (``tcnn.files.sources.record_source``).
    """
    cfg = dict(cfg)
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in (d.get('data_config') or {}).items()}
    if 'test_input_size' in config or d.get('training') is not None:
        for key in _TEST_SIZE_KEYS:
            cfg.pop(key, None)
    cfg.update(config)
    if isinstance(d.get('num_classes'), int):
        cfg['num_classes'] = d['num_classes']  # timm's infer_imagenet_subset and save_for_hf compare it
    names = cfg.get('label_names')
    if not (isinstance(names, (list, tuple)) and len(names) == cfg.get('num_classes')):
        cfg.pop('label_names', None)  # the source's names of another head (timm's save_for_hf drops them too)
        cfg.pop('label_descriptions', None)
    if d.get('label_names') is not None:
        cfg['label_names'] = tuple(_check_label_names(d['label_names'], d.get('num_classes'),
                                                      f'{where}: label_names'))
    note = _weights_note(d)
    if note:
        for key in _PUBLISHED_WEIGHTS_KEYS:
            cfg.pop(key, None)
        cfg['notes'] = (note,)
    return cfg


# ---------------------------------------------------------------------------------------------- files


def check_extension(path: str) -> str:
    """The extension of a T-CNN file path (``.pt``, ``.pth`` or ``.safetensors``); raises on anything else."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in EXTENSIONS:
        raise TcnnError(f'{path}: unsupported extension {ext or "(none)"!r}: T-CNN files end in '
                        f'{", ".join(EXTENSIONS)}')
    return ext


def safetensors_tensors(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The tensors of a state dict as safetensors stores them: on the CPU, contiguous, no storage shared. Copied only
    where they must be (tied weights, views): a CPU model's own tensors are stored from its memory, not a second copy
    of every weight."""
    tensors, seen = {}, set()
    for k, v in state_dict.items():
        v = v.detach().to('cpu').contiguous()
        if v.untyped_storage().data_ptr() in seen and v.numel():
            v = v.clone()  # safetensors refuses shared storage
        seen.add(v.untyped_storage().data_ptr())
        tensors[k] = v
    return tensors


def _save_safetensors(d: Dict[str, Any], path: str) -> None:
    settings = {k: v for k, v in d.items() if k != 'state_dict'}
    # 'format': 'pt' is the safetensors convention for torch tensors; our settings go under 'tcnn'.
    metadata = {'format': 'pt', METADATA_KEY: json.dumps(settings)}
    save_file(safetensors_tensors(d['state_dict']), path, metadata=metadata)


def save(model: nn.Module, path: str, *, data_config: Optional[Dict[str, Any]] = None,
         label_names: Optional[Sequence[str]] = None) -> str:
    """Write a T-CNN file atomically: ``.pt``/``.pth`` (a plain dict, see the module docstring) or
    ``.safetensors`` (settings as JSON in the metadata). Works for T-CNNs and plain CNNs.

    Args:
        model: The model (DDP / compiled wrappers are unwrapped).
        path: Output path; its extension picks the format; missing folders are created.
        data_config: Overrides of the stored data config (see ``model_to_dict``).
        label_names: Class names by output index (default: the model's ``pretrained_cfg['label_names']``).

    Returns:
        The absolute path written.
    """
    check_module(model, 'model')
    path = check_path(path, 'path')
    ext = check_extension(path)
    check_output_file(path, 'path', EXTENSIONS)
    if data_config is not None and not isinstance(data_config, dict):
        raise InvalidTypeError(f'data_config must be a dict or None, got {type(data_config).__name__}')
    d = model_to_dict(model, data_config=data_config, label_names=label_names)
    d[CHECKSUMS_KEY] = tensor_checksums(d['state_dict'])
    try:
        if ext == '.safetensors':
            atomic_write(path, lambda tmp: _save_safetensors(d, tmp))
        else:
            atomic_torch_save(d, path)  # the same model gives the same bytes (atomic_torch_save says why)
    except OSError as e:  # disk full, no permission, ...: nothing was left at path
        raise TcnnError(f'cannot write {path}: {e.strerror or e}') from e
    return os.path.abspath(path)


def safetensors_error(path: str, error: BaseException) -> str:
    """One line for a safetensors file that safetensors cannot read: truncated or corrupt, as its layout shows
    (``tcnn.files.integrity.safetensors_damage``), else safetensors' own reason."""
    try:
        damage = safetensors_damage(path)
    except OSError:
        damage = None
    damage = damage or f'corrupt (not a valid safetensors file: {error_reason(error)})'
    return f'{path} is {damage}: re-download or re-save it'


def _read_safetensors(path: str, map_location: Union[str, torch.device, None]) -> Dict[str, Any]:
    try:  # on the CPU: a device problem must not be reported as a corrupt file
        with safe_open(path, framework='pt', device='cpu') as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError and OSError / ValueError
        raise TcnnError(safetensors_error(path, e)) from e
    if METADATA_KEY not in metadata:
        raise NotTcnnFileError(f'{path} is a safetensors file without T-CNN settings (a plain state_dict?): '
                               f'convert it with `tcnn convert MODEL --weights {path} --out FILE`')
    try:
        settings = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError as e:
        raise TcnnError(f'{path}: corrupt T-CNN settings in the safetensors metadata ({e})') from e
    if not isinstance(settings, dict):
        raise TcnnError(f'{path}: corrupt T-CNN settings in the safetensors metadata')
    if map_location is not None and not isinstance(map_location, (str, torch.device)):
        raise InvalidArgumentError(f'{path}: map_location of a safetensors file must be a device, got '
                                   f'{type(map_location).__name__}')
    if map_location is not None and torch.device(map_location).type != 'cpu':
        try:
            tensors = {k: v.to(map_location) for k, v in tensors.items()}
        except RuntimeError as e:
            raise TcnnError(f'cannot load {path} onto map_location={map_location!r}: {error_reason(e)}') from e
    return dict(settings, state_dict=tensors)


def read_raw(path: str, map_location: Union[str, torch.device, None]) -> Any:
    """What the file ``path`` holds, not yet validated: a T-CNN dict, a training checkpoint, a checkpoint of timm's
    train.py or a state dict (``read`` validates it; ``tcnn.files.loading.load`` also takes the last two)."""
    path = check_path(path, 'path')
    check_map_location(map_location)
    head = file_head(path, 'T-CNN file')
    if path.lower().endswith('.safetensors') and not head.startswith(ZIP_MAGIC):
        return _read_safetensors(path, map_location)
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        raise TcnnError(f'{path} is not a T-CNN file: neither a torch file nor (by its name) a safetensors file')
    return load_torch_file(path, 'T-CNN file', map_location)


def read(path: str, map_location: Union[str, torch.device, None] = 'cpu', *, ema: bool = False) -> Dict[str, Any]:
    """The validated T-CNN dict stored in ``path`` (a T-CNN file or a training checkpoint), without building the
    model. For a training checkpoint, ``'training'`` holds its ``epoch`` and ``best_top1`` (and ``'weights':
    'ema'`` with ``ema``), ``'recipe'`` its recipe.

    Args:
        path: The file.
        map_location: Where the tensors go (as in ``torch.load``).
        ema: The EMA weights of a training checkpoint (``tcnn train --model-ema``) as the ``state_dict``.

    Raises:
        NotTcnnFileError: A readable file that is not a T-CNN file (e.g. a plain state_dict).
        CorruptFileError: Tensors that do not match the checksums stored with them (``tcnn.files.integrity``).
        TcnnError: Missing, junk or truncated file; unknown format version; ``ema`` and no EMA weights.
    """
    return validated(read_raw(path, map_location), str(path), ema)


def validated(d: Any, where: str, ema: bool) -> Dict[str, Any]:
    """``read``'s checks of what a file held: the T-CNN dict (EMA weights with ``ema``), its checksums verified."""
    d = check_dict(_with_ema(d, where) if ema else d, where)
    verify_checksums(d['state_dict'], d.get(CHECKSUMS_KEY), f'{where} (its EMA weights)' if ema else where)
    return d


def _with_ema(d: Any, where: str) -> Dict[str, Any]:
    """A training checkpoint whose model holds the checkpoint's EMA weights (``'ema'``, ``tcnn train --model-ema``);
    anything else is a one-line error: never the raw weights in their place."""
    if not (isinstance(d, dict) and isinstance(d.get('model_file'), dict)):
        kind = 'a T-CNN file' if isinstance(d, dict) and d.get('format') == FORMAT_NAME else 'not a training checkpoint'
        raise TcnnError(f'{where} is {kind}, which holds no EMA weights: EMA weights are in the checkpoints of '
                        '`tcnn train --model-ema` (RUN/last.pt, RUN/best.pt); load this file without ema / --use-ema')
    ema = d.get('ema')
    if not (isinstance(ema, dict) and ema and all(isinstance(v, torch.Tensor) for v in ema.values())):
        raise TcnnError(f'{where} holds no EMA weights (its run did not use --model-ema): load it without ema / '
                        '--use-ema')
    return dict(d, model_file=dict(d['model_file'], state_dict=ema, **{CHECKSUMS_KEY: d.get(EMA_CHECKSUMS_KEY)}),
                ema_weights=True)
