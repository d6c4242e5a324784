"""Tests of ``tcnn.data.rand_augment``: the ``rand-...`` string read as timm reads it, the level arguments as timm's
floats, the per-sample draws against what timm's own ``RandAugment`` draws (the statistical tests of
``augmentation.py``), the op table's refusal of a name it does not hold, and the ops through the batch."""
import dataclasses
import inspect
import random
from typing import Dict, List, Tuple

import numpy as np
import pytest
import timm.data.auto_augment as timm_aa
import torch
from PIL import Image
from torch.utils.data import default_collate

from augmentation import (ALPHA, FILL, MEAN, N_DRAWS, RECIPE, SQUARE, STD, chi2_p_value, denormalize, draw_params,
                          ks_p_value, to_levels, to_tensor)
from tcnn.data.batch_augment import BatchAugment
from tcnn.data.rand_augment import (RAND_AUGMENT, RandAugmentConfig, UnsupportedAugmentation, parse_rand_augment,
                                    rand_augment_level, rand_augment_op)
from tcnn.errors import TcnnError


# ----------------------------------------------------------------------------------------- the string and the levels


def test_rand_augment_config_strings_parse_like_timms():
    hparams = dict(translate_const=100, img_mean=FILL)
    for config in ('rand-m9-mstd0.5-inc1', 'rand-m9-mstd0.5', 'rand-m7-n3-p0.8-mstd101', 'rand-mstd1-tweights',
                   'rand-m15-mmax20-mstd0.5-mstd2', 'rand-n1', 'rand-m9-tfoo-inc1'):
        theirs = timm_aa.rand_augment_transform(config, dict(hparams))
        ours = parse_rand_augment(config)
        op = theirs.ops[0]
        assert [o.name for o in theirs.ops] == list(ours.ops), config
        assert (theirs.num_layers, op.prob, op.magnitude, op.magnitude_std, op.magnitude_max) == \
               (ours.num_layers, ours.prob, ours.magnitude, ours.magnitude_std, ours.magnitude_max), config
        weights = None if theirs.choice_weights is None else tuple(theirs.choice_weights)
        assert weights == (None if ours.weights is None else pytest.approx(ours.weights)), config


def test_level_arguments_are_timms_floats(monkeypatch):
    """``rand_augment_level`` = timm's ``LEVEL_TO_ARG`` (same negation draw) for every op and many magnitudes: up to
    20, which ``mmax20`` lets a noisy magnitude reach (the levels' clips at 256 and 128 are reached only there), with
    timm's default ``translate_pct`` and another."""
    for pct in (None, 0.3):
        hparams = dict(translate_const=43, img_mean=FILL, **({} if pct is None else {'translate_pct': pct}))
        ours = {} if pct is None else {'translate_pct': pct}
        for name in BatchAugment(96, auto_augment='rand-tweights').ra_ops + ('TranslateX', 'TranslateY', 'Posterize',
                                                                             'Solarize', 'Color', 'Contrast'):
            for magnitude in np.linspace(0, 20, 45):
                for seed in range(3):
                    monkeypatch.setattr(timm_aa, 'random', random.Random(seed))
                    level_fn = timm_aa.LEVEL_TO_ARG[name]
                    theirs = level_fn(magnitude, hparams)[0] if level_fn else 0.
                    assert rand_augment_level(name, magnitude, random.Random(seed), 43, **ours) == theirs, (
                        name, magnitude, pct)


def test_timms_op_lists_are_those_the_batched_draws_were_checked_against():
    """The ops a 'rand-...' string draws from are timm's lists, read from timm in its order (part of the draw): a timm
    release that changes them must fail here, where the batched draws' comparisons with timm were made."""
    default = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize', 'SolarizeAdd', 'Color',
               'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')
    increasing = tuple(name + 'Increasing' if name in ('Posterize', 'Solarize', 'Color', 'Contrast', 'Brightness',
                                                       'Sharpness') else name for name in default)
    weighted = {'Rotate': 3, 'ShearX': 2, 'ShearY': 2, 'TranslateXRel': 1, 'TranslateYRel': 1,
                'ColorIncreasing': .25, 'SharpnessIncreasing': 0.25, 'AutoContrast': 0.25, 'SolarizeIncreasing': .05,
                'SolarizeAdd': .05, 'ContrastIncreasing': .05, 'BrightnessIncreasing': .05, 'Equalize': .05,
                'PosterizeIncreasing': 0.05, 'Invert': 0.05}
    assert (tuple(timm_aa._RAND_TRANSFORMS), tuple(timm_aa._RAND_INCREASING_TRANSFORMS)) == (default, increasing)
    assert list(timm_aa._RAND_WEIGHTED_0.items()) == list(weighted.items())
    assert parse_rand_augment('rand-m9-mstd0.5').ops == default
    assert parse_rand_augment('rand-m9-mstd0.5-inc1').ops == increasing
    config = parse_rand_augment('rand-m9-n3-tweights')
    assert config.ops == tuple(weighted) and config.num_layers == 3
    assert config.weights == pytest.approx([w / sum(weighted.values()) for w in weighted.values()], rel=1e-15)
    assert sum(config.weights) == pytest.approx(1.0, rel=1e-15)


