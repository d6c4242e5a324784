"""``t_*`` models in timm's registry: ``timm.create_model('t_resnet50d')`` is the T-CNN of ``resnet50d``.

One entrypoint is registered per ResNet of timm's ``resnet`` module (``t_resnet18d`` ... ``t_resnetrs420``,
``t_seresnext50_32x4d``, ...), each under its own name with ``register_model`` and with pretrained configs that copy
the source's tags, input sizes, normalisation and crop (T-CNN, arXiv:2106.05795, fine-tunes at the source's data
config), minus the weight locations: there are no converted weights to download. Instead

* ``pretrained=True`` converts the source's pretrained weights on the fly (``tcnn.hub.create_cnn``, which fails
  within seconds offline);
* ``pretrained_cfg_overlay=dict(file=PATH)`` loads a T-CNN file (``tcnn.save``), a training checkpoint, or a plain
  checkpoint of the source CNN (converted on the fly); ``checkpoint_path=PATH`` loads a T-CNN file with timm's own
  loader.

The models are built by timm's ``build_model_with_cfg`` (so ``features_only``, ``out_indices``, ``in_chans``,
``num_classes`` adaptation of pretrained weights etc. are timm's own code) and stay ``ResNet``s: the thin subclass
``TransformedResNet`` only adds ``no_weight_decay()``. Extra keyword arguments: ``stages``, ``locality_strength``,
``gating_init``, ``qk_dim`` (as in ``tcnn.reparameterize``).
"""
import functools
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from timm.models import build_model_with_cfg, generate_default_cfgs, get_arch_pretrained_cfgs, get_pretrained_cfg, \
    is_model, list_models, model_entrypoint, register_model
from timm.models.resnet import ResNet

from .convert import StageSpec, gpsa_layers, reparameterize_
from .errors import TcnnError
from .gpsa import GPSA, match_grouped_storage

__all__ = ['TransformedResNet', 'SOURCE_MODELS', 'T_PREFIX', 'no_weight_decay_names', 'source_model_name',
           'transformed_model_name']

T_PREFIX = 't_'
PAPER_NAME = 'Transformed CNNs: recasting pre-trained convolutional layers with self-attention'
PAPER_ID = 'arXiv:2106.05795'
CONVERSION_ARGS = ('stages', 'locality_strength', 'gating_init', 'qk_dim')
# Parameters of a GPSA layer that are geometry or gates, not weights: no weight decay (T-CNN trains them with
# their own learning rate; ConViT likewise excludes them).
NO_WEIGHT_DECAY_PARAMS = ('pos_centers', 'pos_locality', 'gating')
# Factory kwargs that describe the wrapper or placement, not the architecture (not stored in tcnn_source).
_NON_ARCH_KWARGS = ('features_only', 'out_indices', 'feature_cls', 'feature_cfg', 'flatten_sequential', 'device',
                    'dtype', 'num_classes', 'cache_dir')
# timm's load_pretrained takes its weights from pretrained_cfg; we hand it this placeholder and supply the weights
# in the filter fn, so that a state dict never enters pretrained_cfg (timm deep-copies that dict, tensors included).
_WEIGHTS_PLACEHOLDER = {'tcnn': 'weights supplied by tcnn.models'}


def no_weight_decay_names(model: nn.Module) -> Set[str]:
    """Names of the GPSA positional and gating parameters of ``model`` (timm's ``no_weight_decay()`` contract)."""
    return {f'{name}.{p}' for name, _ in gpsa_layers(model) for p in NO_WEIGHT_DECAY_PARAMS}


class TransformedResNet(ResNet):
    """A timm ``ResNet`` whose k x k convs in ``stages`` are GPSA layers: a T-CNN (arXiv:2106.05795).

    Everything is ``ResNet``'s (forward_features, forward_head, forward_intermediates, feature_info, grad
    checkpointing, TorchScript); this class only adds ``no_weight_decay()`` for timm's optimizer factory.

    Args:
        *args: ``ResNet`` arguments.
        stages: Which stages to convert (``tcnn.convert.resolve_stages``); default the last one.
        locality_strength: Initial alpha of every head (1.0: the paper's fine-tuning init).
        gating_init: Initial lambda of every head (1.0: the paper's fine-tuning init).
        qk_dim: Per-head width of content queries/keys (default ``C_in // heads``, or a grouped conv's group
            width ``C_in // groups`` if smaller).
        **kwargs: ``ResNet`` keyword arguments.
    """

    def __init__(
            self,
            *args,
            stages: StageSpec = None,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            qk_dim: Optional[int] = None,
            **kwargs,
    ):
        super().__init__(*args, **kwargs)
        reparameterize_(self, stages=stages, locality_strength=locality_strength, gating_init=gating_init,
                        qk_dim=qk_dim, verify=False)

    @classmethod
    def from_resnet(
            cls,
            model: ResNet,
            stages: StageSpec = None,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            qk_dim: Optional[int] = None,
    ) -> 'TransformedResNet':
        """Convert a freshly built ``ResNet`` in place and return it as a ``TransformedResNet``.

        timm's entrypoints keep each variant's ``ResNet`` arguments inside the entrypoint, so the registry builds
        the source with its own entrypoint and then re-classes it (the subclass adds no state, only a method: the
        same technique as ``torch.nn.utils.parametrize``).
        """
        if type(model) is not ResNet:
            raise TcnnError(f'expected a timm ResNet, got {type(model).__name__}')
        reparameterize_(model, stages=stages, locality_strength=locality_strength, gating_init=gating_init,
                        qk_dim=qk_dim, verify=False)
        model.__class__ = cls
        return model

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """GPSA centres, locality strengths and gates: exempt from weight decay."""
        return no_weight_decay_names(self)


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


