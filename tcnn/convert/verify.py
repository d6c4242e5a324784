"""Equivalence measurement: does a T-CNN compute its CNN's function? (T-CNN, arXiv:2106.05795, section 2)

A GPSA layer in the exact configuration computes its conv, so a right conversion gives the CNN's outputs up to float
rounding. ``check_equivalence`` measures that on random images or example inputs (and how far the T-CNN's own init
departs, and whether the replaced layers matter at all); ``verify_conversion`` is the check ``reparameterize`` runs,
with its second look in float64.
"""
import contextlib
import dataclasses
import math
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_device, check_module, check_number, \
    check_size
from ..layers.gpsa import EXACT_GATING, GPSA
from .settings import eval_mode, exact_configuration, gpsa_layers, restore_modes, restored_parameters, \
    unsharded_gpsa_layers
from .stages import ConversionError, default_input_size, model_name

__all__ = ['DEFAULT_TOLERANCE', 'EquivalenceReport', 'check_equivalence', 'check_example_inputs', 'check_inputs',
           'eval_mode', 'restore_modes', 'full_precision_matmul', 'output_errors', 'verify_conversion',
           'RECHECK_DTYPES']

DEFAULT_TOLERANCE = 1e-4
# Below the default tolerance, even content-only attention in place of every conv would pass the check: it proves
# nothing (random-init ConvNeXts scale every block by 1e-6 and reach ~2e-6).
VACUOUS_SENSITIVITY = DEFAULT_TOLERANCE


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

    ``verdict`` tells rounding from a wrong conversion (``check_equivalence`` and ``reparameterize`` set it; None in
    reports of older files): ``'equivalent'`` (``max_rel_err`` within the tolerance), ``'rounding'`` (missed in the
    models' dtype, within it in float64: the network amplifies rounding, e.g. a detector's NMS and top-k picks swap
    on near-equal scores), ``'wrong conversion'`` (missed in float64 too, or the models are float64), or
    ``'unconfirmed'`` (missed, and mixed dtypes leave no lossless float64 copy to measure).
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
    verdict: Optional[str] = None

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
                 else '') + (f'; verdict: {self.verdict}' if self.verdict else '') +
                (' [vacuous: the replaced layers do not change the logits]' if self.vacuous else ''))


@contextlib.contextmanager
def full_precision_matmul() -> Iterator[None]:
    """Float32 matmuls and cuDNN convolutions in true float32 (TF32 off) inside the block; the previous switches after.

    PyTorch's defaults let cuDNN convolutions use TF32 (10-bit mantissa) on Ampere and newer GPUs, and ``tcnn train``
    turns it on for matmuls too: the CNN's convs and the GPSA layers then round differently, by more than the 1e-4
    verification tolerance. Only the process-wide switches are touched, so this affects every thread of the process.
    """
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision('highest')
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        # last: the precision is the finer switch ('medium' and 'high' both read as allow_tf32 = True)
        torch.set_float32_matmul_precision(saved[2])


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


def output_errors(reference: Any, other: Any) -> Tuple[float, float, str]:
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
    """Temporarily make every GPSA layer attend by content only (gate ~0): a function far from the conv. The gates
    are restored on every exit path, a failure part-way through setting them included."""
    layers = [layer for _, layer in gpsa_layers(model)]
    with restored_parameters(layers, GPSA.gating_params):
        for layer in layers:
            layer.set_gating(-EXACT_GATING)
        yield model


