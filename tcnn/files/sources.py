"""Where a source CNN comes from: timm and torchvision builders by name (``torchvision:NAME``), with pretrained,
local or random weights, the names of T-CNNs (``t_NAME``), the network probes that make offline use fail fast, and
what tcnn records on the models it creates (``tcnn_source``).

Offline behaviour matters here: timm alone retries a download for the better part of a minute before failing. We
look in the local caches first, then probe the weight host with a short timeout, and fail within seconds with a
``WeightsUnavailableError`` whose message names the Python fix (``pretrained=False``, or local weights through
``weights=``/``pretrained_cfg_overlay=dict(file=...)``); the commands re-word it with their flags
(``--weights``/``--no-pretrained``) through ``WeightsUnavailableError.with_hint``.

A local checkpoint given as ``weights=`` is read by ``tcnn.files.weights`` (weight files). timm and torchvision are
imported inside the functions that use them: importing timm makes ``tcnn`` register its ``t_*`` models, and
``tcnn.models`` imports this module, which must therefore be complete before timm loads (torchvision's import also
costs time that the CLI's argument checks should not pay).
"""
import difflib
import functools
import os
import socket
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number
from .weights import (checkpoint_num_classes, gpsa_layer_names, load_state_dict_file, state_dict_misfit,
                      strip_wrapper_prefix)

__all__ = ['TORCHVISION_PREFIX', 'T_PREFIX', 'split_model_name', 'transformed_model_name', 'source_model_name',
           'create_cnn', 'record_source', 'classifier_layer', 'classifier_names', 'file_weights_origin',
           'hub_unreachable', 'WeightsUnavailableError', 'PYTHON_HINT', 'CLI_HINT', 'OFFLINE_HINT', 'DENSE_TASKS',
           'FROZEN_BN_KEY', 'torchvision_task', 'model_task', 'dense_num_classes', 'dense_source_kwargs',
           'freeze_batchnorm', 'model_keys']

TORCHVISION_PREFIX = 'torchvision:'
# torchvision's model modules besides classification whose builders tcnn creates by name (torchvision:NAME)
DENSE_TASKS = ('detection', 'segmentation')
T_PREFIX = 't_'  # the T-CNN of timm's NAME is registered as t_NAME (tcnn.models)
# What to do without the pretrained weights, in the caller's terms: Python arguments, or the flags of tcnn
# convert/train (which translate the error, see WeightsUnavailableError.with_hint).
PYTHON_HINT = ('pass pretrained=False (random init) or local weights: timm.create_model(..., '
               'pretrained_cfg_overlay=dict(file=PATH)), tcnn.files.sources.create_cnn(..., weights=PATH), or '
               'tcnn.load(PATH) for a saved T-CNN')
CLI_HINT = 'pass --weights PATH (a local checkpoint) or --no-pretrained (random init)'
OFFLINE_HINT = CLI_HINT  # the name of CLI_HINT before it had a Python counterpart; kept for existing callers
PROBE_TIMEOUT_S = 3.0


class WeightsUnavailableError(TcnnError):
    """Pretrained weights cannot be had (offline and not cached, no weights published, a failed download).

    The message is ``REASON: HINT``. ``hint`` defaults to the Python fix (``PYTHON_HINT``); a command that reaches
    ``create_cnn`` re-raises ``error.with_hint(CLI_HINT)`` so that its user reads the flags instead.

    Attributes:
        reason: What went wrong, without the fix.
        hint: The fix, in the caller's terms.
    """

    def __init__(self, reason: str, hint: str = PYTHON_HINT):
        self.reason = reason
        self.hint = hint
        super().__init__(f'{reason}: {hint}')

    def __reduce__(self):  # pickles (e.g. from a worker process) with both parts, not the joined message
        return type(self), (self.reason, self.hint)

    def with_hint(self, hint: str) -> 'WeightsUnavailableError':
        """The same error with another fix, e.g. ``CLI_HINT`` for the commands."""
        return type(self)(self.reason, hint)


def split_model_name(name: str) -> Tuple[str, str]:
    """``'torchvision:resnet50'`` -> ``('torchvision', 'resnet50')``; anything else is a timm name."""
    if name.startswith(TORCHVISION_PREFIX):
        return 'torchvision', name[len(TORCHVISION_PREFIX):]
    return 'timm', name


