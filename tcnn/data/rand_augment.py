"""timm's RandAugment (``timm.data.auto_augment``) for the batched augmentation: the ``rand-...`` string's reading
(``parse_rand_augment`` -> ``RandAugmentConfig``), one table from op name to what the op is (``RAND_AUGMENT``: how
its argument follows from the magnitude, the batched op that applies it, whether it is geometric), and the per-sample
draw (``draw_rand_augment``: ``RandAugment.__call__`` and each chosen ``AugmentOp.__call__``).

The level functions are timm's ``LEVEL_TO_ARG`` with the same arithmetic, hence the same floats, and their random
negation drawn from the caller's ``random.Random`` in timm's order; the batched ops are ``tcnn.data.batch_colour``'s
PIL ops and ``tcnn.data.batch_geometry``'s affine ops. A name that is not in the table is refused
(``UnsupportedAugmentation``, naming the ops that are).
"""
import random
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

from ..errors import TcnnError
from .batch_colour import (pil_autocontrast, pil_brightness, pil_color, pil_contrast, pil_equalize, pil_invert,
                           pil_posterize, pil_sharpness, pil_solarize, pil_solarize_add)
from .batch_geometry import BICUBIC, BILINEAR, rotate, shear_x, shear_y, translate_x, translate_y

__all__ = ['UnsupportedAugmentation', 'RandAugmentConfig', 'parse_rand_augment', 'RandAugmentOp', 'RAND_AUGMENT',
           'rand_augment_op', 'rand_augment_level', 'draw_rand_augment', 'LevelHparams', 'TRANSLATE_PCT']

Tensor = torch.Tensor


class UnsupportedAugmentation(TcnnError):
    """A timm augmentation setting the batched path does not implement (message: which setting, and what is
    supported)."""


# timm's _LEVEL_DENOM: the 'Mx' magnitude scale's denominator
_LEVEL_DENOM = 10.
# timm's _HPARAMS_DEFAULT translate_pct: the relative translations' largest shift, a fraction of the side
TRANSLATE_PCT = 0.45
SUPPORTED_AA = "RandAugment strings ('rand-m9-mstd0.5-inc1', options m, n, p, mstd, mmax, inc, t)"


# ------------------------------------------------------------------------------------------------- the config


@dataclass(frozen=True)
class RandAugmentConfig:
    """A ``rand-...`` string as ``timm.data.auto_augment.rand_augment_transform`` reads it.

    Attributes:
        ops: The op names, in timm's list order.
        weights: The op choice's probabilities (``tweights``: no replacement), or None (uniform, with replacement).
        num_layers: Ops per image (``n``, default 2).
        magnitude: ``m`` (default 10).
        prob: Probability of each chosen op (``p``, default 0.5).
        magnitude_std: ``mstd`` (0: none; ``inf`` for ``mstd`` > 100: uniform in [0, m]).
        magnitude_max: ``mmax``, the clip of the noisy magnitude instead of 10 (None: 10).
    """
    ops: Tuple[str, ...]
    weights: Optional[Tuple[float, ...]]
    num_layers: int = 2
    magnitude: float = _LEVEL_DENOM
    prob: float = 0.5
    magnitude_std: float = 0.
    magnitude_max: Optional[int] = None

    def __post_init__(self) -> None:
        for name in self.ops:
            rand_augment_op(name)  # an op the batched path does not know is refused here, before any draw