def test_the_table_holds_every_op_of_timms_lists_and_resamples_where_timm_does():
    """Each op of timm's RandAugment lists (default, increasing, weighted) has its entry, and an entry is geometric (its
    resample drawn) exactly where timm's op checks its resample arguments (``_check_args_tf``)."""
    timm_names = set(timm_aa._RAND_TRANSFORMS + timm_aa._RAND_INCREASING_TRANSFORMS) | set(timm_aa._RAND_WEIGHTED_0)
    assert timm_names <= set(RAND_AUGMENT), timm_names - set(RAND_AUGMENT)
    for name, op in RAND_AUGMENT.items():
        assert op.geometric == ('_check_args_tf' in inspect.getsource(timm_aa.NAME_TO_OP[name])), name


def _apply_an_unknown_op():
    """A BatchAugment whose op names were changed after it was made, applied to an image that drew the changed op."""
    aug = BatchAugment(32, auto_augment='rand-n1-p1.0')
    params = aug.draw_many([(random.Random(0), (32, 32))])
    params['ra_op'][0, 0] = 0
    aug.ra_ops = ('Solarise',) + aug.ra_ops[1:]
    aug([torch.zeros((3, 32, 32), dtype=torch.uint8)], params)


@pytest.mark.parametrize('refuse', [
    lambda: rand_augment_op('Solarise'),
    lambda: rand_augment_level('Solarise', 9, random.Random(0), 100),
    lambda: RandAugmentConfig(ops=('Rotate', 'Solarise'), weights=None),
    _apply_an_unknown_op,
], ids=['table', 'level', 'config', 'batch'])
def test_an_unknown_op_name_is_refused_naming_the_ops_there_are(refuse):
    """A name the table does not hold is an error wherever it is looked up, never another op."""
    with pytest.raises(UnsupportedAugmentation) as info:
        refuse()
    message = str(info.value)
    assert isinstance(info.value, TcnnError) and "RandAugment op 'Solarise' is not implemented" in message
    assert message.endswith('supported: ' + ', '.join(RAND_AUGMENT)), message


# ------------------------------------------------------------------------------------------ the draws against timm's


def _record_timm_rand_augment(config: str, n: int, seed: int) -> List[List[Tuple[str, bool, tuple]]]:
    """What timm's real ``rand_augment_transform(config, hparams)`` draws for ``n`` images: per image, per layer,
    (op name, applied, level arguments). Each op's ``aug_fn`` records instead of drawing pixels."""
    hparams = dict(translate_const=int(224 * 0.45), img_mean=FILL, interpolation=Image.BICUBIC)
    ra = timm_aa.rand_augment_transform(config, hparams)
    calls: List = []

    class Chosen:
        def __init__(self, op):
            self.op = op

            def record(img, *args, **_):
                calls[-1][-1] = (op.name, True, args)
                return img
            op.aug_fn = record

        def __call__(self, img):
            calls[-1].append((self.op.name, False, ()))
            return self.op(img)

    ra.ops = [Chosen(op) for op in ra.ops]
    random.seed(seed)
    np.random.seed(seed)
    img = Image.new('RGB', (4, 4))
    for _ in range(n):
        calls.append([])
        ra(img)
    return calls


def _ra_samples(layers: List[List[Tuple[str, bool, tuple]]]) -> Dict[str, list]:
    """Op choices per layer, applied flags, and each op's arguments, from per-image layer records."""
    out: Dict[str, list] = {'chosen': [], 'applied': []}
    for image in layers:
        for layer, (name, applied, args) in enumerate(image):
            out['chosen'].append((layer, name))
            out['applied'].append(applied)
            if applied:
                out.setdefault(name, []).append(args[0] if args else 0.)
    return out