def transformed_model_name(source: str) -> str:
    """``'resnet50d'`` -> ``'t_resnet50d'`` (tags kept: ``'resnet50d.a1_in1k'`` -> ``'t_resnet50d.a1_in1k'``)."""
    return T_PREFIX + source


def source_model_name(name: str) -> Optional[str]:
    """``'t_resnet50d(.tag)'`` -> ``'resnet50d(.tag)'`` when timm's registry holds that T-CNN (``tcnn.models``
    registers them), else None."""
    import timm  # see the module docstring: not at the top
    arch = name.split('.')[0]
    if not arch.startswith(T_PREFIX) or not timm.is_model(arch):
        return None
    return name[len(T_PREFIX):] if timm.models.model_entrypoint(arch).__module__ == 'tcnn.models' else None


def _close_matches(name: str, candidates: List[str]) -> str:
    matches = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    return f' (did you mean: {", ".join(matches)}?)' if matches else ''


@functools.lru_cache(maxsize=None)
def _torchvision_names() -> Dict[str, str]:
    """The builders tcnn creates by ``torchvision:NAME``, by name: their task (``'classification'``,
    ``'detection'``, ``'segmentation'``)."""
    import torchvision
    names = {n: 'classification' for n in torchvision.models.list_models(module=torchvision.models)}
    for task in DENSE_TASKS:
        names.update((n, task) for n in torchvision.models.list_models(module=getattr(torchvision.models, task)))
    return names


def torchvision_task(name: str) -> Optional[str]:
    """The task of the torchvision builder ``'torchvision:NAME'`` (``'classification'``, ``'detection'``,
    ``'segmentation'``), None for anything else (a timm name, an unknown builder)."""
    if not isinstance(name, str):
        return None
    source, arch = split_model_name(name)
    return _torchvision_names().get(arch) if source == 'torchvision' else None


def model_task(model: nn.Module) -> Optional[str]:
    """``'detection'`` or ``'segmentation'`` for a torchvision detection or segmentation model (by its class, so
    that one the user built counts too), None for anything else."""
    module = type(model).__module__
    return next((task for task in DENSE_TASKS if module.startswith(f'torchvision.models.{task}')), None)


def _check_known(source: str, arch: str) -> None:
    if source == 'torchvision':
        names = list(_torchvision_names())
        if arch not in names:
            raise TcnnError(f'unknown torchvision model {arch!r}{_close_matches(arch, names)}')
        return
    import timm
    if not timm.is_model(arch):
        names = timm.list_models()
        hint = _close_matches(arch, names)
        if not hint and arch.split('.')[0] != arch and timm.is_model(arch.split('.')[0]):
            return  # a tagged name ('resnet50d.ra2_in1k') of a known architecture
        raise TcnnError(f'unknown timm model {arch!r}{hint}; torchvision models are named torchvision:NAME')


def _host_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == 'https' else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_env() -> bool:
    return os.environ.get('HF_HUB_OFFLINE', '0').lower() in ('1', 'true', 'yes', 'on')


def hub_unreachable() -> Optional[str]:
    """Why the Hugging Face Hub cannot be reached now (offline mode, or no answer within ``PROBE_TIMEOUT_S``), or
    None: callers fail in seconds instead of after huggingface_hub's retries."""
    if _offline_env():
        return 'HF_HUB_OFFLINE is set (offline mode)'
    endpoint = os.environ.get('HF_ENDPOINT', 'https://huggingface.co')
    return None if _host_reachable(endpoint) else f'{endpoint} is not reachable (offline?)'


def _cached_timm_file(pretrained_cfg: Dict[str, Any]) -> Optional[str]:
    """A locally cached weight file for a timm pretrained config, if any (hub cache or torch hub cache)."""
    hub_id = pretrained_cfg.get('hf_hub_id')
    if hub_id:
        try:
            from huggingface_hub import try_to_load_from_cache
            for filename in ('open_clip_model.safetensors', 'model.safetensors', 'pytorch_model.bin'):
                path = try_to_load_from_cache(hub_id, filename)
                if isinstance(path, str):
                    return path
        except ImportError:
            pass
    url = pretrained_cfg.get('url')
    if url:
        path = os.path.join(torch.hub.get_dir(), 'checkpoints', os.path.basename(urllib.parse.urlparse(url).path))
        if os.path.isfile(path):
            return path
    return None


