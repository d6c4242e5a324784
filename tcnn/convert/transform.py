"""Reparameterise a CNN into a T-CNN (arXiv:2106.05795, section 2): ``reparameterize`` and its in-place form.

The steps are the other modules of ``tcnn.convert``: the stages and their convs (``stages``), one GPSA layer per
conv holding its filter (``GPSA.from_conv``), multi-branch blocks re-classed for timm's fusion (``fusion``), and the
check that the T-CNN computes the CNN's function (``verify``).
"""
import copy
import dataclasses
from typing import Any, Optional, Sequence

import torch.nn as nn

from ..errors import InvalidArgumentError, check_conversion_settings, check_size
from ..layers.gpsa import GPSA
from .fusion import adopt_fusion
from .settings import CONVERSION_KEYS, ConversionSettings, StageSpec, gpsa_layers
from .stages import ConversionError, default_input_size, model_name, resolve_stages, stage_convs
from .verify import DEFAULT_TOLERANCE, check_inputs, verify_conversion

__all__ = ['reparameterize', 'reparameterize_']


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
    args = check_inputs(input_size, example_inputs)
    stage_names = resolve_stages(model, s.stages)
    targets = stage_convs(model, stage_names)
    source_name = model_name(model)
    convs, reclassed = {}, []
    old_config = model.__dict__.get('tcnn_config')
    try:  # a failed conversion or check, a bad input_size: the caller's model is left as it was
        for name, conv in targets:
            model.set_submodule(name, GPSA.from_conv(conv, s.locality_strength, s.gating_init, qk_dim=s.qk_dim))
            convs[name] = conv
        # RepVGG/MobileOne blocks: timm's reparameterize_model keeps the GPSA layers
        reclassed = adopt_fusion(model)
        model.tcnn_config = {
            'architecture': source_name,
            'layers': list(convs),
            **dataclasses.asdict(dataclasses.replace(s, stages=stage_names,
                                                     locality_strength=float(s.locality_strength),
                                                     gating_init=float(s.gating_init))),
        }
        if verify:
            model.tcnn_report = verify_conversion(model, convs, tuple(input_size or default_input_size(model)), tol,
                                                  args)
    except BaseException:
        for name, conv in convs.items():
            model.set_submodule(name, conv)
        for block, cls in reclassed:
            block.__class__ = cls
        model.__dict__.pop('tcnn_config', None)
        if old_config is not None:
            model.tcnn_config = old_config
        raise
    return model


def _refuse_converted(model: nn.Module) -> None:
    """A model with GPSA layers is refused at once: see ``reparameterize`` for why."""
    layers = [name for name, _ in gpsa_layers(model)]
    if layers:
        stages = (getattr(model, 'tcnn_config', None) or {}).get('stages')
        done = f' ({", ".join(map(str, stages))})' if stages else ''
        raise ConversionError(
            f'{model_name(model)} is a T-CNN already: {len(layers)} GPSA layers{done}, e.g. {layers[0]}; convert '
            'every stage in one call on the CNN, e.g. reparameterize(cnn, stages=[\'layer3\', \'layer4\'])')



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
    1.0/1.0, on the verge of locality, which moves the outputs away from the CNN's by design (README, "Exactness", gives
    the size); ``locality_strength=50, gating_init=25`` gives a T-CNN that *is* the CNN in float32).

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
    check_inputs(input_size, example_inputs)
    stages = resolve_stages(model, stages)  # once: an int on a torchvision model costs a probing forward pass
    stage_convs(model, stages)
    settings = ConversionSettings(stages, locality_strength, gating_init, qk_dim)
    return reparameterize_(copy.deepcopy(model), settings, verify=verify, input_size=input_size, tol=tol,
                           example_inputs=example_inputs)