def parse_rand_augment(config_str: str) -> RandAugmentConfig:
    """``rand_augment_transform``'s reading of ``config_str`` (sections split by '-': ``m``, ``n``, ``p``, ``mstd``
    (the first one counts; > 100 means uniform), ``mmax``, ``inc``, ``t`` (the op set: 'weights' for weighted choice
    without replacement; timm's unknown names fall back to the default list).

    Raises:
        UnsupportedAugmentation: Not a 'rand' string, an unknown section, or an op set of ops not implemented
            ('3a', '3aw': Desaturate, GaussianBlur).
    """
    config = config_str.split('-')
    if config[0] != 'rand':
        raise UnsupportedAugmentation(f'auto_augment {config_str!r} is not a RandAugment string; the batched '
                                      f'augmentation supports {SUPPORTED_AA}')
    magnitude, num_layers, increasing, prob = _LEVEL_DENOM, 2, False, 0.5
    hparams: Dict[str, float] = {}
    choice = None
    for c in config[1:]:
        if c.startswith('t'):
            choice = choice if choice is not None else c[1:]
            continue
        cs = re.split(r'(\d.*)', c)
        if len(cs) < 2:
            continue
        key, val = cs[:2]
        try:
            if key == 'mstd':
                mstd = float(val)
                hparams.setdefault('magnitude_std', float('inf') if mstd > 100 else mstd)
            elif key == 'mmax':
                hparams.setdefault('magnitude_max', int(val))
            elif key == 'inc':
                increasing = bool(int(val))
            elif key == 'm':
                magnitude = int(val)
            elif key == 'n':
                num_layers = int(val)
            elif key == 'p':
                prob = float(val)
            else:
                raise UnsupportedAugmentation(f'auto_augment {config_str!r}: unknown RandAugment section {c!r} '
                                              f'(supported, as in timm: m, n, p, mstd, mmax, inc, t)')
        except ValueError as e:
            raise UnsupportedAugmentation(f'auto_augment {config_str!r}: section {c!r} is not a number ({e}); '
                                          f'supported: {SUPPORTED_AA}') from None
    weights = None
    if choice in ('3a', '3aw'):
        raise UnsupportedAugmentation(f'auto_augment {config_str!r}: the op set t{choice} (3-Augment: Desaturate, '
                                      f'GaussianBlur) is not implemented; supported: the default sets and tweights')
    # timm's op lists (default, increasing, 'tweights' with its weights): which ops a string draws from, in timm's
    # order, which is part of the draw; tests/test_rand_augment.py pins them, so a timm that changes them fails there
    from timm.data import auto_augment as timm_lists
    if choice == 'weights':
        names = tuple(timm_lists._RAND_WEIGHTED_0)
        total = sum(timm_lists._RAND_WEIGHTED_0.values())
        weights = tuple(w / total for w in timm_lists._RAND_WEIGHTED_0.values())
        if num_layers > len(names):  # numpy's choice without replacement refuses it too
            raise UnsupportedAugmentation(f'auto_augment {config_str!r}: {num_layers} layers drawn without '
                                          f'replacement from {len(names)} ops')
    else:
        names = tuple(timm_lists._RAND_INCREASING_TRANSFORMS if increasing else timm_lists._RAND_TRANSFORMS)
    return RandAugmentConfig(ops=names, weights=weights, num_layers=num_layers, magnitude=magnitude, prob=prob,
                             magnitude_std=hparams.get('magnitude_std', 0.), magnitude_max=hparams.get('magnitude_max'))


# --------------------------------------------------------------------------------------------------- the ops


class LevelHparams(NamedTuple):
    """The hparams that timm's level functions read: the translations' scales.

    Attributes:
        translate_const: The absolute translations' largest shift, pixels (timm: ``int(img_size * 0.45)``).
        translate_pct: The relative translations' largest shift, a fraction of the side.
    """
    translate_const: int
    translate_pct: float = TRANSLATE_PCT


# A level function is timm's ``LEVEL_TO_ARG[name]`` of a magnitude: ``(level, rng, hparams)`` -> the op's argument,
# its random negation drawn from ``rng``. A batched op is ``(images, arg, fill, interpolation, side)`` -> images: the
# op on uint8 ``(n, 3, side, side)`` images with the per-image arguments, the fill colour and the resample codes.
LevelFn = Callable[[float, random.Random, LevelHparams], float]
BatchedOp = Callable[[Tensor, Tensor, Sequence[int], Tensor, int], Tensor]


def _negate(value: float, rng: random.Random) -> float:
    """timm's ``_randomly_negate``."""
    return -value if rng.random() > 0.5 else value