def _create_timm(arch: str, pretrained: bool, **kwargs) -> nn.Module:
    import timm
    if not pretrained:
        return timm.create_model(arch, pretrained=False, **kwargs)
    cfg = timm.models.get_pretrained_cfg(arch.split('.')[0] if '.' not in arch else arch)
    cfg = cfg.to_dict() if cfg is not None else {}
    if not (cfg.get('hf_hub_id') or cfg.get('url') or cfg.get('file')):
        raise WeightsUnavailableError(f'timm has no pretrained weights for {arch!r}')
    cached = _cached_timm_file(cfg)
    if cached:
        overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {}, file=cached)
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    host = 'https://huggingface.co' if cfg.get('hf_hub_id') else cfg['url']
    host = os.environ.get('HF_ENDPOINT', host) if cfg.get('hf_hub_id') else host
    if _offline_env() or not _host_reachable(host):
        raise WeightsUnavailableError(f'cannot download pretrained weights for {arch!r} (offline, not in the local '
                                      'cache)')
    try:
        return timm.create_model(arch, pretrained=True, **kwargs)
    except Exception as e:  # network errors come in many types (requests, urllib, hub)
        reason = ' '.join(str(e).split())[:200] or type(e).__name__
        raise WeightsUnavailableError(f'downloading pretrained weights for {arch!r} failed ({type(e).__name__}: '
                                      f'{reason})') from e


def classifier_layer(model: nn.Module) -> Tuple[str, Optional[nn.Linear]]:
    """``(name, layer)`` of a torchvision model's classifier: its last ``nn.Linear`` (``fc`` of ResNets,
    ``classifier.1`` of EfficientNets, ``classifier.2`` of ConvNeXts), or ``('', None)``."""
    return next(((n, m) for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear)), ('', None))


def _torchvision_pretrained(arch: str, **kwargs) -> nn.Module:
    """torchvision's model ``arch`` with its default weights, from torch hub's cache or downloaded."""
    import torchvision
    weights = torchvision.models.get_model_weights(arch).DEFAULT
    cached = os.path.join(torch.hub.get_dir(), 'checkpoints', os.path.basename(weights.url))
    if not os.path.isfile(cached) and not _host_reachable(weights.url):
        raise WeightsUnavailableError(f'cannot download pretrained weights for torchvision:{arch} (offline, not in '
                                      'the local cache)')
    try:
        return torchvision.models.get_model(arch, weights=weights, **kwargs)
    except (TypeError, ValueError):
        raise  # the caller's arguments, not the download
    except Exception as e:
        reason = ' '.join(str(e).split())[:200] or type(e).__name__
        raise WeightsUnavailableError(f'downloading pretrained weights for torchvision:{arch} failed '
                                      f'({type(e).__name__}: {reason})') from e


def _create_torchvision(arch: str, pretrained: bool, num_classes: Optional[int] = None,
                        kwargs: Optional[Dict[str, Any]] = None) -> nn.Module:
    import torchvision
    if torchvision_task(TORCHVISION_PREFIX + arch) in DENSE_TASKS:
        return _create_dense(arch, pretrained, num_classes, kwargs if kwargs is not None else {})
    if not pretrained:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes or 1000)
    model = _torchvision_pretrained(arch)
    name, head = classifier_layer(model)
    if num_classes is not None and head is not None and num_classes != head.out_features:
        model.set_submodule(name, nn.Linear(head.in_features, num_classes, bias=head.bias is not None))
    return model


# The option tcnn adds to torchvision's detection builders: a builder given weights freezes its backbone's batch
# norms (FrozenBatchNorm2d, eps 0 for some weights), and tcnn rebuilds such a model without them (its file holds
# the weights) from this option: the frozen batch norms' eps
FROZEN_BN_KEY = 'frozen_batchnorm'
_CHOSEN_BY_TCNN = ('weights', 'weights_backbone', 'progress')


