"""Stage discovery: which k x k convs of a CNN a conversion replaces, and which of them it can reproduce exactly.

A "stage" is a submodule whose k x k convs become GPSA layers. Candidates come from the model's own layout: ResNet
``layer1``-``layer4`` (of a torchvision detection or segmentation model's ResNet too: ``backbone.body.layer4``,
``backbone.layer4``); else timm's ``feature_info`` (its modules, and every child of an indexed container one of
them lives in, e.g. all of ``blocks.*`` when feature_info names ``blocks.4`` and ``blocks.6``); else the children
of a known container (torchvision ``features``, ``trunk_output``). An int ``i`` names a resolution level: the
stages whose output is at 1/2**(i+1) of the input, which is ResNet's ``layer{i}`` (level 0 is a stride-2 stem).
"""
import dataclasses
import fnmatch
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import InvalidArgumentError, TcnnError, check_module, check_size
from ..layers.gpsa import GPSA
from .settings import StageSpec, eval_mode

__all__ = ['ConversionError', 'STAGE_NAMES', 'model_name', 'default_input_size', 'stage_candidates', 'probe_stages',
           'stage_levels', 'default_stage', 'resolve_stages', 'StageRow', 'list_stages', 'stage_convs',
           'find_convertible_convs']

STAGE_NAMES = ('layer1', 'layer2', 'layer3', 'layer4')
PATTERN_CHARS = '*?['
# children of these containers are the stages of models without feature_info (torchvision's layouts)
STAGE_CONTAINERS = ('trunk_output', 'stages', 'features', 'blocks', 'layers')
LEVEL_PROBE_SIZE = 128


# k x k convs that are not nn.Conv2d: found so that they are refused by name, never skipped silently
_OTHER_CONVS = ('CondConv2d',)


class ConversionError(TcnnError, ValueError):
    """A model or layer cannot be turned into an exactly equivalent T-CNN."""


def model_name(model: nn.Module) -> str:
    """The CNN's name in messages: its source model (a T-CNN), timm architecture, or class name."""
    source = getattr(model, 'tcnn_source', None)
    if source:
        return source['model']
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    return cfg.get('architecture') or type(model).__name__


def default_input_size(model: nn.Module) -> Tuple[int, int, int]:
    """The model's pretrained input size ``(C, H, W)``, ``(3, 224, 224)`` without one."""
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    return tuple(cfg.get('input_size', (3, 224, 224)))


def _is_kxk_conv(module: nn.Module) -> bool:
    if not isinstance(module, nn.Conv2d) and type(module).__name__ not in _OTHER_CONVS:
        return False
    return module.kernel_size[0] * module.kernel_size[1] > 1


def _level(reduction: float) -> int:
    """Resolution level of a feature map at ``reduction`` (4 -> 1 ... 32 -> 4: ResNet's ``layer{i}``)."""
    return round(math.log2(max(reduction, 1))) - 1


# where torchvision's detection (backbone.body) and segmentation (backbone) models keep their ResNet's layers
TRUNKS = ('', 'backbone.body.', 'backbone.')


def _resnet_prefix(model: nn.Module) -> str:
    """The module path of the ResNet inside ``model`` (``''``, ``'backbone.body.'``, ``'backbone.'``), ``''`` if
    none."""
    modules = dict(model.named_modules())
    return next((p for p in TRUNKS if isinstance(modules.get(p + STAGE_NAMES[-1]), nn.Module)), '')


def _resnet_stages(model: nn.Module) -> List[str]:
    """``layer1``-``layer4`` of a ResNet, or of the ResNet of a torchvision detection or segmentation model
    (``backbone.body.layer4``, ``backbone.layer4``)."""
    modules, prefix = dict(model.named_modules()), _resnet_prefix(model)
    return [prefix + n for n in STAGE_NAMES if isinstance(modules.get(prefix + n), nn.Module)]