def _file_weights(
        path: str,
        source: str,
        conversion: Dict[str, Any],
        overlay: Dict[str, Any],
) -> Dict[str, torch.Tensor]:
    """Weights from ``pretrained_cfg_overlay['file']``: a T-CNN file / training checkpoint (its conversion settings,
    class count and data config are adopted) or a plain checkpoint of the source CNN (converted by the filter)."""
    from . import io
    from .hub import load_state_dict_file
    try:
        d = io.read(path)
    except io.NotTcnnFileError:
        state_dict = load_state_dict_file(path)
        fc_weight = state_dict.get('fc.weight')
        if fc_weight is not None:
            overlay.setdefault('num_classes', fc_weight.shape[0])
        return state_dict
    file_source = d['source']['model']
    if file_source.split('.')[0] != source:
        raise TcnnError(f'{path} holds a model of {file_source}, not {source}: create '
                        f'{T_PREFIX}{file_source.split(".")[0]} instead (or use tcnn.load)')
    file_conversion = d['conversion'] or {}
    if not file_conversion:
        raise TcnnError(f'{path} holds a plain CNN (no GPSA layers); load it with tcnn.load or timm.create_model'
                        f'({source!r}, checkpoint_path=...)')
    for key in ('stages', 'qk_dim'):
        if conversion.get(key) is not None and _comparable(key, conversion[key]) != \
                _comparable(key, file_conversion[key]):
            raise TcnnError(f'{key}={conversion[key]!r} conflicts with {path} ({key}={file_conversion[key]!r})')
        conversion[key] = file_conversion[key]
    overlay.setdefault('num_classes', d['num_classes'])
    for key, value in (d.get('data_config') or {}).items():
        overlay.setdefault(key, tuple(value) if isinstance(value, list) else value)
    return d['state_dict']


def _comparable(key: str, value: Any) -> Any:
    """Conversion settings in one spelling: stages ``4`` and ``['layer4']`` are the same."""
    if key != 'stages':
        return value
    values = value if isinstance(value, (list, tuple)) else [value]
    return [f'layer{v}' if isinstance(v, int) else str(v) for v in values]


def _pretrained_weights(
        source: str,
        tag: Optional[str],
        conversion: Dict[str, Any],
        overlay: Dict[str, Any],
) -> Dict[str, torch.Tensor]:
    """The weights that ``pretrained=True`` loads (see the module docstring); may update conversion/overlay."""
    if overlay.get('state_dict') is not None:
        return overlay.pop('state_dict')
    if overlay.get('file'):
        return _file_weights(overlay['file'], source, conversion, overlay)
    from .hub import create_cnn  # fails fast offline, naming the alternatives
    name = f'{source}.{tag}' if tag else source
    return create_cnn(name, pretrained=True).state_dict()


# ---------------------------------------------------------------------------------------------- registry


def _build(source: str, conversion: Dict[str, Any], **kwargs) -> TransformedResNet:
    """``model_cls`` for ``build_model_with_cfg``: the source's own entrypoint (random init), converted."""
    cnn = model_entrypoint(source)(pretrained=False, **kwargs)
    return TransformedResNet.from_resnet(cnn, **conversion)


def _resolve_tag(variant: str, pretrained_cfg: Any) -> Optional[str]:
    if isinstance(pretrained_cfg, str):
        return pretrained_cfg
    if isinstance(pretrained_cfg, dict):
        return pretrained_cfg.get('tag')
    if pretrained_cfg is not None:
        return getattr(pretrained_cfg, 'tag', None)
    default = get_pretrained_cfg(variant)
    return default.tag if default is not None else None


def _create_transformed(variant: str, source: str, pretrained: bool = False, **kwargs) -> nn.Module:
    conversion = {k: kwargs.pop(k) for k in CONVERSION_ARGS if k in kwargs}
    overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
    pretrained_cfg = kwargs.pop('pretrained_cfg', None)
    tag = _resolve_tag(variant, pretrained_cfg)
    arch_kwargs = {k: v for k, v in kwargs.items() if k not in _NON_ARCH_KWARGS}
    weights = None
    if pretrained:
        weights = _pretrained_weights(source, tag, conversion, overlay)
        overlay['state_dict'] = _WEIGHTS_PLACEHOLDER
    model = build_model_with_cfg(
        functools.partial(_build, source, conversion), variant, pretrained,
        pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay,
        pretrained_filter_fn=functools.partial(_load_filter, weights=weights), **kwargs)
    model.pretrained_cfg.pop('state_dict', None)
    if not kwargs.get('features_only'):
        # What tcnn.save needs to rebuild the architecture offline (tcnn.hub.create_cnn's convention).
        model.tcnn_source = {'model': f'{source}.{tag}' if tag else source, 'num_classes': model.num_classes,
                             'kwargs': arch_kwargs}
    return model