def _create_dense(arch: str, pretrained: bool, num_classes: Optional[int], kwargs: Dict[str, Any]) -> nn.Module:
    """A torchvision detection or segmentation model; ``kwargs`` (the builder's arguments, updated in place) gain
    what torchvision's weights imply (``frozen_batchnorm``, ``aux_loss``): they rebuild the model without them."""
    import torchvision
    name = TORCHVISION_PREFIX + arch
    chosen = sorted(k for k in _CHOSEN_BY_TCNN if k in kwargs)
    if chosen:
        raise InvalidArgumentError(f'{", ".join(chosen)} of {name} are tcnn\'s to choose: pass pretrained=True '
                                   "(torchvision's weights), pretrained=False (random init) or weights=PATH")
    frozen_eps = kwargs.get(FROZEN_BN_KEY)
    if frozen_eps is not None and (isinstance(frozen_eps, bool) or not isinstance(frozen_eps, (int, float))):
        raise InvalidTypeError(f'{FROZEN_BN_KEY} of {name} is the eps of its frozen batch norms (a number), got '
                               f'{frozen_eps!r}')
    build = {k: v for k, v in kwargs.items() if k != FROZEN_BN_KEY}
    trainable = build.pop('trainable_backbone_layers', None) if frozen_eps is not None else None
    if num_classes is not None:
        build['num_classes'] = num_classes
    try:
        if pretrained:
            model = _torchvision_pretrained(arch, **build)
        else:
            model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, **build)
    except (TypeError, ValueError) as e:  # an argument the builder does not take, a class count its weights fix
        fix = ('pass pretrained=False (--no-pretrained) for another class count' if 'num_classes' in str(e) else
               f'see the arguments of torchvision.models.{torchvision_task(name)}.{arch}')
        raise TcnnError(f'{name} with {build}: {" ".join(str(e).split())[:200]}; {fix}') from e
    if frozen_eps is not None:
        freeze_batchnorm(model, float(frozen_eps), trainable)
    kwargs.update(dense_source_kwargs(model, kwargs))
    return model


def freeze_batchnorm(model: nn.Module, eps: float, trainable_layers: Optional[int] = None) -> None:
    """What torchvision's detection builders do to a backbone given weights: every batch norm of ``model.backbone``
    frozen (``FrozenBatchNorm2d`` with ``eps``) and, in a ResNet, the parameters of all but the last
    ``trainable_layers`` layers (default 3, as torchvision's) frozen."""
    from torchvision.ops.misc import FrozenBatchNorm2d
    backbone = model.backbone
    for name, module in list(backbone.named_modules()):
        if isinstance(module, nn.BatchNorm2d):
            backbone.set_submodule(name, FrozenBatchNorm2d(module.num_features, eps=eps))
        elif isinstance(module, FrozenBatchNorm2d):
            module.eps = eps
    body = getattr(backbone, 'body', None)
    if body is not None and hasattr(body, 'layer4'):  # torchvision's _resnet_fpn_extractor
        trainable = 3 if trainable_layers is None else int(trainable_layers)
        layers = ['layer4', 'layer3', 'layer2', 'layer1', 'conv1'][:trainable] + (['bn1'] if trainable == 5 else [])
        for name, parameter in body.named_parameters():
            if not name.startswith(tuple(layers)):
                parameter.requires_grad_(False)


