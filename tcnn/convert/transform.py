"""Reparameterise a CNN into a T-CNN (arXiv:2106.05795, section 2) and verify that it computes the same function."""
import contextlib
import copy
import dataclasses
import fnmatch
import math
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_conversion_settings, check_device, \
    check_module, check_number, check_size
from .fusion import adopt_fusion
from ..layers.gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA

__all__ = ['ConversionError', 'EquivalenceReport', 'reparameterize', 'reparameterize_', 'check_equivalence',
           'ConversionSettings', 'CONVERSION_KEYS', 'exact_configuration', 'eval_mode', 'gpsa_layers', 'gpsa_summary',
           'find_convertible_convs', 'resolve_stages', 'default_stage', 'stage_candidates', 'stage_levels',
           'probe_stages', 'list_stages', 'StageRow', 'check_example_inputs', 'RECHECK_DTYPES']

StageSpec = Union[None, int, str, Sequence[Union[int, str]]]

STAGE_NAMES = ('layer1', 'layer2', 'layer3', 'layer4')
DEFAULT_TOLERANCE = 1e-4
# Below the default tolerance, even content-only attention in place of every conv would pass the check: it proves
# nothing (random-init ConvNeXts scale every block by 1e-6 and reach ~2e-6).
VACUOUS_SENSITIVITY = DEFAULT_TOLERANCE


class ConversionError(TcnnError, ValueError):
    """A model or layer cannot be turned into an exactly equivalent T-CNN."""


@dataclasses.dataclass
class EquivalenceReport:
    """Logit errors of a T-CNN against its CNN, in eval mode on the same random input.

    Relative errors are ``max |t - c| / max |c|`` over the whole logit tensor (element-wise ratios blow up on
    logits near zero). ``max_*`` are measured with every GPSA layer in the exact configuration, ``init_*`` with the
    T-CNN's actual parameters (e.g. the paper's alpha = lambda = 1 fine-tuning init, which is *not* the CNN).
    ``sensitivity`` is the relative logits change when every GPSA layer attends by content only: if it is below the
    default tolerance the replaced layers hardly influence the logits (e.g. timm's random init zeroes the last BN of
    each residual block) and the check proves nothing (``vacuous``). ``float64_max_rel_err`` is set when a float32,
    float16 or bfloat16 check missed its tolerance and was repeated in float64: a wrong conversion misses there too,
    rounding amplified by an ill-conditioned network (e.g. a random one with large activations) does not.

    Nested outputs (detection models' lists of dicts, segmentation models' dicts, ``features_only`` lists) are
    compared leaf by leaf, each tensor relative to its own largest value, and the errors are the largest over the
    leaves; ``output`` names the leaf of ``max_rel_err`` (``''`` for a single tensor). A leaf whose shape or value
    differs in kind (a detection kept in one model and not the other) counts as an infinite error.
    ``example_inputs`` describes the inputs when the caller gave them (``input_size`` is then ``()`` and
    ``batch_size`` 0).
    """
    max_abs_err: float
    max_rel_err: float
    init_max_abs_err: float
    init_max_rel_err: float
    input_size: Tuple[int, ...]
    batch_size: int
    dtype: str
    num_gpsa: int
    sensitivity: float = float('nan')
    float64_max_rel_err: Optional[float] = None
    output: str = ''
    example_inputs: Optional[str] = None

    @property
    def vacuous(self) -> bool:
        return self.sensitivity < VACUOUS_SENSITIVITY

    def passed(self, tol: float = DEFAULT_TOLERANCE) -> bool:
        return self.max_rel_err <= tol or (self.float64_max_rel_err is not None and self.float64_max_rel_err <= tol)

    def __str__(self) -> str:
        inputs = self.example_inputs or f'{self.batch_size}x{"x".join(map(str, self.input_size))}'
        where = f' at output {self.output}' if self.output else ''
        return (f'exact configuration: max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}{where}; '
                f'at init: max abs err {self.init_max_abs_err:.3g}, max rel err {self.init_max_rel_err:.3g} '
                f'({self.num_gpsa} GPSA layers, input {inputs}, {self.dtype})' +
                (f'; float64: max rel err {self.float64_max_rel_err:.3g}' if self.float64_max_rel_err is not None
                 else '') +
                (' [vacuous: the replaced layers do not change the logits]' if self.vacuous else ''))


def _model_name(model: nn.Module) -> str:
    source = getattr(model, 'tcnn_source', None)
    if source:
        return source['model']
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    return cfg.get('architecture') or type(model).__name__