def _feature_info_stages(model: nn.Module, modules: Dict[str, nn.Module]) -> List[Tuple[str, Optional[int]]]:
    info = getattr(model, 'feature_info', None)
    entries = getattr(info, 'info', info)  # a list of dicts, or timm's FeatureInfo on features_only models
    if not isinstance(entries, (list, tuple)):
        return []
    # timm's FeatureListNet / FeatureDictNet flatten nested Sequentials: feature_info's 'stages.3' is 'stages_3'
    entries = [(_module_in(e.get('module'), modules), e.get('reduction')) for e in entries if isinstance(e, dict)]
    entries = [(name, reduction) for name, reduction in entries if name]
    names = set()
    for name, _ in entries:
        names.add(name)
        parent, _, last = name.rpartition('.')
        if last.isdigit() and parent and isinstance(modules[parent], (nn.Sequential, nn.ModuleList)):
            names.update(f'{parent}.{child}' for child, _ in modules[parent].named_children())
    order = {name: i for i, name in enumerate(modules)}
    # feature_info names the last module of each resolution, so a stage is at the level of the next entry
    marks = sorted((order[n], _level(r) if r else None) for n, r in entries)
    return [(n, next((lvl for pos, lvl in marks if pos >= order[n]), marks[-1][1]))
            for n in sorted(names, key=order.__getitem__)]


def _module_in(name: Any, modules: Dict[str, nn.Module]) -> Optional[str]:
    """``name`` as the model names it: itself, or flattened by timm's feature wrappers (``stages.3`` as
    ``stages_3``); None when neither is a module of the model (or ``name`` is the root or not a name)."""
    if not isinstance(name, str) or not name:
        return None
    return next((n for n in (name, name.replace('.', '_')) if n in modules), None)


def _container_stages(modules: Dict[str, nn.Module]) -> List[str]:
    for container in STAGE_CONTAINERS:
        module = modules.get(container)
        if isinstance(module, (nn.Sequential, nn.ModuleList)) and len(module):
            return [f'{container}.{child}' for child, _ in module.named_children()]
    return []


def stage_candidates(model: nn.Module) -> List[Tuple[str, Optional[int]]]:
    """The model's own stages, in module order, with their resolution level (None where only a forward tells).

    ResNets: ``layer1``-``layer4`` (levels 1-4); timm models: from ``feature_info``; others (torchvision) the
    children of ``features``/``trunk_output``/... (levels: ``stage_levels``).
    """
    resnet = _resnet_stages(model)
    if resnet:
        return [(n, int(n[-1])) for n in resnet]
    modules = dict(model.named_modules())
    return _feature_info_stages(model, modules) or [(n, None) for n in _container_stages(modules)]