def dense_source_kwargs(model: nn.Module, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` (the builder arguments of a torchvision detection or segmentation model) with what its state dict
    and modules show torchvision's weights implied: ``frozen_batchnorm`` (the eps of its backbone's
    ``FrozenBatchNorm2d``) and, for segmentation, ``aux_loss``; the arguments given win."""
    from torchvision.ops.misc import FrozenBatchNorm2d
    found: Dict[str, Any] = {}
    backbone = getattr(model, 'backbone', None)
    frozen = [m for m in backbone.modules() if isinstance(m, FrozenBatchNorm2d)] if backbone is not None else []
    if frozen:
        found[FROZEN_BN_KEY] = float(frozen[0].eps)
    if model_task(model) == 'segmentation' and hasattr(model, 'aux_classifier'):
        found['aux_loss'] = model.aux_classifier is not None
    return dict(found, **kwargs)


def dense_num_classes(model: nn.Module) -> Optional[int]:
    """The class count of a torchvision detection or segmentation model (background included), from its head;
    None if the head is not one of torchvision's."""
    predictor = getattr(getattr(model, 'roi_heads', None), 'box_predictor', None)
    if isinstance(getattr(predictor, 'cls_score', None), nn.Linear):  # Faster/Mask/Keypoint R-CNN
        return predictor.cls_score.out_features
    head = getattr(getattr(model, 'head', None), 'classification_head', None)
    classes = getattr(head, 'num_classes', None)
    if isinstance(classes, int):  # RetinaNet, FCOS
        return classes
    from torchvision.models.detection.ssd import SSDClassificationHead
    from torchvision.models.detection.ssdlite import SSDLiteClassificationHead
    if isinstance(head, (SSDClassificationHead, SSDLiteClassificationHead)):  # SSD, SSDlite: a score per class
        return head.num_columns
    classifier = getattr(model, 'classifier', None)
    if isinstance(classifier, nn.Module) and model_task(model) == 'segmentation':
        convs = [m for m in classifier.modules() if isinstance(m, nn.Conv2d)]  # FCN, DeepLabV3, LRASPP: the last
        return convs[-1].out_channels if convs else None
    return None


def classifier_names(name: str) -> Tuple[str, ...]:
    """Module names of a model's classifier head, from its name alone (no weights, nothing downloaded): timm's
    ``pretrained_cfg['classifier']`` (``fc``, ``head.fc``, ``classifier``; distilled models have two), a torchvision
    model's last ``nn.Linear`` (built on the meta device), ``()`` when unknown."""
    source, arch = split_model_name(name)
    try:
        if source == 'torchvision':
            import torchvision
            if torchvision_task(name) in DENSE_TASKS:
                return ()  # no classifier layer: box predictors, per-anchor or per-pixel convs
            with torch.device('meta'):
                head, layer = classifier_layer(torchvision.models.get_model(arch, weights=None))
            return (head,) if layer is not None else ()
        import timm
        cfg = timm.models.get_pretrained_cfg(arch)
    except (ValueError, KeyError, RuntimeError, TypeError, AttributeError):  # an unknown or unusual model: no head
        return ()
    classifier = getattr(cfg, 'classifier', None) if cfg is not None else None
    if isinstance(classifier, str):
        return (classifier,)
    return tuple(classifier) if isinstance(classifier, (list, tuple)) else ('fc',)


def _load_weights(model: nn.Module, sd: Dict[str, torch.Tensor], path: str, name: str,
                  classifiers: Sequence[str], note: str = '') -> None:
    misfit = state_dict_misfit(model, sd, optional=tuple(f'{c}.' for c in classifiers))
    if misfit and gpsa_layer_names(sd) and split_model_name(name)[0] == 'timm':
        t_name = transformed_model_name(name.split('.')[0])
        raise TcnnError(f'{path} holds the weights of a T-CNN (GPSA layers), not of the CNN {name}: make a T-CNN file '
                        f'of them with `tcnn convert {t_name} --weights {path} --out FILE`')
    if misfit:
        raise TcnnError(f'{path} does not fit {name}{note}: {misfit}')
    # a head of another class count (an explicit num_classes, warned about): keep the backbone, leave the new head at
    # its init
    expected = model.state_dict()
    model.load_state_dict({k: v for k, v in sd.items() if k in expected and expected[k].shape == v.shape},
                          strict=False)


def model_keys(name: str, kwargs: Dict[str, Any]) -> List[str]:
    """The state-dict keys of the model ``name`` (``create_cnn``'s names, ``t_*`` timm models too) built with
    ``kwargs``, on the meta device: no weights, nothing downloaded (``strip_wrapper_prefix``'s reference)."""
    source, arch = split_model_name(name)
    with torch.device('meta'):
        if source == 'torchvision':
            return list(_create_torchvision(arch, False, None, kwargs).state_dict())
        return list(_create_timm(arch, False, **{k: v for k, v in kwargs.items() if k != 'pretrained_cfg_overlay'})
                    .state_dict())


def create_cnn(
        name: str,
        *,
        pretrained: bool = True,
        weights: Optional[str] = None,
        num_classes: Optional[int] = None,
        use_ema: bool = False,
        classes_of: Optional[str] = None,
        **kwargs,
) -> nn.Module:
    """Create a source CNN by name, failing fast and clearly when weights cannot be had.

    Args:
        name: A timm model name (``'resnet50d'``, ``'resnetrs50'``, tags allowed) or ``'torchvision:NAME'``.
        pretrained: Load the library's pretrained weights (from the local cache, else the network).
        weights: Path of a local checkpoint to load instead (``.pt``/``.pth``/``.safetensors``; plain or wrapped
            state_dict, e.g. Lightning's, whose keys' ``model.`` prefix is removed when without it they are the
            model's: ``strip_wrapper_prefix``). Takes precedence over ``pretrained``.
        num_classes: Classifier size; default the head of ``weights`` (else the model's default). A head of
            ``weights`` with another size is dropped for a new random one, with a warning naming it.
        use_ema: Load the EMA weights of ``weights`` (``state_dict_ema``/``model_ema``) instead of its raw
            ``state_dict``; an error if it has none.
        classes_of: Whose class count ``num_classes`` is, for the warning about a dropped head (``"the data's"``);
            default: the caller's ``num_classes``.
        **kwargs: Passed to ``timm.create_model`` (e.g. ``drop_path_rate``, ``in_chans``) or to a torchvision
            detection or segmentation builder (e.g. ``min_size``, ``aux_loss``; ``frozen_batchnorm=EPS``: the
            backbone's batch norms frozen as torchvision's weights freeze them).

    Raises:
        WeightsUnavailableError: ``pretrained`` weights cannot be had (offline and not cached, none published, a
            failed download); the message names the Python fix, ``with_hint(CLI_HINT)`` the CLI flags.
        TcnnError: Unknown name (with close matches), unreadable/mismatched file.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTypeError(f'name must be a model name (e.g. \'resnet50d\' or \'torchvision:resnet50\'), got '
                               f'{name!r}')
    if num_classes is not None:
        check_number(num_classes, 'num_classes', ge=0, integer=True)
    if weights is not None and not isinstance(weights, (str, os.PathLike)):
        raise InvalidTypeError(f'weights must be a file path, got {type(weights).__name__}')
    source, arch = split_model_name(name)
    _check_known(source, arch)
    sd, classifiers = None, ()
    note = ''
    if weights is not None:  # read first: the class count of the checkpoint's head decides the model's
        sd = load_state_dict_file(os.fspath(weights), use_ema=use_ema)
        sd, note = strip_wrapper_prefix(sd, lambda: model_keys(name, kwargs))
        classifiers = classifier_names(name)
        num_classes = checkpoint_num_classes(sd, classifiers, num_classes, where=os.fspath(weights),
                                             classes_of=classes_of)
    elif use_ema:
        raise InvalidArgumentError('use_ema=True needs weights=PATH (a checkpoint holding EMA weights)')
    if source == 'torchvision':
        if kwargs and torchvision_task(name) not in DENSE_TASKS:
            raise TcnnError(f'options {sorted(kwargs)} are for timm models and torchvision\'s detection and '
                            f'segmentation builders; not supported for {name}')
        model = _create_torchvision(arch, pretrained and weights is None, num_classes, kwargs)
    else:
        if num_classes is not None:
            kwargs['num_classes'] = num_classes
        model = _create_timm(arch, pretrained and weights is None, **kwargs)
    if sd is not None:
        _load_weights(model, sd, os.fspath(weights), name, classifiers, note)
    kwargs = {k: v for k, v in kwargs.items() if k not in ('num_classes', 'pretrained_cfg_overlay')}
    origin = file_weights_origin(weights) if weights is not None else 'pretrained' if pretrained else 'random'
    return record_source(model, name, num_classes, kwargs, origin)


# ---------------------------------------------------------------------------------------------- model attributes
# What tcnn records on the models it creates, converts or loads, as plain Python values (tcnn.save stores them, so
# that tcnn.load rebuilds the model offline):
#   tcnn_source  {'model': NAME, 'num_classes': int or None, 'kwargs': {...}, 'weights': ORIGIN}: the create_cnn
#                arguments that rebuild the architecture (set by create_cnn, the t_* registry and tcnn.load, through
#                record_source) and where the source CNN's weights came from: 'pretrained' (the library's weights of
#                NAME), 'random', 'file:BASENAME' (a local checkpoint), or None (not recorded);
#   tcnn_config  the conversion settings {'architecture', 'stages', 'layers', 'locality_strength', 'gating_init',
#                'qk_dim'} (set by tcnn.reparameterize and tcnn.load);
#   tcnn_report  the EquivalenceReport of a verified conversion (tcnn.reparameterize with verify=True).


def record_source(
        model: nn.Module,
        name: str,
        num_classes: Optional[int],
        kwargs: Dict[str, Any],
        weights: Optional[str] = None,
) -> nn.Module:
    """Record how to rebuild ``model``'s architecture offline and where its source's weights came from
    (``tcnn_source``, see above); returns the model."""
    model.tcnn_source = {'model': name, 'num_classes': num_classes, 'kwargs': dict(kwargs), 'weights': weights}
    return model


def file_weights_origin(path: Union[str, os.PathLike]) -> str:
    """``tcnn_source['weights']`` of weights read from a local checkpoint: its file name (the folder is the user's
    machine's, not the model's)."""
    return f'file:{os.path.basename(os.fspath(path))}'