def _compare_rand_augment(config: str, ours: BatchAugment, seed: int = 0) -> Dict[str, float]:
    """p-values: op frequency per layer among applied ops, the applied rate, and each op's argument."""
    theirs = _ra_samples(_record_timm_rand_augment(config, N_DRAWS, seed))
    params = draw_params(ours, N_DRAWS, seed + 1)
    mine: Dict[str, list] = {'applied_op': [], 'applied': []}
    for ops_row, args_row in zip(params['ra_op'].tolist(), params['ra_arg'].tolist()):
        for layer, (k, arg) in enumerate(zip(ops_row, args_row)):
            mine['applied'].append(k >= 0)
            if k >= 0:
                mine['applied_op'].append((layer, ours.ra_ops[k]))
                mine.setdefault(ours.ra_ops[k], []).append(arg)
    theirs_applied_op = [c for c, a in zip(theirs['chosen'], theirs['applied']) if a]
    p = {'op frequency': chi2_p_value(mine['applied_op'], theirs_applied_op),
         'applied rate': chi2_p_value(mine['applied'], theirs['applied'])}
    for name in ours.ra_ops:
        a, b = mine.get(name, []), theirs.get(name, [])
        if name in ('AutoContrast', 'Equalize', 'Invert'):
            continue
        discrete = name.startswith(('Posterize', 'Solarize'))
        p[name] = chi2_p_value(a, b) if discrete else ks_p_value(a, b)
    return p


def test_rand_augment_draws_match_timms_distributions():
    ours = BatchAugment(224, **RECIPE)
    p = _compare_rand_augment('rand-m9-mstd0.5-inc1', ours)
    assert min(p.values()) > ALPHA, {k: v for k, v in p.items() if v <= ALPHA}


def test_weighted_rand_augment_draws_match_timms():
    """'tweights': weighted choice without replacement (timm: replace=choice_weights is None), uniform magnitude."""
    ours = BatchAugment(224, auto_augment='rand-m9-n3-mstd101-tweights', interpolation='bicubic')
    p = _compare_rand_augment('rand-m9-n3-mstd101-tweights', ours, seed=1)
    assert min(p.values()) > ALPHA, {k: v for k, v in p.items() if v <= ALPHA}


@pytest.mark.parametrize('break_', ['mstd 0.7', 'without replacement', 'prob 0.45'])
def test_rand_augment_comparison_catches_a_wrong_sampler(break_):
    """The statistical test has the power to see a plausible slip in the sampler."""
    ours = BatchAugment(224, **RECIPE)
    cfg = ours.rand_augment
    if break_ == 'mstd 0.7':
        ours.rand_augment = dataclasses.replace(cfg, magnitude_std=0.7)
    elif break_ == 'without replacement':  # uniform weights: distinct ops per image
        ours.rand_augment = dataclasses.replace(cfg, weights=(1 / len(cfg.ops),) * len(cfg.ops))
    else:
        ours.rand_augment = dataclasses.replace(cfg, prob=0.45)
    p = _compare_rand_augment('rand-m9-mstd0.5-inc1', ours)
    if break_ == 'without replacement':  # invisible in per-layer frequencies: the pair of ops of an image shows it
        params = draw_params(ours, N_DRAWS, 1)
        same_ours = [int(a == b) for a, b in params['ra_op'].tolist() if a >= 0 and b >= 0]
        theirs = _record_timm_rand_augment('rand-m9-mstd0.5-inc1', N_DRAWS, 0)
        same_theirs = [int(x[0] == y[0]) for (x, y) in theirs if x[1] and y[1]]
        p['same op twice'] = chi2_p_value(same_ours, same_theirs)
    assert min(p.values()) <= ALPHA, p


def test_same_op_twice_matches_timm():
    """With replacement, an image draws the same op in both layers as often as timm's (1/15 of the time)."""
    params = draw_params(BatchAugment(224, **RECIPE), N_DRAWS, 1)
    same_ours = [int(a == b) for a, b in params['ra_op'].tolist() if a >= 0 and b >= 0]
    theirs = _record_timm_rand_augment('rand-m9-mstd0.5-inc1', N_DRAWS, 0)
    same_theirs = [int(x[0] == y[0]) for (x, y) in theirs if x[1] and y[1]]
    assert chi2_p_value(same_ours, same_theirs) > ALPHA


# ----------------------------------------------------------------------------------------- the ops through the batch