@contextlib.contextmanager
def _convs_restored(model: nn.Module, convs: Dict[str, nn.Module]) -> Iterator[nn.Module]:
    """Temporarily put the original convs back in place of their GPSA layers: the model is the CNN again. The GPSA
    layers are back on every exit path, a failure part-way through the swap included."""
    layers = {name: model.get_submodule(name) for name in convs}
    try:
        for name, conv in convs.items():
            model.set_submodule(name, conv)
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
        raise InvalidArgumentError(f'{what} the model ({model_name(cnn)}): {type(e).__name__}: '
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
    abs_err, rel_err, where = output_errors(ref, exact)
    init_abs, init_rel, _ = output_errors(ref, init)
    nested = not isinstance(ref, torch.Tensor)
    report = EquivalenceReport(abs_err, rel_err, init_abs, init_rel, tuple(input_size), batch_size,
                               str(dtype).replace('torch.', ''), len(gpsa_layers(t_cnn)),
                               output_errors(ref, content)[1],
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
        tol: float = DEFAULT_TOLERANCE,
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
        tol: The relative error within which the models are equivalent. Float32, float16 or bfloat16 models that
            miss it are measured again on float64 copies (``float64_max_rel_err``), where a right conversion agrees
            to ~1e-14 however much the network amplifies rounding: ``verdict`` says which it is
            (``EquivalenceReport``).

    Raises:
        TcnnError: A bad argument (named in the message), a model that does not run on the input (one line naming
            the fix), or a ``t_cnn`` without GPSA layers.
    """
    check_module(cnn, 'cnn')
    if not unsharded_gpsa_layers(check_module(t_cnn, 't_cnn'), 'check_equivalence'):
        raise TcnnError('t_cnn has no GPSA layer, so there is nothing to compare: pass the T-CNN made by '
                        'tcnn.reparameterize(cnn)')
    args = check_inputs(input_size, example_inputs)
    input_size = check_size(input_size, 'input_size', 3) if input_size is not None else default_input_size(cnn)
    check_number(batch_size, 'batch_size', ge=1, integer=True)
    check_number(seed, 'seed', ge=0, integer=True)
    check_device(device, 'device')
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InvalidTypeError(f'dtype must be a floating-point torch.dtype (e.g. torch.float64), got {dtype!r}')
    check_number(tol, 'tol', gt=0)

    def measure(in_dtype: Optional[torch.dtype]) -> EquivalenceReport:
        return _measure(lambda: contextlib.nullcontext(cnn), t_cnn, input_size, batch_size, seed, device, in_dtype,
                        args)
    report = measure(dtype)
    dtypes = [_uniform_dtype(cnn, ()), _uniform_dtype(t_cnn, ())]
    if report.max_rel_err <= tol or None in dtypes or report.dtype == 'float64':
        return _with_verdict(report, tol)
    return _with_verdict(report, tol, float64=_in_float64([cnn, t_cnn], dtypes, lambda: measure(torch.float64)))


def _with_verdict(report: EquivalenceReport, tol: float, float64: Optional[float] = None) -> EquivalenceReport:
    """``report`` with its float64 error (None: not measured) and ``verdict`` (``EquivalenceReport``)."""
    if report.max_rel_err <= tol:
        verdict = 'equivalent'
    elif float64 is not None:
        verdict = 'rounding' if float64 <= tol else 'wrong conversion'
    else:
        verdict = 'wrong conversion' if report.dtype == 'float64' else 'unconfirmed'
    return dataclasses.replace(report, float64_max_rel_err=float64, verdict=verdict)


def _in_float64(modules: Sequence[nn.Module], dtypes: Sequence[torch.dtype],
                measure: Callable[[], EquivalenceReport]) -> float:
    """``measure()``'s relative error with ``modules`` converted to float64 and back to ``dtypes`` (lossless from
    ``RECHECK_DTYPES``; the parameters stay the same objects)."""
    try:
        for m in modules:
            m.double()
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # the first measurement already warned if vacuous
            return measure().max_rel_err
    finally:
        for m, dtype in zip(modules, dtypes):
            m.to(dtype)


def check_inputs(input_size: Optional[Sequence[int]], example_inputs: Any) -> Optional[Tuple[Any, ...]]:
    """``example_inputs`` as forward arguments (``check_example_inputs``), None without them; not both sizes."""
    if example_inputs is None:
        return None
    if input_size is not None:
        raise InvalidArgumentError('pass input_size (random images) or example_inputs, not both')
    return check_example_inputs(example_inputs)


def verify_conversion(model: nn.Module, convs: Dict[str, nn.Module], size: Tuple[int, ...], tol: float,
                      example_inputs: Optional[Tuple[Any, ...]] = None) -> EquivalenceReport:
    """The equivalence report of a freshly converted model (``convs``: the convs its GPSA layers replaced, by name);
    raises ``ConversionError`` when it misses ``tol``.

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
        modules = [model, *convs.values()]
        report = _with_verdict(report, tol, _in_float64(modules, [dtype] * len(modules), lambda: _measure(
            lambda: _convs_restored(model, convs), model, size, 2, 0, None, torch.float64, example_inputs)))
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
    return report if report.verdict else _with_verdict(report, tol)


# dtypes whose verification is repeated in float64 when it misses: the conversion there and back is lossless
RECHECK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _uniform_dtype(model: nn.Module, convs) -> Optional[torch.dtype]:
    """The one floating dtype of every parameter and buffer of ``model`` and ``convs`` if it is in
    ``RECHECK_DTYPES``, else None (mixed dtypes, or float64 already)."""
    dtypes = {t.dtype for m in (model, *convs) for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in RECHECK_DTYPES else None