def _t_cfg(source_cfg: Any) -> Dict[str, Any]:
    """Pretrained config of a T-CNN: the source's data/head config, no weight location, the T-CNN paper."""
    cfg = source_cfg.to_dict(remove_source=True)
    for key in ('state_dict', 'architecture', 'tag', 'custom_load'):
        cfg.pop(key, None)
    source = source_cfg.architecture + (f'.{source_cfg.tag}' if source_cfg.tag else '')
    cfg.update(paper_name=PAPER_NAME, paper_ids=PAPER_ID, notes=(
        f'T-CNN of {source}: pretrained=True converts its weights on the fly; '
        f'pretrained_cfg_overlay=dict(file=...) loads a converted file',))
    return cfg


def transformed_model_name(source: str) -> str:
    """``'resnet50d'`` -> ``'t_resnet50d'`` (tags kept: ``'resnet50d.a1_in1k'`` -> ``'t_resnet50d.a1_in1k'``)."""
    return T_PREFIX + source


def source_model_name(name: str) -> Optional[str]:
    """``'t_resnet50d(.tag)'`` -> ``'resnet50d(.tag)'`` for registered T-CNNs, else None."""
    arch = name.split('.')[0]
    if arch.startswith(T_PREFIX) and arch[len(T_PREFIX):] in SOURCE_MODELS:
        return name[len(T_PREFIX):]
    return None


def _source_models() -> List[str]:
    """Every ResNet of timm's ``resnet`` module (all of them convert: plain or grouped 3x3 convs, zero padding)."""
    return [n for n in list_models(module='resnet') if not is_model(T_PREFIX + n)]


def _make_entrypoint(source: str) -> Callable[..., nn.Module]:
    variant = transformed_model_name(source)

    def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
        return _create_transformed(variant, source, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = variant
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = (f"T-CNN of timm's ``{source}``: its last-stage k x k convs as GPSA layers "
                          '(arXiv:2106.05795). ``pretrained=True`` converts the source weights; see ``tcnn.models``.')
    return entrypoint


def _register_all() -> Tuple[str, ...]:
    sources = _source_models()
    cfgs = {}
    for source in sources:
        for name, cfg in get_arch_pretrained_cfgs(source).items():  # default tag first
            cfgs[transformed_model_name(name)] = _t_cfg(cfg)
    globals()['default_cfgs'] = generate_default_cfgs(cfgs)  # register_model reads the module's default_cfgs
    for source in sources:
        fn = _make_entrypoint(source)
        globals()[fn.__name__] = fn
        register_model(fn)
    return tuple(sources)


SOURCE_MODELS: Tuple[str, ...] = _register_all()


# ---------------------------------------------------------------------------------------------- the demo's CNN

DEMO_MODEL = 'demo_resnet10'


@register_model
def demo_resnet10(pretrained: bool = False, **kwargs) -> ResNet:
    """The small CNN of ``tcnn demo`` (no pretrained weights: the demo trains it from scratch).

    timm's ``ResNet`` with one ``BasicBlock`` per stage, widths 16-32-64-128 (1/4 of ResNet-18's) and output stride
    16: ``layer4`` keeps ``layer3``'s resolution and dilates its 3x3 convs by 2 (timm's ``output_stride``), so at the
    demo's 96 px the last stage sees a 6x6 token grid (stride 32 would leave 3x3, too few for attention to show
    anything). Every argument of ``ResNet`` can be overridden (e.g. ``channels=(32, 64, 128, 256)``); ``tcnn.load``
    rebuilds such a model from the recorded arguments.
    """
    from timm.models.resnet import BasicBlock
    if pretrained:
        raise TcnnError(f'{DEMO_MODEL} has no pretrained weights: tcnn demo trains it from scratch (pass '
                        'pretrained=False, or --weights PATH / --no-pretrained to tcnn train)')
    args = dict(block=BasicBlock, layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16, output_stride=16,
                num_classes=2)
    args.update(kwargs)
    args.pop('pretrained_cfg', None)
    args.pop('pretrained_cfg_overlay', None)
    args.pop('cache_dir', None)
    model = ResNet(**args)
    # what timm's resolve_data_config and tcnn.io read: the demo's images are 96 px, evaluated whole (no crop)
    model.pretrained_cfg = model.default_cfg = {
        'architecture': DEMO_MODEL, 'input_size': (3, 96, 96), 'crop_pct': 1.0, 'interpolation': 'bicubic',
        'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225), 'num_classes': model.num_classes,
        'first_conv': 'conv1', 'classifier': 'fc', 'pool_size': (6, 6)}
    return model