def _no_argument(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return 0.


def _rotate_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return _negate((level / _LEVEL_DENOM) * 30., rng)


def _posterize_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return int((level / _LEVEL_DENOM) * 4)


def _posterize_increasing_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return 4 - int((level / _LEVEL_DENOM) * 4)


def _solarize_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return min(256, int((level / _LEVEL_DENOM) * 256))


def _solarize_increasing_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return 256 - min(256, int((level / _LEVEL_DENOM) * 256))


def _solarize_add_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return min(128, int((level / _LEVEL_DENOM) * 110))


def _enhance_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return (level / _LEVEL_DENOM) * 1.8 + 0.1


def _enhance_increasing_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return max(0.1, 1.0 + _negate((level / _LEVEL_DENOM) * .9, rng))


def _shear_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return _negate((level / _LEVEL_DENOM) * 0.3, rng)


def _translate_abs_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return _negate((level / _LEVEL_DENOM) * float(hparams.translate_const), rng)


def _translate_rel_level(level: float, rng: random.Random, hparams: LevelHparams) -> float:
    return _negate((level / _LEVEL_DENOM) * hparams.translate_pct, rng)


def _images_only(fn: Callable[[Tensor], Tensor]) -> BatchedOp:
    """An op without an argument (AutoContrast, Equalize, Invert)."""
    return lambda images, arg, fill, interpolation, side: fn(images)


def _integer(fn: Callable[[Tensor, Tensor], Tensor]) -> BatchedOp:
    """An op of an integer argument (bits, threshold, addend)."""
    return lambda images, arg, fill, interpolation, side: fn(images, arg.long())


def _factor(fn: Callable[[Tensor, Tensor], Tensor]) -> BatchedOp:
    """An ``ImageEnhance`` op of its enhancement factor."""
    return lambda images, arg, fill, interpolation, side: fn(images, arg)


def _affine(fn: Callable[[Tensor, Tensor, Sequence[int], Tensor], Tensor]) -> BatchedOp:
    """An affine op of degrees, a shear or pixels, with the fill colour and the resample."""
    return lambda images, arg, fill, interpolation, side: fn(images, arg, fill, interpolation)


def _relative(fn: Callable[[Tensor, Tensor, Sequence[int], Tensor], Tensor]) -> BatchedOp:
    """A translation by a fraction of the side: timm's ``translate_*_rel`` (pixels = pct * ``img.size[0 or 1]``, the
    square crop's side here)."""
    return lambda images, arg, fill, interpolation, side: fn(images, arg * side, fill, interpolation)


class RandAugmentOp(NamedTuple):
    """One RandAugment op.

    Attributes:
        level: timm's ``LEVEL_TO_ARG`` entry (``LevelFn``): the argument of a magnitude.
        apply: The batched op (``BatchedOp``).
        geometric: Whether it resamples the image (then its resample is drawn: timm's ``_check_args_tf``).
    """
    level: LevelFn
    apply: BatchedOp
    geometric: bool


# Every op of timm's RandAugment lists (default, increasing, 'tweights'), and the absolute translations
RAND_AUGMENT: Mapping[str, RandAugmentOp] = MappingProxyType({
    'AutoContrast': RandAugmentOp(_no_argument, _images_only(pil_autocontrast), False),
    'Equalize': RandAugmentOp(_no_argument, _images_only(pil_equalize), False),
    'Invert': RandAugmentOp(_no_argument, _images_only(pil_invert), False),
    'Rotate': RandAugmentOp(_rotate_level, _affine(rotate), True),
    'Posterize': RandAugmentOp(_posterize_level, _integer(pil_posterize), False),
    'PosterizeIncreasing': RandAugmentOp(_posterize_increasing_level, _integer(pil_posterize), False),
    'Solarize': RandAugmentOp(_solarize_level, _integer(pil_solarize), False),
    'SolarizeIncreasing': RandAugmentOp(_solarize_increasing_level, _integer(pil_solarize), False),
    'SolarizeAdd': RandAugmentOp(_solarize_add_level, _integer(pil_solarize_add), False),
    'Color': RandAugmentOp(_enhance_level, _factor(pil_color), False),
    'ColorIncreasing': RandAugmentOp(_enhance_increasing_level, _factor(pil_color), False),
    'Contrast': RandAugmentOp(_enhance_level, _factor(pil_contrast), False),
    'ContrastIncreasing': RandAugmentOp(_enhance_increasing_level, _factor(pil_contrast), False),
    'Brightness': RandAugmentOp(_enhance_level, _factor(pil_brightness), False),
    'BrightnessIncreasing': RandAugmentOp(_enhance_increasing_level, _factor(pil_brightness), False),
    'Sharpness': RandAugmentOp(_enhance_level, _factor(pil_sharpness), False),
    'SharpnessIncreasing': RandAugmentOp(_enhance_increasing_level, _factor(pil_sharpness), False),
    'ShearX': RandAugmentOp(_shear_level, _affine(shear_x), True),
    'ShearY': RandAugmentOp(_shear_level, _affine(shear_y), True),
    'TranslateX': RandAugmentOp(_translate_abs_level, _affine(translate_x), True),
    'TranslateY': RandAugmentOp(_translate_abs_level, _affine(translate_y), True),
    'TranslateXRel': RandAugmentOp(_translate_rel_level, _relative(translate_x), True),
    'TranslateYRel': RandAugmentOp(_translate_rel_level, _relative(translate_y), True),
})


def rand_augment_op(name: str) -> RandAugmentOp:
    """``RAND_AUGMENT[name]``.

    Raises:
        UnsupportedAugmentation: ``name`` is not in the table (the message lists the ops that are).
    """
    try:
        return RAND_AUGMENT[name]
    except KeyError:
        raise UnsupportedAugmentation(f'RandAugment op {name!r} is not implemented; supported: '
                                      f'{", ".join(RAND_AUGMENT)}') from None


def rand_augment_level(name: str, level: float, rng: random.Random, translate_const: int,
                       translate_pct: float = TRANSLATE_PCT) -> float:
    """timm's ``LEVEL_TO_ARG[name](level, hparams)[0]`` (0 for the ops without an argument), with its random
    negation drawn from ``rng``: the same arithmetic, hence the same floats.

    Raises:
        UnsupportedAugmentation: An op not in ``RAND_AUGMENT``.
    """
    return rand_augment_op(name).level(level, rng, LevelHparams(translate_const, translate_pct))


# -------------------------------------------------------------------------------------------------- the draw


def _choose_ops(config: RandAugmentConfig, rng: random.Random) -> List[int]:
    """``RandAugment.__call__``'s op choice: ``config.num_layers`` indices of ``config.ops``."""
    n = config.num_layers
    if config.weights is None:  # numpy's choice with replacement: independent uniform picks
        return [rng.randrange(len(config.ops)) for _ in range(n)]
    # without replacement (timm: replace=choice_weights is None): successive weighted picks
    chosen, left = [], list(range(len(config.ops)))
    for _ in range(n):
        u = rng.random() * sum(config.weights[k] for k in left)
        pick = left[-1]
        for k in left:
            u -= config.weights[k]
            if u < 0:
                pick = k
                break
        chosen.append(pick)
        left.remove(pick)
    return chosen


def draw_rand_augment(config: RandAugmentConfig, rng: random.Random, translate_const: int,
                      interp_code: int) -> Tuple[List[int], List[float], List[int]]:
    """``RandAugment.__call__`` and each chosen ``AugmentOp.__call__`` (probability, magnitude noise, level) for one
    image, every random number from ``rng`` in timm's order.

    Args:
        config: The RandAugment string, read.
        rng: The sample's generator.
        translate_const: timm's ``translate_const`` hparam (the absolute translations' largest shift in pixels).
        interp_code: The geometric ops' resample, an index of ``batch_geometry.INTERPOLATIONS``; -1: bilinear or
            bicubic drawn per op ('random').

    Returns:
        Per layer the op (an index of ``config.ops``; -1 where the layer was not applied), its argument, and the
        resample of a geometric op (-1 for the others).
    """
    n = config.num_layers
    op, arg, interp = [-1] * n, [0.] * n, [-1] * n
    upper = config.magnitude_max or _LEVEL_DENOM
    hparams = LevelHparams(translate_const)
    for layer, k in enumerate(_choose_ops(config, rng)):
        if config.prob < 1.0 and rng.random() > config.prob:
            continue
        magnitude = config.magnitude
        if config.magnitude_std > 0:
            if config.magnitude_std == float('inf'):
                magnitude = rng.uniform(0, magnitude)
            else:
                magnitude = rng.gauss(magnitude, config.magnitude_std)
        magnitude = max(0., min(magnitude, upper))
        entry = rand_augment_op(config.ops[k])
        op[layer] = k
        arg[layer] = float(entry.level(magnitude, rng, hparams))
        if entry.geometric:  # timm's _check_args_tf: a resample choice per call with 'random'
            interp[layer] = rng.choice((BILINEAR, BICUBIC)) if interp_code < 0 else interp_code
    return op, arg, interp