# ---------------------------------------------------------------------------------------------- stages
#
# A "stage" is a submodule whose k x k convs become GPSA layers. Candidates come from the model's own layout: ResNet
# ``layer1``-``layer4``; else timm's ``feature_info`` (its modules, and every child of an indexed container one of
# them lives in, e.g. all of ``blocks.*`` when feature_info names ``blocks.4`` and ``blocks.6``); else the children
# of a known container (torchvision ``features``, ``trunk_output``). An int ``i`` names a resolution level: the
# stages whose output is at 1/2**(i+1) of the input, which is ResNet's ``layer{i}`` (level 0 is a stride-2 stem).

PATTERN_CHARS = '*?['
# children of these containers are the stages of models without feature_info (torchvision's layouts)
STAGE_CONTAINERS = ('trunk_output', 'stages', 'features', 'blocks', 'layers')
LEVEL_PROBE_SIZE = 128


# k x k convs that are not nn.Conv2d: found so that they are refused by name, never skipped silently
_OTHER_CONVS = ('CondConv2d',)


def _is_kxk_conv(module: nn.Module) -> bool:
    if not isinstance(module, nn.Conv2d) and type(module).__name__ not in _OTHER_CONVS:
        return False
    return module.kernel_size[0] * module.kernel_size[1] > 1


def _level(reduction: float) -> int:
    """Resolution level of a feature map at ``reduction`` (4 -> 1 ... 32 -> 4: ResNet's ``layer{i}``)."""
    return round(math.log2(max(reduction, 1))) - 1


def _resnet_stages(model: nn.Module) -> List[str]:
    return [n for n in STAGE_NAMES if isinstance(getattr(model, n, None), nn.Module)]


def _feature_info_stages(model: nn.Module, modules: Dict[str, nn.Module]) -> List[Tuple[str, Optional[int]]]:
    info = getattr(model, 'feature_info', None)
    entries = getattr(info, 'info', info)  # a list of dicts, or timm's FeatureInfo on features_only models
    if not isinstance(entries, (list, tuple)):
        return []
    entries = [(e['module'], e.get('reduction')) for e in entries
               if isinstance(e, dict) and e.get('module') in modules and e['module']]
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
        return [(n, int(n[len('layer'):])) for n in resnet]
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

    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    param = next(model.parameters(), None)
    x = torch.randn(1, *input_size, generator=torch.Generator().manual_seed(0))
    if param is not None:
        x = x.to(device=param.device, dtype=param.dtype)
    was_training = model.training
    try:
        model.eval()(x)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:  # an image smaller than the network's strides, a wrong channel count
        raise InvalidArgumentError(f'input_size {tuple(input_size)} does not fit {_model_name(model)}: '
                                   f'{" ".join(str(e).split())[:200]}') from e
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return found


def stage_levels(model: nn.Module) -> List[Tuple[str, Optional[int]]]:
    """``stage_candidates`` with every level known: layouts without one are measured by a forward pass."""
    candidates = stage_candidates(model)
    if all(level is not None for _, level in candidates):
        return candidates
    size = (_in_chans(model), LEVEL_PROBE_SIZE, LEVEL_PROBE_SIZE)
    probed = probe_stages(model, [n for n, _ in candidates], size)
    return [(n, probed[n]['level'] if n in probed else None) for n, _ in candidates]


def _in_chans(model: nn.Module) -> int:
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    return conv.in_channels if conv is not None else 3


def _has_kxk_conv(module: nn.Module) -> bool:
    # a GPSA layer counts: the default stage of a converted model stays the one that was converted
    return any(_is_kxk_conv(m) or isinstance(m, GPSA) for m in module.modules())