def test_relative_translations_through_the_batch_fill_with_timms_img_mean():
    """TranslateXRel/YRel through ``BatchAugment`` (pixels = fraction x side) fill with timm's img_mean."""
    aug = BatchAugment(96, scale=(1, 1), hflip=0, auto_augment='rand-n1-p1.0', interpolation='nearest', mean=MEAN,
                       std=STD)
    for name, fn in (('TranslateXRel', timm_aa.translate_x_rel), ('TranslateYRel', timm_aa.translate_y_rel)):
        for pct in (0.3, -0.45):
            params = default_collate([aug.draw(random.Random(0), (96, 96))])
            params['crop'][0] = torch.tensor([0, 0, 96, 96])
            params['ra_op'][0, 0], params['ra_arg'][0, 0], params['ra_interp'][0, 0] = aug.ra_ops.index(name), pct, 0
            out = to_levels(denormalize(aug([to_tensor(SQUARE[0])], params)[0]))
            ref = np.asarray(fn(Image.fromarray(SQUARE[0]), pct, fillcolor=FILL, resample=Image.NEAREST))
            assert np.array_equal(out, ref), name


@pytest.mark.parametrize('name', list(RAND_AUGMENT))
def test_every_op_of_the_table_is_timms_through_its_batched_call(name):
    """Each entry's batched call (the table built at import: which op, which of its arguments it passes, pixels =
    fraction x side for the relative translations), given timm's level arguments at two magnitudes with a random
    sign, gives timm's op on the same image with the same fill, nearest resample (Pillow's arithmetic exactly)."""
    op = RAND_AUGMENT[name]
    hparams = dict(translate_const=40, translate_pct=0.3, img_mean=FILL)
    random.seed(7)
    for magnitude in (5, 9):
        args = timm_aa.LEVEL_TO_ARG[name](magnitude, hparams) if timm_aa.LEVEL_TO_ARG[name] else ()
        images = torch.stack([to_tensor(a) for a in SQUARE[:2]])
        arg = torch.full((2,), float(args[0]) if args else 0.0, dtype=torch.float64)
        out = op.apply(images, arg, FILL, torch.zeros(2, dtype=torch.int64), 96)
        for k in range(2):
            ref = timm_aa.NAME_TO_OP[name](Image.fromarray(SQUARE[k]), *args, fillcolor=FILL, resample=Image.NEAREST)
            assert np.array_equal(to_levels(out[k]), np.asarray(ref)), (name, magnitude, args)


class _Fixed(random.Random):
    """A stream whose ``random()`` is always ``value``."""

    def __init__(self, value: float):
        super().__init__(0)
        self.value = value

    def random(self):
        return self.value


def test_weighted_op_choice_at_the_ends_of_each_ops_interval_is_numpys():
    """The weighted choice (timm's ``np.random.choice(p=weights)``: the first op whose cumulative weight exceeds the
    draw) at a draw on the boundary between two ops (the later one, as numpy's ``searchsorted(side='right')``) and at
    the top of [0, 1), where the rounded running sum can stay at or above 0 after the last op (the last op)."""
    from tcnn.data.rand_augment import _choose_ops
    ops = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize')
    quarter = RandAugmentConfig(ops=ops[:3], weights=(0.25, 0.25, 0.5), num_layers=1)
    assert _choose_ops(quarter, _Fixed(0.25)) == [1] and _choose_ops(quarter, _Fixed(0.0)) == [0]
    assert int(np.searchsorted(np.cumsum(quarter.weights), 0.25, side='right')) == 1
    top = RandAugmentConfig(ops=ops, weights=(0.006, 0.041, 0.621, 1.0, 0.873), num_layers=1)
    assert _choose_ops(top, _Fixed(1 - 2 ** -53)) == [4]


def test_a_level_is_negated_above_one_half_as_timms():
    """timm's ``_randomly_negate``: negated when ``random() > 0.5``; a draw of exactly 0.5 keeps the sign."""
    from tcnn.data.rand_augment import _negate
    assert _negate(3.0, _Fixed(0.5)) == 3.0 and _negate(3.0, _Fixed(0.5000001)) == -3.0


def test_a_layer_not_applied_is_recorded_as_op_minus_one_with_argument_zero():
    """``draw_rand_augment``'s record of a layer whose op was not applied (its probability not met): op -1,
    argument 0, resample -1, as ``PARAMS`` documents."""
    from tcnn.data.rand_augment import draw_rand_augment
    config = parse_rand_augment('rand-m9-n3-p0.5')
    assert draw_rand_augment(config, _Fixed(0.75), 100, -1) == ([-1, -1, -1], [0.0, 0.0, 0.0], [-1, -1, -1])