@torch.no_grad()
def probe_stages(
        model: nn.Module,
        names: Sequence[str],
        input_size: Sequence[int],
) -> Dict[str, Dict[str, Any]]:
    """Input/output channels and grids of the named modules on one random image (forward hooks, eval mode).

    Returns:
        ``{name: {'in_chs', 'out_chs', 'in_grid', 'out_grid', 'level'}}`` for the modules that saw a 4-D tensor.
    """
    found: Dict[str, Dict[str, Any]] = {}

    def hook(name: str) -> Callable:
        def record(module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
            x = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if name in found or not isinstance(output, torch.Tensor) or output.ndim != 4 or x is None or x.ndim != 4:
                return
            found[name] = {'in_chs': x.shape[1], 'out_chs': output.shape[1], 'in_grid': tuple(x.shape[-2:]),
                           'out_grid': tuple(output.shape[-2:]),
                           'level': _level(input_size[-2] / output.shape[-2])}
        return record

    param = next(model.parameters(), None)
    x = torch.randn(1, *input_size, generator=torch.Generator().manual_seed(0))
    if param is not None:
        x = x.to(device=param.device, dtype=param.dtype)
    handles = []
    try:  # the hooks and every module's mode are undone on every exit path
        handles.extend(model.get_submodule(n).register_forward_hook(hook(n)) for n in names)
        with eval_mode(model):
            model(x)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:  # an image smaller than the network's strides, a wrong channel count
        raise InvalidArgumentError(f'input_size {tuple(input_size)} does not fit {model_name(model)}: '
                                   f'{" ".join(str(e).split())[:200]}') from e
    finally:
        for h in handles:
            h.remove()
    return found


def stage_levels(model: nn.Module) -> List[Tuple[str, Optional[int]]]:
    """``stage_candidates`` with every level known: layouts without one are measured by a forward pass."""
    candidates = stage_candidates(model)
    if all(level is not None for _, level in candidates):
        return candidates
    first = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if first is None:  # no image input to probe with (and no conv to convert)
        return candidates
    probed = probe_stages(model, [n for n, _ in candidates], (first.in_channels, LEVEL_PROBE_SIZE, LEVEL_PROBE_SIZE))
    return [(n, probed[n]['level'] if n in probed else None) for n, _ in candidates]


def _has_kxk_conv(module: nn.Module) -> bool:
    # a GPSA layer counts: the default stage of a converted model stays the one that was converted
    return any(_is_kxk_conv(m) or isinstance(m, GPSA) for m in module.modules())


def default_stage(model: nn.Module) -> str:
    """The stage converted by default: the last stage that holds a k x k conv, never the stem (ResNets: ``layer4``,
    the paper's last stage; MobileNetV3-large's last block is a 1x1 conv: ``blocks.5``)."""
    candidates = stage_candidates(model)
    has_levels = all(level is not None for _, level in candidates)
    # the stem (level 0 in feature_info, else the first child of a container) runs at full resolution: not a default
    stages = [n for i, (n, level) in enumerate(candidates) if (level > 0 if has_levels else i > 0)]
    for name in reversed(stages):
        if _has_kxk_conv(model.get_submodule(name)):
            return name
    searched = f'; its stages {_names_text([n for n, _ in candidates])} have none' if candidates else ''
    raise ConversionError(
        f'{model_name(model)} has no stage with a k x k convolution (searched for {", ".join(STAGE_NAMES)}, '
        f'timm\'s feature_info and {"/".join(STAGE_CONTAINERS)}{searched}): pass stages=[...] naming the modules '
        'whose k x k convs to replace')


def _names_text(names: Sequence[str], most: int = 8) -> str:
    """``a, b, c``; long lists by their ends (``blocks.0, blocks.1, ..., blocks.11 (12)``): errors stay one line."""
    if len(names) <= most:
        return ', '.join(names)
    return f'{", ".join(names[:most // 2])}, ..., {", ".join(names[-(most // 2):])} ({len(names)})'


def _candidates_text(model: nn.Module) -> str:
    candidates = stage_candidates(model)
    if not candidates:
        return 'it has no known stages; name any module path or pattern'
    return f'stages of {model_name(model)}: {_names_text([n for n, _ in candidates])}'


def _resolve_one(model: nn.Module, stage: Union[int, str], modules: Dict[str, nn.Module]) -> List[str]:
    if isinstance(stage, int):
        if _resnet_stages(model):
            name = f'{_resnet_prefix(model)}layer{stage}'
            if name not in modules:
                raise ConversionError(f'{model_name(model)} has no submodule {name!r} (stage given as {stage!r}); '
                                      f'{_candidates_text(model)}')
            return [name]
        levels = stage_levels(model)
        names = [n for n, level in levels if level == stage]
        if not names:
            known = _names_text([f'{n} ({level})' for n, level in levels if level is not None]) or 'none'
            raise ConversionError(f'{model_name(model)} has no stage at level {stage} (an int i is the resolution '
                                  f'1/2**(i+1) of the input, as ResNet\'s layer{{i}}); stages (level): {known}')
        return names
    if any(c in stage for c in PATTERN_CHARS):
        names = [n for n in modules if n and fnmatch.fnmatchcase(n, stage)]
        if not names:
            raise ConversionError(f'no module of {model_name(model)} matches {stage!r}; {_candidates_text(model)}')
        return names
    if stage not in modules or not stage:
        raise ConversionError(f'{model_name(model)} has no submodule {stage!r}; {_candidates_text(model)}')
    return [stage]


def resolve_stages(model: nn.Module, stages: StageSpec = None) -> List[str]:
    """Names of the submodules whose convs get replaced.

    Args:
        model: The CNN.
        stages: ``None`` for the default stage (``default_stage``: ResNet ``layer4``, else the last stage with a
            k x k conv); an int ``i`` for resolution level ``i`` (ResNet ``layer{i}``; other models every stage whose
            output is at 1/2**(i+1) of the input); a module path (``'layer3'``, ``'stages.3'``, ``'s4'``,
            ``'features.7'``, ``'layer4.2'``); an fnmatch pattern matched against every module's full name
            (``'stages.3.blocks.*.conv_dw'``; modules inside another match are dropped); or a list of those.
    """
    check_module(model, 'model')
    if stages is None:
        return [default_stage(model)]
    if isinstance(stages, (int, str)):
        stages = [stages]
    if not isinstance(stages, Sequence) or not stages or \
            not all(isinstance(s, (int, str)) and not isinstance(s, bool) for s in stages):
        raise InvalidArgumentError(f'stages must be None, a stage number (1-4), a module name or pattern, or a '
                                   f'non-empty list of those, got {stages!r}')
    modules = dict(model.named_modules())
    names: List[str] = []
    for stage in stages:
        names += [n for n in _resolve_one(model, stage, modules) if n not in names]
    # a module inside another selected one adds nothing (a pattern matching a block and its convs)
    return [n for n in names if not any(n.startswith(other + '.') for other in names)]


@dataclasses.dataclass
class StageRow:
    """One stage of ``list_stages``: what converting it would replace.

    ``convs`` counts the k x k convs (k > 1) inside; ``conv_kinds`` maps ``'7x7 depthwise'``-style descriptions
    (kernel, ``dense``/``grouped``/``depthwise``, ``/s`` stride) to their count. Channels and grids are those of the
    stage's input and output on one image of ``input_size``; ``tokens`` is the largest grid a GPSA layer of the
    stage attends over (its keys: the padded input of a strided conv). ``unsupported`` maps the convs that no GPSA
    layer reproduces exactly to the reason; ``default`` marks ``default_stage``.
    """
    name: str
    level: Optional[int]
    convs: int
    conv_kinds: Dict[str, int]
    in_chs: Optional[int]
    out_chs: Optional[int]
    in_grid: Optional[Tuple[int, int]]
    out_grid: Optional[Tuple[int, int]]
    tokens: Optional[Tuple[int, int]]
    exact: bool
    unsupported: Dict[str, str]
    default: bool


def _conv_kind(conv: nn.Conv2d) -> str:
    kh, kw = conv.kernel_size
    if conv.groups == 1:
        kind = 'dense'
    elif conv.groups == conv.in_channels:
        kind = 'depthwise'
    else:
        kind = f'grouped g{conv.groups}'
    sh, sw = conv.stride
    stride = '' if max(sh, sw) == 1 else f'/{sh}' if sh == sw else f'/{sh}x{sw}'
    return f'{kh}x{kw}{stride} {kind}'


def list_stages(model: nn.Module, input_size: Optional[Sequence[int]] = None) -> List[StageRow]:
    """The model's candidate stages (``stage_candidates``) and what converting each would replace.

    Channels, grids and levels are measured with forward hooks on one random image of ``input_size`` (default: the
    model's pretrained input size).

    Args:
        model: The CNN.
        input_size: ``(C, H, W)`` of the probing forward pass.
    """
    check_module(model, 'model')
    input_size = check_size(input_size, 'input_size', 3) if input_size is not None else default_input_size(model)
    candidates = stage_candidates(model)
    probed = probe_stages(model, [n for n, _ in candidates], input_size)
    conv_grids = probe_stages(model, [n for stage, _ in candidates for n, m in model.get_submodule(stage)
                                      .named_modules(prefix=stage) if _is_kxk_conv(m)], input_size)
    try:
        default = default_stage(model)
    except ConversionError:
        default = None
    rows = []
    for name, level in candidates:
        convs = [(n, m) for n, m in model.get_submodule(name).named_modules(prefix=name) if _is_kxk_conv(m)]
        kinds: Dict[str, int] = {}
        for _, conv in convs:
            kinds[_conv_kind(conv)] = kinds.get(_conv_kind(conv), 0) + 1
        unsupported = {n: r for n, r in ((n, _unsupported_reason(m)) for n, m in convs) if r}
        grids = [tuple(g + 2 * p for g, p in zip(conv_grids[n]['in_grid'], _padding(m)))
                 for n, m in convs if n in conv_grids]
        info = probed.get(name, {})
        rows.append(StageRow(
            name=name, level=info.get('level', level), convs=len(convs), conv_kinds=kinds,
            in_chs=info.get('in_chs'), out_chs=info.get('out_chs'), in_grid=info.get('in_grid'),
            out_grid=info.get('out_grid'), tokens=max(grids, key=lambda g: g[0] * g[1]) if grids else None,
            exact=bool(convs) and not unsupported, unsupported=unsupported, default=name == default))
    return rows


def _padding(conv: nn.Conv2d) -> Tuple[int, int]:
    if isinstance(conv.padding, str):  # 'valid', or 'same' (symmetric for the odd kernels that convert)
        return (0, 0) if conv.padding == 'valid' else tuple(d * (k - 1) // 2 for k, d in
                                                             zip(conv.kernel_size, conv.dilation))
    return tuple(conv.padding)


def _unsupported_reason(conv: nn.Module) -> Optional[str]:
    if type(conv).__name__ == 'CondConv2d':
        return 'CondConv2d (timm *_cc_* models) mixes expert filters per sample; a GPSA layer holds one fixed filter'
    if type(conv).__name__ == 'Conv2dSame':
        # TensorFlow "SAME": the padding depends on the input size and puts the odd pixel at the bottom/right
        return ('Conv2dSame (timm tf_* models) pads TensorFlow-style at run time, asymmetrically for strided convs, '
                'and GPSA pads symmetrically; use the model without tf_')
    if type(conv).forward is not nn.Conv2d.forward or type(conv)._conv_forward is not nn.Conv2d._conv_forward:
        return f'{type(conv).__name__} overrides nn.Conv2d.forward (e.g. weight standardisation or dynamic padding)'
    if conv.padding == 'same' and any(d * (k - 1) % 2 for k, d in zip(conv.kernel_size, conv.dilation)):
        return 'padding="same" with an even kernel pads asymmetrically'
    return None


def stage_convs(model: nn.Module, stages: List[str]) -> List[Tuple[str, nn.Conv2d]]:
    """The ``(name, conv)`` pairs of the k x k convs in ``stages`` (names from ``resolve_stages``); raises on any it
    cannot do exactly, or when there is none."""
    found = []
    for stage in stages:
        for name, module in model.get_submodule(stage).named_modules():
            if not _is_kxk_conv(module):
                continue
            full_name = f'{stage}.{name}' if name else stage
            reason = _unsupported_reason(module)
            if reason:
                raise ConversionError(f'{model_name(model)}: cannot reproduce {full_name} exactly: {reason}')
            found.append((full_name, module))
    if not found:
        raise ConversionError(
            f'{model_name(model)}: no k x k convolution (k > 1) in {", ".join(stages)}; nothing to reparameterise')
    return found


def find_convertible_convs(model: nn.Module, stages: StageSpec = None) -> List[Tuple[str, nn.Conv2d]]:
    """The ``(name, conv)`` pairs that ``reparameterize`` would replace; raises on any it cannot do exactly."""
    return stage_convs(model, resolve_stages(model, stages))