def default_stage(model: nn.Module) -> str:
    """The stage converted by default: ResNets ``layer4`` (the paper's last stage); other models their last stage
    that holds a k x k conv (MobileNetV3-large's last block is a 1x1 conv: ``blocks.5``), never the stem."""
    resnet = _resnet_stages(model)
    if resnet:
        return resnet[-1]
    candidates = stage_candidates(model)
    has_levels = all(level is not None for _, level in candidates)
    # the stem (level 0 in feature_info, else the first child of a container) runs at full resolution: not a default
    stages = [n for i, (n, level) in enumerate(candidates) if (level > 0 if has_levels else i > 0)]
    for name in reversed(stages):
        if _has_kxk_conv(model.get_submodule(name)):
            return name
    searched = f'; its stages {_names_text([n for n, _ in candidates])} have none' if candidates else ''
    raise ConversionError(
        f'{_model_name(model)} has no stage with a k x k convolution (searched for {", ".join(STAGE_NAMES)}, '
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
    return f'stages of {_model_name(model)}: {_names_text([n for n, _ in candidates])}'


def _resolve_one(model: nn.Module, stage: Union[int, str], modules: Dict[str, nn.Module]) -> List[str]:
    if isinstance(stage, int):
        if _resnet_stages(model):
            name = f'layer{stage}'
            if name not in modules:
                raise ConversionError(f'{_model_name(model)} has no submodule {name!r} (stage given as {stage!r}); '
                                      f'{_candidates_text(model)}')
            return [name]
        levels = stage_levels(model)
        names = [n for n, level in levels if level == stage]
        if not names:
            known = _names_text([f'{n} ({level})' for n, level in levels if level is not None]) or 'none'
            raise ConversionError(f'{_model_name(model)} has no stage at level {stage} (an int i is the resolution '
                                  f'1/2**(i+1) of the input, as ResNet\'s layer{{i}}); stages (level): {known}')
        return names
    if any(c in stage for c in PATTERN_CHARS):
        names = [n for n in modules if n and fnmatch.fnmatchcase(n, stage)]
        if not names:
            raise ConversionError(f'no module of {_model_name(model)} matches {stage!r}; {_candidates_text(model)}')
        return names
    if stage not in modules or not stage:
        raise ConversionError(f'{_model_name(model)} has no submodule {stage!r}; {_candidates_text(model)}')
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
    stride = f'/{conv.stride[0]}' if max(conv.stride) > 1 else ''
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
    input_size = check_size(input_size, 'input_size', 3) if input_size is not None else _default_input_size(model)
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


def _convertible_convs(model: nn.Module, stages: List[str]) -> List[Tuple[str, nn.Conv2d]]:
    found = []
    for stage in stages:
        for name, module in model.get_submodule(stage).named_modules():
            if not _is_kxk_conv(module):
                continue
            full_name = f'{stage}.{name}' if name else stage
            reason = _unsupported_reason(module)
            if reason:
                raise ConversionError(f'{_model_name(model)}: cannot reproduce {full_name} exactly: {reason}')
            found.append((full_name, module))
    if not found:
        raise ConversionError(
            f'{_model_name(model)}: no k x k convolution (k > 1) in {", ".join(stages)}; nothing to reparameterise')
    return found


def find_convertible_convs(model: nn.Module, stages: StageSpec = None) -> List[Tuple[str, nn.Conv2d]]:
    """The ``(name, conv)`` pairs that ``reparameterize`` would replace; raises on any it cannot do exactly."""
    return _convertible_convs(model, resolve_stages(model, stages))


def gpsa_layers(model: nn.Module) -> List[Tuple[str, GPSA]]:
    """All ``(name, GPSA)`` pairs of a model, in module order."""
    check_module(model, 'model')
    return [(n, m) for n, m in model.named_modules() if isinstance(m, GPSA)]


@torch.no_grad()
def gpsa_summary(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    """Per GPSA layer: per-head gate sigmoid(lambda), locality strength alpha (1/tokens^2), span 1/alpha
    (tokens^2), width sigma = 1/sqrt(2 alpha) (tokens: the positional logits -alpha |delta - Delta|^2 are a Gaussian
    of that standard deviation along each axis), centre (row, col, tokens), and the layer means, as plain Python values
    (JSON-ready; T-CNN Fig. 4 plots the spans and gates over training)."""
    summary = {}
    for name, layer in gpsa_layers(model):
        gate, alpha = layer.gate(), layer.locality_strength()
        sigma = torch.rsqrt(2.0 * alpha)
        summary[name] = {
            'gate': gate.tolist(), 'alpha': alpha.tolist(), 'span': (1.0 / alpha).tolist(), 'sigma': sigma.tolist(),
            'center': layer.pos_centers.float().tolist(),
            'gate_mean': gate.mean().item(), 'span_mean': (1.0 / alpha).mean().item(),
            'sigma_mean': sigma.mean().item(),
        }
    return summary


@contextlib.contextmanager
def exact_configuration(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put every GPSA layer in the exact configuration (alpha = 50, lambda = 40, centres on the taps).

    In that configuration a GPSA layer computes its conv (T-CNN, arXiv:2106.05795, section 2). Parameters are
    restored on exit.
    """
    check_module(model, 'model')
    saved = []
    with torch.no_grad():
        for _, layer in gpsa_layers(model):
            saved.append((layer, layer.pos_locality.clone(), layer.gating.clone(), layer.pos_centers.clone()))
            layer.set_locality_strength(EXACT_LOCALITY)
            layer.set_gating(EXACT_GATING)
            layer.pos_centers.copy_(layer.kernel_centers().to(layer.pos_centers))
    try:
        yield model
    finally:
        with torch.no_grad():
            for layer, loc, gate, centers in saved:
                layer.pos_locality.copy_(loc)
                layer.gating.copy_(gate)
                layer.pos_centers.copy_(centers)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put ``model`` in eval mode (BN running statistics, no dropout); its train/eval mode after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextlib.contextmanager
def full_precision_matmul() -> Iterator[None]:
    """Float32 matmuls and cuDNN convolutions in true float32 (TF32 off) inside the block; the previous switches after.

    PyTorch's defaults let cuDNN convolutions use TF32 (10-bit mantissa) on Ampere and newer GPUs, and ``tcnn train``
    turns it on for matmuls too: the CNN's convs and the GPSA layers then round differently, by more than the 1e-4
    verification tolerance. Only the process-wide switches are touched, so this affects every thread of the process.
    """
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        # last: the precision is the finer switch ('medium' and 'high' both read as allow_tf32 = True)
        torch.set_float32_matmul_precision(saved[2])


def _default_input_size(model: nn.Module) -> Tuple[int, int, int]:
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    return tuple(cfg.get('input_size', (3, 224, 224)))


def _leaves(output: Any, path: str = '') -> List[Tuple[str, Any]]:
    """``(path, leaf)`` pairs of a nested output: dicts, lists, tuples (named tuples too) down to tensors and plain
    values; the path reads like the indexing that reaches the leaf (``[0]['boxes']``)."""
    if isinstance(output, Mapping):
        return [leaf for k, v in output.items() for leaf in _leaves(v, f'{path}[{k!r}]')]
    if isinstance(output, (list, tuple)):
        return [leaf for i, v in enumerate(output) for leaf in _leaves(v, f'{path}[{i}]')]
    return [(path, output)]


def _leaf_errors(reference: Any, other: Any) -> Tuple[float, float]:
    """Absolute and relative (to the reference's largest magnitude) error of one leaf; infinite when the two differ
    in kind or shape."""
    if isinstance(reference, torch.Tensor) != isinstance(other, torch.Tensor):
        return math.inf, math.inf
    if not isinstance(reference, torch.Tensor):
        return (0.0, 0.0) if reference == other else (math.inf, math.inf)
    if reference.shape != other.shape:
        return math.inf, math.inf
    if reference.numel() == 0:
        return 0.0, 0.0
    diff = (other.double() - reference.double()).abs().max().item()
    scale = reference.double().abs().max().item()
    return diff, diff / max(scale, 1e-30)


def _errors(reference: Any, other: Any) -> Tuple[float, float, str]:
    """The largest absolute and relative error over the leaves of two outputs of the same structure, and the leaf of
    the relative one; a different structure (other keys, lengths) is an infinite error at the first leaf that
    differs."""
    ref_leaves, other_leaves = _leaves(reference), _leaves(other)
    if [p for p, _ in ref_leaves] != [p for p, _ in other_leaves]:
        longer = max(ref_leaves, other_leaves, key=len)
        differs = next((a for (a, _), (b, _) in zip(ref_leaves, other_leaves) if a != b), None)
        return math.inf, math.inf, differs or longer[min(len(ref_leaves), len(other_leaves))][0]
    worst_abs, worst_rel, where = 0.0, 0.0, ''
    for (path, ref), (_, out) in zip(ref_leaves, other_leaves):
        abs_err, rel_err = _leaf_errors(ref, out)
        worst_abs = max(worst_abs, abs_err)
        if rel_err > worst_rel or not where:
            worst_rel, where = max(rel_err, worst_rel), path
    return worst_abs, worst_rel, where


def _inputs_to(inputs: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """``inputs`` with every floating tensor on ``device`` in ``dtype``, other tensors on ``device`` (same nesting)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device=device, dtype=dtype) if inputs.is_floating_point() else inputs.to(device)
    if isinstance(inputs, Mapping):
        return type(inputs)((k, _inputs_to(v, device, dtype)) for k, v in inputs.items()) \
            if isinstance(inputs, dict) else {k: _inputs_to(v, device, dtype) for k, v in inputs.items()}
    if isinstance(inputs, tuple) and hasattr(inputs, '_fields'):  # a named tuple
        return type(inputs)(*(_inputs_to(v, device, dtype) for v in inputs))
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_inputs_to(v, device, dtype) for v in inputs)
    return inputs


def _describe_inputs(args: Tuple[Any, ...]) -> str:
    """A short description of example inputs: their tensors' count and first shapes."""
    tensors = [t for _, t in _leaves(args) if isinstance(t, torch.Tensor)]
    shapes = ', '.join('x'.join(map(str, t.shape)) for t in tensors[:3]) + (', ...' if len(tensors) > 3 else '')
    return f'{len(tensors)} example tensor{"s" * (len(tensors) != 1)} ({shapes})'


def check_example_inputs(example_inputs: Any) -> Tuple[Any, ...]:
    """The positional arguments of one forward call: a tuple is taken as the arguments, anything else (a tensor, a
    list of images for a detection model, a dict) as the single argument. Raises unless it holds a tensor."""
    args = example_inputs if isinstance(example_inputs, tuple) and not hasattr(example_inputs, '_fields') \
        else (example_inputs,)
    if not any(isinstance(t, torch.Tensor) for _, t in _leaves(args)):
        raise InvalidTypeError(f'example_inputs must hold at least one tensor (a tuple of forward arguments, a tensor, '
                               f'or a list of images), got {type(example_inputs).__name__}')
    return args


@contextlib.contextmanager
def _content_only(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily make every GPSA layer attend by content only (gate ~0): a function far from the conv."""
    saved = [(layer, layer.gating.clone()) for _, layer in gpsa_layers(model)]
    for layer, _ in saved:
        layer.set_gating(-EXACT_GATING)
    try:
        yield model
    finally:
        with torch.no_grad():
            for layer, gating in saved:
                layer.gating.copy_(gating)


@contextlib.contextmanager
def _convs_restored(model: nn.Module, convs: Dict[str, nn.Module]) -> Iterator[nn.Module]:
    """Temporarily put the original convs back in place of their GPSA layers: the model is the CNN again."""
    layers = {name: model.get_submodule(name) for name in convs}
    for name, conv in convs.items():
        model.set_submodule(name, conv)
    try:
        yield model
    finally:
        for name, layer in layers.items():
            model.set_submodule(name, layer)


def _run_cnn(cnn: nn.Module, args: Tuple[Any, ...], what: str, fix: str) -> Any:
    """The CNN's output on ``args``; a forward that fails on them is the caller's input, said in one line."""
    try:
        return cnn(*args)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, TypeError, ValueError, AssertionError, IndexError, KeyError, AttributeError) as e:
        # a wrong channel count, an image smaller than the network's strides, a forward that takes other arguments
        raise InvalidArgumentError(f'{what} the model ({_model_name(cnn)}): {type(e).__name__}: '
                                   f'{" ".join(str(e).split())[:200]}; {fix}') from e


@torch.no_grad()
def _measure(
        cnn_context: Callable[[], ContextManager[nn.Module]],
        t_cnn: nn.Module,
        input_size: Sequence[int],
        batch_size: int,
        seed: int,
        device: Optional[Union[str, torch.device]],
        dtype: Optional[torch.dtype],
        example_inputs: Optional[Tuple[Any, ...]] = None,
) -> EquivalenceReport:
    param = next(t_cnn.parameters())
    device = torch.device(device) if device is not None else param.device
    dtype = dtype or param.dtype
    if example_inputs is None:
        gen = torch.Generator().manual_seed(seed)
        args = (torch.randn((batch_size, *input_size), generator=gen).to(device=device, dtype=dtype),)
        what = f'input_size {tuple(input_size)} does not fit'
        fix = 'pass the input_size it takes, or inputs it takes as example_inputs=(...)'
        described = None
    else:
        args = _inputs_to(example_inputs, device, dtype)
        described, input_size, batch_size = _describe_inputs(args), (), 0
        what, fix = f'example_inputs ({described}) do not fit', 'pass the arguments of one forward call as a tuple'
    with cnn_context() as cnn, eval_mode(cnn):
        ref = _run_cnn(cnn, args, what, fix)
    with eval_mode(t_cnn):
        with exact_configuration(t_cnn):
            exact = t_cnn(*args)
        init = t_cnn(*args)
        with exact_configuration(t_cnn), _content_only(t_cnn):
            content = t_cnn(*args)
    abs_err, rel_err, where = _errors(ref, exact)
    init_abs, init_rel, _ = _errors(ref, init)
    nested = not isinstance(ref, torch.Tensor)
    report = EquivalenceReport(abs_err, rel_err, init_abs, init_rel, tuple(input_size), batch_size,
                               str(dtype).replace('torch.', ''), len(gpsa_layers(t_cnn)), _errors(ref, content)[1],
                               output=where if nested else '', example_inputs=described)
    if report.vacuous:
        warnings.warn('the replaced layers do not influence the logits (e.g. random-init timm ResNets zero the last BN '
                      'of each residual block, ConvNeXts scale each block by 1e-6), so the equivalence check proves '
                      'nothing for this model')
    return report


def check_equivalence(
        cnn: nn.Module,
        t_cnn: nn.Module,
        input_size: Optional[Sequence[int]] = None,
        batch_size: int = 2,
        seed: int = 0,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None,
        example_inputs: Any = None,
) -> EquivalenceReport:
    """Compare the outputs of a CNN and its T-CNN in eval mode on the same input.

    The T-CNN is measured in the exact configuration (which must reproduce the CNN), at its actual parameters, and
    with content-only attention (to tell whether the replaced layers matter at all). Both models are left as they
    were (parameters and train/eval mode). Outputs may be nested (dicts, lists, tuples of tensors: detection and
    segmentation models, ``features_only`` backbones); they are compared leaf by leaf (``EquivalenceReport``).

    Args:
        cnn: The source CNN.
        t_cnn: The converted model.
        input_size: ``(C, H, W)`` of the random images; defaults to the model's ``pretrained_cfg['input_size']`` or
            ``(3, 224, 224)``.
        batch_size: Number of random images.
        seed: Seed of the random input.
        device: Where to run; defaults to the device of the T-CNN's parameters.
        dtype: Dtype of the input's floating tensors; defaults to the dtype of the T-CNN's parameters.
        example_inputs: Inputs to use instead of random images: a tuple is the positional arguments of one forward
            call, anything else the single argument (e.g. a list of image tensors for a torchvision detection model).

    Raises:
        TcnnError: A bad argument (named in the message), a model that does not run on the input (one line naming
            the fix), or a ``t_cnn`` without GPSA layers.
    """
    check_module(cnn, 'cnn')
    if not gpsa_layers(check_module(t_cnn, 't_cnn')):
        raise TcnnError('t_cnn has no GPSA layer, so there is nothing to compare: pass the T-CNN made by '
                        'tcnn.reparameterize(cnn)')
    args = _check_inputs(input_size, example_inputs)
    input_size = check_size(input_size, 'input_size', 3) if input_size is not None else _default_input_size(cnn)
    check_number(batch_size, 'batch_size', ge=1, integer=True)
    check_number(seed, 'seed', ge=0, integer=True)
    check_device(device, 'device')
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InvalidTypeError(f'dtype must be a floating-point torch.dtype (e.g. torch.float64), got {dtype!r}')
    return _measure(lambda: contextlib.nullcontext(cnn), t_cnn, input_size, batch_size, seed, device, dtype, args)


def _check_inputs(input_size: Optional[Sequence[int]], example_inputs: Any) -> Optional[Tuple[Any, ...]]:
    """``example_inputs`` as forward arguments (``check_example_inputs``), None without them; not both sizes."""
    if example_inputs is None:
        return None
    if input_size is not None:
        raise InvalidArgumentError('pass input_size (random images) or example_inputs, not both')
    return check_example_inputs(example_inputs)


@dataclasses.dataclass(frozen=True)
class ConversionSettings:
    """How a CNN's convs become GPSA layers (T-CNN, arXiv:2106.05795, section 2): which stages, and every layer's
    initial locality strength alpha, gate lambda and content q/k width. The defaults are the paper's fine-tuning init
    (alpha = lambda = 1) on the default stage.

    The one home of these settings: ``reparameterize``, the ``t_*`` models, ``tcnn train``'s recipe keys, T-CNN files
    (``'conversion'``) and ``model.tcnn_config`` all spell them with these names.
    """
    stages: StageSpec = None
    locality_strength: float = 1.0
    gating_init: float = 1.0
    qk_dim: Optional[int] = None

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> 'ConversionSettings':
        """The settings held by a recipe, a T-CNN file's ``'conversion'``, a ``tcnn_config`` or keyword arguments
        (other keys are ignored; a missing or None value takes the default)."""
        return cls(**{f.name: mapping[f.name] for f in dataclasses.fields(cls) if mapping.get(f.name) is not None})

    def kwargs(self) -> Dict[str, Any]:
        """As keyword arguments of ``reparameterize`` / ``timm.create_model('t_...')``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


CONVERSION_KEYS = tuple(f.name for f in dataclasses.fields(ConversionSettings))


def reparameterize_(
        model: nn.Module,
        settings: Optional[ConversionSettings] = None,
        *,
        verify: bool = True,
        input_size: Optional[Sequence[int]] = None,
        tol: float = DEFAULT_TOLERANCE,
        example_inputs: Any = None,
        **kwargs: Any,
) -> nn.Module:
    """In-place ``reparameterize``: swaps the convs of ``model`` itself and returns it.

    Every other parameter stays the same object, so an optimiser that holds them keeps its state (late
    reparameterisation, T-CNN Table 3). Verification puts the original convs back temporarily to get the CNN's
    logits, so no copy of the model is made. The conversion settings come as a ``ConversionSettings`` or as the
    keyword arguments of ``reparameterize`` (``stages``, ``locality_strength``, ``gating_init``, ``qk_dim``); see
    ``reparameterize`` for the others, and for why a model that has GPSA layers already is refused.
    """
    unknown = sorted(set(kwargs) - set(CONVERSION_KEYS))
    if unknown or (settings is not None and kwargs):
        raise InvalidArgumentError(f'unexpected arguments {unknown or sorted(kwargs)}: pass settings or the keywords '
                                   f'{", ".join(CONVERSION_KEYS)}, not both')
    s = settings if settings is not None else ConversionSettings(**kwargs)
    check_conversion_settings(s.locality_strength, s.gating_init, s.qk_dim, tol)
    _refuse_converted(model)
    if input_size is not None:
        input_size = check_size(input_size, 'input_size', 3)
    args = _check_inputs(input_size, example_inputs)
    stage_names = resolve_stages(model, s.stages)
    targets = _convertible_convs(model, stage_names)
    source_name = _model_name(model)
    convs = {}
    for name, conv in targets:
        model.set_submodule(name, GPSA.from_conv(conv, s.locality_strength, s.gating_init, qk_dim=s.qk_dim))
        convs[name] = conv
    reclassed = adopt_fusion(model)  # RepVGG/MobileOne blocks: timm's reparameterize_model keeps the GPSA layers
    model.tcnn_config = {
        'architecture': source_name,
        'layers': list(convs),
        **dataclasses.asdict(dataclasses.replace(s, stages=stage_names, locality_strength=float(s.locality_strength),
                                                 gating_init=float(s.gating_init))),
    }
    if verify:
        try:
            model.tcnn_report = _verify(model, convs, tuple(input_size or _default_input_size(model)), tol, args)
        except BaseException:  # a failed check or a bad input_size: leave the caller's model as it was
            for name, conv in convs.items():
                model.set_submodule(name, conv)
            for block, cls in reclassed:
                block.__class__ = cls
            del model.tcnn_config
            raise
    return model


def _refuse_converted(model: nn.Module) -> None:
    """A model with GPSA layers is refused at once: see ``reparameterize`` for why."""
    layers = [name for name, _ in gpsa_layers(model)]
    if layers:
        stages = (getattr(model, 'tcnn_config', None) or {}).get('stages')
        done = f' ({", ".join(map(str, stages))})' if stages else ''
        raise ConversionError(
            f'{_model_name(model)} is a T-CNN already: {len(layers)} GPSA layers{done}, e.g. {layers[0]}; convert '
            'every stage in one call on the CNN, e.g. reparameterize(cnn, stages=[\'layer3\', \'layer4\'])')


def _verify(model: nn.Module, convs: Dict[str, nn.Module], size: Tuple[int, ...], tol: float,
            example_inputs: Optional[Tuple[Any, ...]] = None) -> EquivalenceReport:
    """The equivalence report of a freshly converted model; raises ``ConversionError`` when it misses ``tol``.

    One tolerance for every dtype, with a second look where the first misses: a model whose parameters are all
    float32, float16 or bfloat16 is measured again in float64 (converted there and back, which is lossless), where a
    right conversion agrees to ~1e-12 whatever the network's conditioning and a wrong one still misses. A fixed
    tolerance per dtype could not tell the two apart: how much a network amplifies rounding depends on its weights
    (a random ResNet-50 in float32 reaches ~1e-4; a right float16 conversion of a small one 4e-4), not on the dtype
    alone.
    """
    source_name = model.tcnn_config['architecture']
    with full_precision_matmul():  # the user's TF32 settings stay theirs outside the check (training speed)
        report = _measure(lambda: _convs_restored(model, convs), model, size, 2, 0, None, None, example_inputs)
    dtype = _uniform_dtype(model, convs.values())
    if not report.passed(tol) and dtype is not None:
        report = dataclasses.replace(report, float64_max_rel_err=_float64_error(model, convs, size, dtype,
                                                                                example_inputs))
        if report.passed(tol):
            warnings.warn(f'{source_name}: {report.dtype} outputs differ by {report.max_rel_err:.3g} (> {tol:g}) but '
                          f'float64 ones by {report.float64_max_rel_err:.3g}: the network amplifies {report.dtype} '
                          'rounding; the conversion itself is exact')
    if not report.passed(tol):
        in_float64 = '' if report.float64_max_rel_err is None else f', {report.float64_max_rel_err:.3g} in float64'
        where = f' at output {report.output}' if report.output else ''
        raise ConversionError(
            f'{source_name}: the T-CNN does not reproduce the CNN (max relative error {report.max_rel_err:.3g}{where} '
            f'> {tol:g} in the exact configuration{in_float64})')
    return report


# dtypes whose verification is repeated in float64 when it misses: the conversion there and back is lossless
RECHECK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _uniform_dtype(model: nn.Module, convs) -> Optional[torch.dtype]:
    """The one floating dtype of every parameter and buffer of ``model`` and ``convs`` if it is in
    ``RECHECK_DTYPES``, else None (mixed dtypes, or float64 already)."""
    dtypes = {t.dtype for m in (model, *convs) for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in RECHECK_DTYPES else None


def _float64_error(model: nn.Module, convs: Dict[str, nn.Module], size: Sequence[int], dtype: torch.dtype,
                   example_inputs: Optional[Tuple[Any, ...]] = None) -> float:
    """Relative error of the exact configuration measured in float64 (models converted there and back to ``dtype``:
    float32/float16/bfloat16 -> float64 -> the same is lossless, and the parameters stay the same objects)."""
    modules = [model, *convs.values()]
    try:
        for m in modules:
            m.double()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # the first check already warned if vacuous
            return _measure(lambda: _convs_restored(model, convs), model, size, 2, 0, None, torch.float64,
                            example_inputs).max_rel_err
    finally:
        for m in modules:
            m.to(dtype)


def reparameterize(
        model: nn.Module,
        *,
        stages: StageSpec = None,
        locality_strength: float = 1.0,
        gating_init: float = 1.0,
        qk_dim: Optional[int] = None,
        verify: bool = True,
        input_size: Optional[Sequence[int]] = None,
        tol: float = DEFAULT_TOLERANCE,
        example_inputs: Any = None,
) -> nn.Module:
    """Return a T-CNN: a copy of ``model`` whose k x k convs (k > 1) in ``stages`` are GPSA layers.

    The input model is left untouched (``reparameterize_`` converts in place). Each GPSA layer holds its conv's
    filter (T-CNN eq. 6) and starts at ``locality_strength``/``gating_init`` (the paper's fine-tuning init is
    1.0/1.0, on the verge of locality, which moves the outputs away from the CNN's by design: 17-33% of the logits on
    random-weight ResNets; ``locality_strength=50, gating_init=25`` gives a T-CNN that *is* the CNN in float32).

    A model that has GPSA layers already (a second conversion, ``reparameterize(reparameterize(cnn), stages=...)``)
    is refused at once, with the fix: convert every stage in one call. Merging was the other choice; it is not taken
    because one conversion is what the T-CNN's settings (``tcnn_config``: one init, one ``qk_dim``, the layers) and
    its verification describe: the second call's "CNN" would be a T-CNN whose first GPSA layers are at the fine-tuning
    init, not the CNN, so there is no CNN to verify the result against, and a file could not record the two inits.

    Args:
        model: A timm or torchvision CNN (or any module with the named stages).
        stages: Which stages to convert (see ``resolve_stages``); default the last one with a k x k conv
            (``layer4`` for ResNets).
        locality_strength: Initial alpha of every head.
        gating_init: Initial lambda of every head.
        qk_dim: Per-head width of content queries/keys (default ``C_in // heads``, or a grouped conv's group
            width ``C_in // groups`` if smaller).
        verify: Compare logits with the CNN in the exact configuration (eval mode, 2 random images of
            ``input_size``) and raise ``ConversionError`` if the relative error exceeds ``tol``. The report is stored
            as ``t_model.tcnn_report``; a warning says when the check is vacuous (the layers do not change the logits).
        input_size: ``(C, H, W)`` of the verification's random images; default the model's pretrained input size.
        tol: Tolerance of the verification: the largest relative error of the outputs in the exact configuration.
            A model in float32, float16 or bfloat16 that misses it is measured again in float64, which tells a
            network's rounding amplification (passes) from a wrong conversion (fails there too).
        example_inputs: Inputs of the verification instead of random images (``check_equivalence``), e.g.
            ``([image1, image2],)`` or ``[image1, image2]`` for a torchvision detection model. Outputs may be nested
            (dicts, lists, tuples of tensors); they are compared leaf by leaf.

    Raises:
        ConversionError: The model has no convertible conv, has GPSA layers already, a conv cannot be reproduced
            exactly, or the verification fails.
        TcnnError: A bad argument, or a model that does not run on the verification's input (one line naming the
            fix).
    """
    check_conversion_settings(locality_strength, gating_init, qk_dim, tol)  # fail before copying
    _refuse_converted(model)
    if input_size is not None:
        check_size(input_size, 'input_size', 3)
    _check_inputs(input_size, example_inputs)
    stages = resolve_stages(model, stages)  # once: an int on a torchvision model costs a probing forward pass
    _convertible_convs(model, stages)
    settings = ConversionSettings(stages, locality_strength, gating_init, qk_dim)
    return reparameterize_(copy.deepcopy(model), settings, verify=verify, input_size=input_size, tol=tol,
                           example_inputs=example_inputs)
