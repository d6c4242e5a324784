"""Reparameterise a CNN into a T-CNN (arXiv:2106.05795, section 2) and verify that it computes the same function."""
import contextlib
import copy
import dataclasses
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_conversion_settings, check_device, \
    check_module, check_number, check_size
from .gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA

__all__ = ['ConversionError', 'EquivalenceReport', 'reparameterize', 'reparameterize_', 'check_equivalence',
           'exact_configuration', 'gpsa_layers', 'gpsa_summary', 'find_convertible_convs', 'resolve_stages']

StageSpec = Union[None, int, str, Sequence[Union[int, str]]]

STAGE_NAMES = ('layer1', 'layer2', 'layer3', 'layer4')
DEFAULT_TOLERANCE = 1e-4
VACUOUS_SENSITIVITY = 1e-6


class ConversionError(TcnnError, ValueError):
    """A model or layer cannot be turned into an exactly equivalent T-CNN."""


@dataclasses.dataclass
class EquivalenceReport:
    """Logit errors of a T-CNN against its CNN, in eval mode on the same random input.

    Relative errors are ``max |t - c| / max |c|`` over the whole logit tensor (element-wise ratios blow up on
    logits near zero). ``max_*`` are measured with every GPSA layer in the exact configuration, ``init_*`` with the
    T-CNN's actual parameters (e.g. the paper's alpha = lambda = 1 fine-tuning init, which is *not* the CNN).
    ``sensitivity`` is the relative logits change when every GPSA layer attends by content only: if it is ~0 the
    replaced layers do not influence the logits (e.g. timm's random init zeroes the last BN of each residual block)
    and the check proves nothing (``vacuous``). ``float64_max_rel_err`` is set when a float32 check missed its
    tolerance and was repeated in float64: a wrong conversion misses there too, float32 rounding amplified by an
    ill-conditioned network (e.g. a random one with large activations) does not.
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

    @property
    def vacuous(self) -> bool:
        return self.sensitivity < VACUOUS_SENSITIVITY

    def passed(self, tol: float = DEFAULT_TOLERANCE) -> bool:
        return self.max_rel_err <= tol or (self.float64_max_rel_err is not None and self.float64_max_rel_err <= tol)

    def __str__(self) -> str:
        return (f'exact configuration: max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}; '
                f'at init: max abs err {self.init_max_abs_err:.3g}, max rel err {self.init_max_rel_err:.3g} '
                f'({self.num_gpsa} GPSA layers, input {self.batch_size}x{"x".join(map(str, self.input_size))}, '
                f'{self.dtype})' + (f'; float64: max rel err {self.float64_max_rel_err:.3g}'
                                    if self.float64_max_rel_err is not None else '') +
                (' [vacuous: the replaced layers do not change the logits]' if self.vacuous else ''))


def _model_name(model: nn.Module) -> str:
    source = getattr(model, 'tcnn_source', None)
    if source:
        return source['model']
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    return cfg.get('architecture') or type(model).__name__


def resolve_stages(model: nn.Module, stages: StageSpec = None) -> List[str]:
    """Names of the submodules whose convs get replaced.

    Args:
        model: The CNN.
        stages: ``None`` for the last ResNet stage (``layer4``); an int ``i`` for ``layer{i}``; a submodule name
            (``'layer3'``, ``'layer4.2'``); or a list of those.
    """
    check_module(model, 'model')
    if stages is None:
        present = [n for n in STAGE_NAMES if isinstance(getattr(model, n, None), nn.Module)]
        if not present:
            raise ConversionError(
                f'{_model_name(model)} has no ResNet stages (searched for {", ".join(STAGE_NAMES)}): tcnn converts '
                'ResNet-style CNNs (timm ResNet/ResNet-D/ResNet-RS/SE-ResNet/ResNeXt, torchvision ResNet); for '
                'other CNNs pass stages=[...] naming the submodules whose k x k convs to replace')
        return [present[-1]]
    if isinstance(stages, (int, str)):
        stages = [stages]
    if not isinstance(stages, Sequence) or not stages or \
            not all(isinstance(s, (int, str)) and not isinstance(s, bool) for s in stages):
        raise InvalidArgumentError(f'stages must be None, a stage number (1-4), a submodule name, or a non-empty list '
                                   f'of those, got {stages!r}')
    names = []
    for s in stages:
        name = f'layer{s}' if isinstance(s, int) else str(s)
        try:
            model.get_submodule(name)
        except AttributeError:
            raise ConversionError(f'{_model_name(model)} has no submodule {name!r} (stage given as {s!r})') from None
        names.append(name)
    return names


def _unsupported_reason(conv: nn.Conv2d) -> Optional[str]:
    if type(conv).forward is not nn.Conv2d.forward or type(conv)._conv_forward is not nn.Conv2d._conv_forward:
        return f'{type(conv).__name__} overrides nn.Conv2d.forward (e.g. weight standardisation or dynamic padding)'
    if conv.padding == 'same' and any(d * (k - 1) % 2 for k, d in zip(conv.kernel_size, conv.dilation)):
        return 'padding="same" with an even kernel pads asymmetrically'
    return None


def find_convertible_convs(model: nn.Module, stages: StageSpec = None) -> List[Tuple[str, nn.Conv2d]]:
    """The ``(name, conv)`` pairs that ``reparameterize`` would replace; raises on any it cannot do exactly."""
    found = []
    for stage in resolve_stages(model, stages):
        for name, module in model.get_submodule(stage).named_modules():
            if not isinstance(module, nn.Conv2d) or module.kernel_size[0] * module.kernel_size[1] <= 1:
                continue
            full_name = f'{stage}.{name}' if name else stage
            reason = _unsupported_reason(module)
            if reason:
                raise ConversionError(f'{_model_name(model)}: cannot reproduce {full_name} exactly: {reason}')
            found.append((full_name, module))
    if not found:
        raise ConversionError(
            f'{_model_name(model)}: no k x k convolution (k > 1) in {", ".join(resolve_stages(model, stages))}; '
            'nothing to reparameterise')
    return found


def gpsa_layers(model: nn.Module) -> List[Tuple[str, GPSA]]:
    """All ``(name, GPSA)`` pairs of a model, in module order."""
    check_module(model, 'model')
    return [(n, m) for n, m in model.named_modules() if isinstance(m, GPSA)]


@torch.no_grad()
def gpsa_summary(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    """Per GPSA layer: per-head gate sigmoid(lambda), locality strength alpha, span 1/alpha, centre (row, col),
    and the layer means, as plain Python values (JSON-ready; T-CNN Fig. 4 plots these over training)."""
    summary = {}
    for name, layer in gpsa_layers(model):
        gate, alpha = layer.gate(), layer.locality_strength()
        summary[name] = {
            'gate': gate.tolist(), 'alpha': alpha.tolist(), 'span': (1.0 / alpha).tolist(),
            'center': layer.pos_centers.float().tolist(),
            'gate_mean': gate.mean().item(), 'span_mean': (1.0 / alpha).mean().item(),
        }
    return summary


@contextlib.contextmanager
def exact_configuration(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily put every GPSA layer in the exact configuration (alpha = 50, lambda = 25, centres on the taps).

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


def _errors(reference: torch.Tensor, other: torch.Tensor) -> Tuple[float, float]:
    diff = (other.double() - reference.double()).abs().max().item()
    scale = reference.double().abs().max().item()
    return diff, diff / max(scale, 1e-30)


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


@torch.no_grad()
def _measure(
        cnn_context: Callable[[], ContextManager[nn.Module]],
        t_cnn: nn.Module,
        input_size: Sequence[int],
        batch_size: int,
        seed: int,
        device: Optional[Union[str, torch.device]],
        dtype: Optional[torch.dtype],
) -> EquivalenceReport:
    param = next(t_cnn.parameters())
    device = torch.device(device) if device is not None else param.device
    dtype = dtype or param.dtype
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((batch_size, *input_size), generator=gen).to(device=device, dtype=dtype)
    with cnn_context() as cnn:
        was_training = cnn.training
        try:
            ref = cnn.eval()(x)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # a wrong channel count, an image smaller than the network's strides, ...
            raise InvalidArgumentError(f'input_size {tuple(input_size)} does not fit the model: '
                                       f'{" ".join(str(e).split())[:200]}') from e
        finally:
            cnn.train(was_training)
    was_training = t_cnn.training
    t_cnn.eval()
    try:
        with exact_configuration(t_cnn):
            exact = t_cnn(x)
        init = t_cnn(x)
        with exact_configuration(t_cnn), _content_only(t_cnn):
            content = t_cnn(x)
    finally:
        t_cnn.train(was_training)
    abs_err, rel_err = _errors(ref, exact)
    init_abs, init_rel = _errors(ref, init)
    report = EquivalenceReport(abs_err, rel_err, init_abs, init_rel, tuple(input_size), batch_size,
                               str(dtype).replace('torch.', ''), len(gpsa_layers(t_cnn)), _errors(ref, content)[1])
    if report.vacuous:
        warnings.warn('the replaced layers do not influence the logits (e.g. random-init timm ResNets zero the last BN '
                      'of each residual block), so the equivalence check proves nothing for this model')
    return report


def check_equivalence(
        cnn: nn.Module,
        t_cnn: nn.Module,
        input_size: Optional[Sequence[int]] = None,
        batch_size: int = 2,
        seed: int = 0,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None,
) -> EquivalenceReport:
    """Compare the logits of a CNN and its T-CNN in eval mode on the same random input.

    The T-CNN is measured in the exact configuration (which must reproduce the CNN), at its actual parameters, and
    with content-only attention (to tell whether the replaced layers matter at all). Both models are left as they
    were (parameters and train/eval mode).

    Args:
        cnn: The source CNN.
        t_cnn: The converted model.
        input_size: ``(C, H, W)``; defaults to the model's ``pretrained_cfg['input_size']`` or ``(3, 224, 224)``.
        batch_size: Number of random images.
        seed: Seed of the random input.
        device: Where to run; defaults to the device of the T-CNN's parameters.
        dtype: Input dtype; defaults to the dtype of the T-CNN's parameters.

    Raises:
        TcnnError: A bad argument (named in the message), or a ``t_cnn`` without GPSA layers.
    """
    check_module(cnn, 'cnn')
    if not gpsa_layers(check_module(t_cnn, 't_cnn')):
        raise TcnnError('t_cnn has no GPSA layer, so there is nothing to compare: pass the T-CNN made by '
                        'tcnn.reparameterize(cnn)')
    input_size = check_size(input_size, 'input_size', 3) if input_size is not None else _default_input_size(cnn)
    check_number(batch_size, 'batch_size', ge=1, integer=True)
    check_number(seed, 'seed', ge=0, integer=True)
    check_device(device, 'device')
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InvalidTypeError(f'dtype must be a floating-point torch.dtype (e.g. torch.float64), got {dtype!r}')
    return _measure(lambda: contextlib.nullcontext(cnn), t_cnn, input_size, batch_size, seed, device, dtype)


def reparameterize_(
        model: nn.Module,
        *,
        stages: StageSpec = None,
        locality_strength: float = 1.0,
        gating_init: float = 1.0,
        qk_dim: Optional[int] = None,
        verify: bool = True,
        input_size: Optional[Sequence[int]] = None,
        tol: float = DEFAULT_TOLERANCE,
) -> nn.Module:
    """In-place ``reparameterize``: swaps the convs of ``model`` itself and returns it.

    Every other parameter stays the same object, so an optimiser that holds them keeps its state (late
    reparameterisation, T-CNN Table 3). Verification puts the original convs back temporarily to get the CNN's
    logits, so no copy of the model is made. See ``reparameterize`` for the arguments.
    """
    check_conversion_settings(locality_strength, gating_init, qk_dim, tol)
    if input_size is not None:
        input_size = check_size(input_size, 'input_size', 3)
    targets = find_convertible_convs(model, stages)
    source_name, stage_names = _model_name(model), resolve_stages(model, stages)
    convs = {}
    for name, conv in targets:
        model.set_submodule(name, GPSA.from_conv(conv, locality_strength, gating_init, qk_dim=qk_dim))
        convs[name] = conv
    model.tcnn_config = {
        'architecture': source_name,
        'stages': stage_names,
        'layers': list(convs),
        'locality_strength': float(locality_strength),
        'gating_init': float(gating_init),
        'qk_dim': qk_dim,
    }
    if verify:
        try:
            model.tcnn_report = _verify(model, convs, tuple(input_size or _default_input_size(model)), tol)
        except BaseException:  # a failed check or a bad input_size: leave the caller's model as it was
            for name, conv in convs.items():
                model.set_submodule(name, conv)
            del model.tcnn_config
            raise
    return model


def _verify(model: nn.Module, convs: Dict[str, nn.Module], size: Tuple[int, ...], tol: float) -> EquivalenceReport:
    """The equivalence report of a freshly converted model; raises ``ConversionError`` when it misses ``tol``."""
    source_name = model.tcnn_config['architecture']
    with full_precision_matmul():  # the user's TF32 settings stay theirs outside the check (training speed)
        report = _measure(lambda: _convs_restored(model, convs), model, size, 2, 0, None, None)
    if not report.passed(tol) and _all_float32(model, convs.values()):
        report = dataclasses.replace(report, float64_max_rel_err=_float64_error(model, convs, size))
        if report.passed(tol):
            warnings.warn(f'{source_name}: float32 logits differ by {report.max_rel_err:.3g} (> {tol:g}) but '
                          f'float64 ones by {report.float64_max_rel_err:.3g}: the network amplifies float32 '
                          'rounding; the conversion itself is exact')
    if not report.passed(tol):
        in_float64 = '' if report.float64_max_rel_err is None else f', {report.float64_max_rel_err:.3g} in float64'
        raise ConversionError(
            f'{source_name}: the T-CNN does not reproduce the CNN (max relative logits error '
            f'{report.max_rel_err:.3g} > {tol:g} in the exact configuration{in_float64})')
    return report


def _all_float32(model: nn.Module, convs) -> bool:
    tensors = [t for m in (model, *convs) for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()]
    return bool(tensors) and all(t.dtype == torch.float32 for t in tensors)


def _float64_error(model: nn.Module, convs: Dict[str, nn.Module], size: Sequence[int]) -> float:
    """Relative logits error of the exact configuration measured in float64 (models converted there and back:
    float32 -> float64 -> float32 is lossless, and the parameters stay the same objects)."""
    modules = [model, *convs.values()]
    try:
        for m in modules:
            m.double()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # the float32 check already warned if vacuous
            return _measure(lambda: _convs_restored(model, convs), model, size, 2, 0, None, torch.float64).max_rel_err
    finally:
        for m in modules:
            m.float()


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
) -> nn.Module:
    """Return a T-CNN: a copy of ``model`` whose k x k convs (k > 1) in ``stages`` are GPSA layers.

    The input model is left untouched (``reparameterize_`` converts in place). Each GPSA layer holds its conv's
    filter (T-CNN eq. 6) and starts at ``locality_strength``/``gating_init`` (the paper's fine-tuning init is
    1.0/1.0, on the verge of locality; ``locality_strength=50, gating_init=25`` gives a T-CNN that *is* the CNN).

    Args:
        model: A timm or torchvision ResNet (or any module with the named stages).
        stages: Which stages to convert (see ``resolve_stages``); default the last one, ``layer4``.
        locality_strength: Initial alpha of every head.
        gating_init: Initial lambda of every head.
        qk_dim: Per-head width of content queries/keys (default ``C_in // heads``, or a grouped conv's group
            width ``C_in // groups`` if smaller).
        verify: Compare logits with the CNN in the exact configuration (eval mode, 2 random images of
            ``input_size``) and raise ``ConversionError`` if the relative error exceeds ``tol``. The report is stored
            as ``t_model.tcnn_report``; a warning says when the check is vacuous (the layers do not change the logits).
        input_size: ``(C, H, W)`` for the verification; default the model's pretrained input size.
        tol: Tolerance of the verification.

    Raises:
        ConversionError: The model has no convertible conv, a conv cannot be reproduced exactly, or the verification
            fails.
    """
    check_conversion_settings(locality_strength, gating_init, qk_dim, tol)  # fail before copying
    if input_size is not None:
        check_size(input_size, 'input_size', 3)
    find_convertible_convs(model, stages)
    return reparameterize_(copy.deepcopy(model), stages=stages, locality_strength=locality_strength,
                           gating_init=gating_init, qk_dim=qk_dim, verify=verify, input_size=input_size, tol=tol)
