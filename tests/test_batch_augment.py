"""Tests of ``tcnn.data.batch_augment``: ``BatchAugment``, timm's training transform drawn per sample and applied per
batch, and ``BatchEval``, timm's eval transform on a batch, against timm itself (how: ``augmentation.py``): the
whole transform step by step against timm's ops, the crop, flip, ColorJitter and erasing draws against timm's and
torchvision's, and the object's promises (determinism, batching, shapes, what is refused). The ops have their own
files: ``test_batch_geometry.py``, ``test_batch_colour.py``, ``test_batch_misc.py``, ``test_rand_augment.py``."""
import math
import random
from typing import Dict, List, Tuple

import numpy as np
import pytest
import timm.data.auto_augment as timm_aa
import timm.data.random_erasing as timm_re
import torch
import torchvision
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as TF2
from PIL import Image
from timm.data import create_transform
from timm.data.transforms import RandomResizedCropAndInterpolation
from torch.utils.data import default_collate
from torchvision.transforms import ColorJitter

from augmentation import (ALPHA, FILL, IMAGES, MEAN, N_DRAWS, PIL_RESAMPLE, RECIPE, SQUARE, STD, TALL,
                          chi2_p_value, denormalize, draw_params, ks_p_value, to_tensor)
from tcnn.data import batch_geometry
from tcnn.data import batch_augment
from tcnn.data.batch_augment import PARAMS, BatchAugment, BatchEval, UnsupportedAugmentation
from tcnn.data.transforms import posterize as safe_posterize
from tcnn.errors import InvalidArgumentError, InvalidTypeError, TcnnError


# -------------------------------------------------------------------------------- the whole transform against timm's


def test_horizontal_flip_and_normalisation_are_timms():
    aug = BatchAugment(96, scale=(1, 1), hflip=1.0, color_jitter=None, mean=MEAN, std=STD)
    params = default_collate([aug.draw(random.Random(0), (96, 96))])
    assert bool(params['flip'][0])
    out = aug([to_tensor(SQUARE[1])], params)[0]
    timm_tf = create_transform(96, is_training=True, scale=(1, 1), hflip=1.0, color_jitter=None, mean=MEAN, std=STD)
    assert torch.equal(out, timm_tf(Image.fromarray(SQUARE[1])))  # bit-equal floats: ToTensor + Normalize's ops


def test_composition_equals_timms_ops_in_timms_order():
    """A whole batch (crop, flip, two RandAugment layers, erasing) against a per-image chain of timm's PIL ops
    with the same drawn parameters, and one with ColorJitter against torchvision's ops: nearest interpolation, so
    every step is exact (the jitter's ops are torchvision's uint8 tensor ops)."""
    rng = random.Random(5)
    aug = BatchAugment(64, auto_augment='rand-m9-mstd0.5-inc1', interpolation='nearest', re_prob=0.5,
                       re_mode='const', re_count=2, mean=MEAN, std=STD)
    jitter = BatchAugment(64, color_jitter=(0.4, 0.4, 0.4, 0.1), interpolation='nearest', mean=MEAN, std=STD)
    for a in IMAGES[:4]:
        for b in (aug, jitter):
            params = default_collate([b.draw(rng, a.shape[:2]) for _ in range(6)])
            out = b([to_tensor(a)] * 6, params)
            for k in range(6):
                assert torch.equal(out[k], _reference(b, a, {key: v[k] for key, v in params.items()})), k


def _reference(aug: BatchAugment, a: np.ndarray, p: Dict[str, torch.Tensor]) -> torch.Tensor:
    """timm's transform, step by step, with the parameters ``p`` instead of its own draws."""
    top, left, h, w = p['crop'].tolist()
    interp = batch_geometry.INTERPOLATIONS[int(p['interp'])]
    img = Image.fromarray(a).crop((left, top, left + w, top + h)).resize((aug.img_size,) * 2, PIL_RESAMPLE[interp])
    if p['flip']:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    for k, arg, code in zip(p['ra_op'].tolist(), p['ra_arg'].tolist(), p['ra_interp'].tolist()):
        if k < 0:
            continue
        name = aug.ra_ops[k]
        fn = safe_posterize if name.startswith('Posterize') else timm_aa.NAME_TO_OP[name]
        resample = PIL_RESAMPLE[batch_geometry.INTERPOLATIONS[code]] if code >= 0 else None
        if timm_aa.LEVEL_TO_ARG[name] is None:
            img = fn(img)
        else:
            arg = int(arg) if name.startswith(('Posterize', 'Solarize')) else arg
            img = fn(img, arg, fillcolor=FILL, resample=resample)
    x = TF2.pil_to_tensor(img)
    fns = (TF2.adjust_brightness, TF2.adjust_contrast, TF2.adjust_saturation, TF2.adjust_hue)
    for f in p['cj_order'].tolist():
        if aug.jitter[f] is not None:
            x = fns[f](x, float(p['cj_factor'][f]))
    x = TF2.normalize(x.float().div(255), MEAN, STD)
    for top, left, h, w in p['re_box'].tolist():
        x[:, top:top + h, left:left + w] = 0
    return x


# ------------------------------------------------------------------------------------------ the draws against timm's


def _timm_crops(size: Tuple[int, int], scale, ratio, n: int, seed: int) -> np.ndarray:
    random.seed(seed)
    img = Image.new('RGB', (size[1], size[0]))
    return np.array([RandomResizedCropAndInterpolation.get_params(img, scale, ratio) for _ in range(n)])


def _crop_p_values(ours: np.ndarray, theirs: np.ndarray, size: Tuple[int, int]) -> Dict[str, float]:
    def stats(c):
        top, left, h, w = c.T.astype(float)
        return {'area': h * w / (size[0] * size[1]), 'aspect': w / h, 'top': top / np.maximum(size[0] - h, 1),
                'left': left / np.maximum(size[1] - w, 1)}
    a, b = stats(ours), stats(theirs)
    p = {k: ks_p_value(a[k], b[k]) for k in a}
    p['whole image'] = chi2_p_value(list(a['area'] == 1), list(b['area'] == 1))
    return p


@pytest.mark.parametrize('size,scale', [((375, 500), (0.08, 1.0)), ((60, 500), (0.08, 1.0)), ((96, 96), (0.5, 1))])
def test_crop_draws_match_timms_get_params(size, scale):
    """Area, aspect ratio and position of the crop; a 60 x 500 image often takes the centre-crop fallback."""
    aug = BatchAugment(96, scale=scale)
    ours = draw_params(aug, N_DRAWS, 2, size)['crop'].numpy()
    theirs = _timm_crops(size, scale, (3 / 4, 4 / 3), N_DRAWS, 3)
    p = _crop_p_values(ours, theirs, size)
    assert min(p.values()) > ALPHA, p


def test_flip_and_random_interpolation_draws_match_timms(monkeypatch):
    """The flip rate (torchvision's ``RandomHorizontalFlip``: ``torch.rand(1) < p``) and the crop's bilinear/bicubic
    choice with 'random' (``RandomResizedCropAndInterpolation.__call__``'s ``random.choice``)."""
    from timm.data import transforms as timm_transforms
    from torchvision.transforms import RandomHorizontalFlip
    params = draw_params(BatchAugment(32, hflip=0.3, interpolation='random'), N_DRAWS // 2, 8, (40, 40))
    torch.manual_seed(9)
    flip = RandomHorizontalFlip(0.3)
    probe = torch.tensor([[[0, 1]]])
    theirs_flip = [bool(flip(probe)[0, 0, 0] == 1) for _ in range(N_DRAWS // 2)]
    chosen: List = []
    monkeypatch.setattr(timm_transforms.F, 'resized_crop', lambda img, i, j, h, w, size, interp: chosen.append(interp))
    random.seed(9)
    rrc = RandomResizedCropAndInterpolation(32, interpolation='random')
    img = Image.new('RGB', (40, 40))
    for _ in range(N_DRAWS // 2):
        rrc(img)
    theirs_interp = [str(c).split('.')[-1].lower() for c in chosen]
    ours_interp = [batch_geometry.INTERPOLATIONS[c] for c in params['interp'].tolist()]
    p = {'flip': chi2_p_value(params['flip'].tolist(), theirs_flip),
         'interpolation': chi2_p_value(ours_interp, theirs_interp)}
    assert len(theirs_interp) == N_DRAWS // 2 and set(ours_interp) == set(theirs_interp) == {'bilinear', 'bicubic'}
    assert min(p.values()) > ALPHA, p


def test_crop_comparison_catches_a_wrong_ratio_range():
    aug = BatchAugment(96, ratio=(3 / 4, 1.4))
    p = _crop_p_values(draw_params(aug, N_DRAWS, 2)['crop'].numpy(),
                       _timm_crops((375, 500), (0.08, 1.0), (3 / 4, 4 / 3), N_DRAWS, 3), (375, 500))
    assert min(p.values()) <= ALPHA, p


def _timm_jitter(strength: Tuple[float, ...], n: int, seed: int) -> Tuple[np.ndarray, List[tuple]]:
    torch.manual_seed(seed)
    cj = ColorJitter(*strength)
    draws = [cj.get_params(cj.brightness, cj.contrast, cj.saturation, cj.hue) for _ in range(n)]
    factors = np.array([[d[1], d[2], d[3], d[4] if d[4] is not None else 0.] for d in draws])
    return factors, [tuple(d[0].tolist()) for d in draws]


def test_color_jitter_draws_match_torchvisions():
    aug = BatchAugment(96, color_jitter=(0.4, 0.3, 0.2, 0.1))
    params = draw_params(aug, N_DRAWS, 4)
    theirs, orders = _timm_jitter((0.4, 0.3, 0.2, 0.1), N_DRAWS, 5)
    p = {f'factor {i}': ks_p_value(params['cj_factor'][:, i].numpy(), theirs[:, i]) for i in range(4)}
    p['order'] = chi2_p_value([tuple(o) for o in params['cj_order'].tolist()], orders)
    assert min(p.values()) > ALPHA, p
    broken = BatchAugment(96, color_jitter=(0.4, 0.3, 0.25, 0.1))
    assert ks_p_value(draw_params(broken, N_DRAWS, 4)['cj_factor'][:, 2].numpy(), theirs[:, 2]) <= ALPHA


def _timm_erasing(count: int, n: int, seed: int, probability: float = 0.25) -> Tuple[list, list]:
    """timm's ``RandomErasing(mode='pixel')`` on zeros: per image the erased flag and its boxes (``_get_pixels``
    records each box's size; with one box its position is where the noise is)."""
    random.seed(seed)
    torch.manual_seed(seed)
    sizes: List = []
    real = timm_re._get_pixels

    def record(per_pixel, rand_color, patch_size, dtype=torch.float32, device='cpu'):
        sizes[-1].append(tuple(patch_size[1:]))
        return real(per_pixel, rand_color, patch_size, dtype=dtype, device=device)
    timm_re._get_pixels = record
    try:
        eraser = timm_re.RandomErasing(probability, mode='pixel', max_count=count, device='cpu')
        boxes = []
        for _ in range(n):
            sizes.append([])
            x = eraser(torch.zeros(3, 96, 96))
            if count == 1 and sizes[-1]:
                ys, xs = (x != 0).any(0).nonzero(as_tuple=True)
                boxes.append((int(ys.min()), int(xs.min())))
    finally:
        timm_re._get_pixels = real
    return sizes, boxes


@pytest.mark.parametrize('count', [1, 3])
def test_erasing_draws_match_timms(count):
    aug = BatchAugment(96, re_prob=0.25, re_mode='pixel', re_count=count)
    params = draw_params(aug, N_DRAWS // 2, 6, (96, 96))
    sizes, positions = _timm_erasing(count, N_DRAWS // 2, 7)
    boxes = params['re_box'].numpy()
    ours_sizes = [[tuple(b[2:]) for b in image if b[2] > 0] for image in boxes]
    p = {'erased': chi2_p_value([bool(s) for s in ours_sizes], [bool(s) for s in sizes]),
         'count': chi2_p_value([len(s) for s in ours_sizes], [len(s) for s in sizes])}
    for i, what in enumerate(('height', 'width')):
        p[what] = ks_p_value([b[i] for s in ours_sizes for b in s], [b[i] for s in sizes for b in s])
    if count == 1:
        ours_pos = [tuple(image[0][:2]) for image in boxes if image[0][2] > 0]
        for i, what in enumerate(('top', 'left')):
            p[what] = ks_p_value([b[i] for b in ours_pos], [b[i] for b in positions])
    assert min(p.values()) > ALPHA, p


class _Recorder:
    """An image for timm's ``RandomErasing._erase`` that records the boxes written into it."""

    def __init__(self):
        self.boxes = []

    def __setitem__(self, key, value):
        _, rows, columns = key
        self.boxes.append((rows.start, columns.start, rows.stop - rows.start, columns.stop - columns.start))


@pytest.mark.parametrize('count', [1, 3])
def test_erasing_boxes_are_timms_draw_for_draw(count):
    """The same random stream gives timm's ``_erase`` boxes, box for box (the count drawn only when it can vary,
    the height from area x aspect, the width from area / aspect)."""
    aug = BatchAugment(32, re_prob=0.5, re_mode='const', re_count=count)
    eraser = timm_re.RandomErasing(probability=0.5, mode='const', max_count=count, device='cpu')
    erased = 0
    for seed in range(100):
        ours = aug._draw_erasing(random.Random(seed))
        random.seed(seed)
        recorder = _Recorder()
        eraser._erase(recorder, 3, 32, 32, torch.float32)
        assert ours == recorder.boxes, seed
        erased += bool(ours)
    assert 30 < erased < 70


def test_erasing_is_drawn_at_a_draw_equal_to_its_probability_and_given_up_after_ten_attempts(monkeypatch):
    """timm erases unless ``random() > probability`` (a draw equal to it erases), and gives a box up after ten
    attempts whose box does not fit."""
    class Half(random.Random):
        def random(self):
            return 0.5
    aug = BatchAugment(32, re_prob=0.5, re_mode='const')
    assert len(aug._draw_erasing(Half(0))) == 1
    too_big = [1 / 3, math.log(1 / 0.3)] * 10  # area 1/3 at aspect 1/0.3: 34 px high, more than the image
    script = too_big + [0.1, 0.0]  # an eleventh attempt would fit

    class Scripted(random.Random):
        def uniform(self, a, b):
            return script.pop(0)
    assert BatchAugment(32, re_prob=1.0, re_mode='const')._draw_erasing(Scripted(0)) == []
    assert script == [0.1, 0.0]
    script[:] = [0.3, math.log(0.3), 0.1, 0.0]  # 10 x 32: as wide as the image, which does not fit; then 10 x 10
    assert [box[2:] for box in BatchAugment(32, re_prob=1.0, re_mode='const')._draw_erasing(Scripted(0))] == [(10, 10)]


# ------------------------------------------------------------------------------------------------- the object itself


def test_draw_is_deterministic_and_uses_only_its_rng():
    aug = BatchAugment(224, **RECIPE)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    first = [aug.draw(random.Random(11), (375, 500)) for _ in range(3)]
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    second = [aug.draw(random.Random(11), (375, 500)) for _ in range(3)]
    for a, b in zip(first, second):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    aug.draw(random.Random(1), (375, 500))
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


def test_params_have_fixed_shapes_and_dtypes():
    for kwargs in (RECIPE, dict(color_jitter=0.3, scale=(1, 1), interpolation='bicubic'),
                   dict(auto_augment='rand-n3', re_prob=1.0, re_count=4, interpolation='random')):
        aug = BatchAugment(96, **kwargs)
        rng = random.Random(0)
        shapes = {(k, tuple(v.shape), v.dtype) for _ in range(200) for k, v in aug.draw(rng, (120, 80)).items()}
        assert len(shapes) == 10, shapes


def test_each_drawn_parameter_has_the_key_shape_and_dtype_params_states():
    """``PARAMS`` is the one statement of a sample's parameters: ``draw`` gives its keys in its order, each of its
    dtype and shape (``L``: the RandAugment layers, ``K``: the erasing boxes)."""
    for kwargs, sizes in ((RECIPE, {'L': 2, 'K': 1}), (dict(auto_augment='rand-n3', re_prob=1.0, re_count=4),
                                                        {'L': 3, 'K': 4}), (dict(color_jitter=0.3), {'L': 0, 'K': 1})):
        params = BatchAugment(96, **kwargs).draw(random.Random(0), (120, 80))
        assert list(params) == [p.key for p in PARAMS]
        for p in PARAMS:
            shape = tuple(sizes.get(d, d) for d in p.shape)
            assert params[p.key].dtype == p.dtype and tuple(params[p.key].shape) == shape, (p.key, kwargs)

def test_a_list_of_sizes_equals_one_image_at_a_time():
    aug = BatchAugment(64, **{**RECIPE, 're_prob': 1.0, 'interpolation': 'random'})
    rng = random.Random(2)
    images = [to_tensor(a) for a in IMAGES]
    params = [aug.draw(rng, tuple(t.shape[1:])) for t in images]
    batch = aug(images, default_collate(params))
    singles = torch.cat([aug([t], default_collate([p])) for t, p in zip(images, params)])
    assert torch.equal(batch, singles)
    assert torch.equal(aug(images, default_collate(params)), batch)  # deterministic given (images, params)
    same = torch.stack([to_tensor(a) for a in SQUARE])
    params = default_collate(params[:3])
    assert torch.equal(aug(same, params), aug(list(same), params))


def test_chunks_on_the_cpu_equal_the_whole_batch_at_once(monkeypatch):
    """The CPU takes the batch a few images at a time; other devices take it at once: the same result."""
    for kwargs in (RECIPE, dict(color_jitter=(0.3, 0.3, 0.3, 0.1), interpolation='bicubic', mean=MEAN, std=STD)):
        aug = BatchAugment(64, **{**kwargs, 're_prob': 0.5})
        rng = random.Random(4)
        images = [to_tensor(a) for a in IMAGES] * 3
        params = default_collate([aug.draw(rng, tuple(t.shape[1:])) for t in images])
        monkeypatch.setattr('tcnn.data.batch_augment.CPU_CHUNK_ELEMENTS', 4 * 3 * 64 * 64)  # 4 images at a time
        chunked = aug(images, params)
        monkeypatch.setattr('tcnn.data.batch_augment.CPU_CHUNK_ELEMENTS', 1 << 40)
        assert torch.equal(aug(images, params), chunked)


def test_the_output_is_normalised_float32_of_the_output_size_on_the_images_device():
    aug = BatchAugment(32, scale=(1, 1), hflip=0, color_jitter=None, mean=MEAN, std=STD)
    flat = torch.full((3, 40, 50), 200, dtype=torch.uint8)
    params = default_collate([aug.draw(random.Random(0), (40, 50))] * 2)
    out = aug([flat, flat], params)
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.float32 and out.device == flat.device
    expected = (200 / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert torch.allclose(out.mean((0, 2, 3)), expected.float(), atol=1e-6)
    ev = BatchEval(32, mean=MEAN, std=STD)
    assert ev([flat, flat[:, :30]]).shape == (2, 3, 32, 32)


def test_whole_image_crops_of_a_stacked_batch_are_one_copy():
    """The demo's setting (scale (1, 1) on images of the output size): a (B, 3, H, W) batch goes through the
    one-copy path and gives what the same images as a list give (one resize each); a single crop that is not the
    whole image sends the batch back to the per-image path, with the same result as the list."""
    augment = BatchAugment(24, scale=(1.0, 1.0), auto_augment=None, color_jitter=0.3, interpolation='bicubic')
    batch = torch.randint(0, 256, (6, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    params = augment.draw_many([(random.Random(i), (24, 24)) for i in range(6)])
    assert bool((params['crop'] == torch.tensor([0, 0, 24, 24])).all())
    assert torch.equal(augment(batch, params), augment(list(batch), params))
    params['crop'][2] = torch.tensor([1, 2, 20, 21])
    assert torch.equal(augment(batch, params), augment(list(batch), params))


# ------------------------------------------------------------------------------------------------ the eval transform


# (crop mode, interpolation) -> (mean, max) |diff| tolerance in levels, 1.5x measured (the resize's, as above)
EVAL_TOLERANCE = {('center', 'bicubic'): (0.0054, 1),  # measured 0.0036, 1
                  ('center', 'bilinear'): (0.0026, 1),  # measured 0.0017, 1
                  ('squash', 'bicubic'): (0.0047, 1),  # measured 0.0031, 1
                  ('center', 'nearest'): (0, 0)}  # measured 0, 0


@pytest.mark.parametrize('crop_mode,interpolation', list(EVAL_TOLERANCE))
def test_batch_eval_stays_within_the_measured_difference_from_timms_eval_transform(crop_mode, interpolation):
    ev = BatchEval(64, crop_pct=0.9, crop_mode=crop_mode, interpolation=interpolation, mean=MEAN, std=STD)
    tf = create_transform(64, is_training=False, crop_pct=0.9, crop_mode=crop_mode, interpolation=interpolation,
                          mean=MEAN, std=STD)
    out = ev([to_tensor(a) for a in IMAGES])
    d = torch.cat([(denormalize(out[k]).int() - denormalize(tf(Image.fromarray(a))).int()).abs().flatten()
                   for k, a in enumerate(IMAGES)]).float()
    mean_tol, max_tol = EVAL_TOLERANCE[crop_mode, interpolation]
    assert d.mean() <= mean_tol and d.max() <= max_tol, (d.mean(), d.max())
    same = torch.stack([to_tensor(a) for a in TALL])
    assert torch.equal(ev(same), ev(list(same)))


def test_the_eval_resize_takes_torchvisions_output_size_for_wide_tall_and_square_images():
    """The shorter side to ``floor(img_size / crop_pct)``, the longer one scaled and truncated, as torchvision's
    ``Resize(scale_size)`` in timm's eval transform sizes it; ``squash``: both sides."""
    ev, squash = BatchEval(32, crop_pct=0.875), BatchEval(32, crop_pct=0.875, crop_mode='squash')
    resize = torchvision.transforms.Resize(ev.scale_size, antialias=True)
    for height, width in [(40, 70), (70, 40), (50, 50), (37, 36), (36, 37), (20, 91), (91, 20)]:
        expected = tuple(resize(torch.zeros(1, height, width)).shape[-2:])
        assert ev._resized_size(height, width) == expected, (height, width)
        assert squash._resized_size(height, width) == (ev.scale_size, ev.scale_size)


def test_the_eval_centre_crop_pads_and_crops_as_torchvision():
    """``crop_pct`` > 1 resizes the image below ``img_size``: the crop pads with zeros as torchvision's
    ``center_crop`` does (the odd pixel after), on one side or both; larger images are cropped at its offsets,
    also where the other side pads (a side 1, 3 or 4 pixels longer than the crop: the offsets round half to even)."""
    ev = BatchEval(9, crop_pct=1.0)
    generator = torch.Generator().manual_seed(0)
    for height, width in [(5, 6), (6, 5), (4, 9), (9, 4), (7, 12), (12, 7), (7, 13), (13, 7), (7, 10), (10, 7),
                          (9, 9), (14, 11), (2, 3)]:
        x = torch.randint(1, 256, (2, 3, height, width), dtype=torch.uint8, generator=generator)
        ours = ev._center_crop(x)
        assert torch.equal(ours, TF.center_crop(x, [9, 9])), (height, width)


def test_eval_of_one_sized_batch_resizes_it_in_one_call_and_equals_the_list_path(monkeypatch):
    """A ``(B, 3, H, W)`` uint8 batch is resized in one call (the point of the batch path); a list of the same images
    takes one call each; both give the same floats (crops, and pads where crop_pct > 1 resizes below the crop), on
    the images' device (meta: nothing is computed)."""
    calls = []
    resize = batch_geometry.resize
    monkeypatch.setattr(batch_geometry, 'resize', lambda x, *args: calls.append(tuple(x.shape)) or resize(x, *args))
    batch = torch.randint(0, 256, (3, 3, 12, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for crop_pct in (0.875, 1.25):
        calls.clear()
        ev = BatchEval(9, crop_pct=crop_pct)
        together = ev(batch)
        assert calls == [(3, 3, 12, 10)]
        apart = ev(list(batch))
        assert calls[1:] == [(3, 12, 10)] * 3 and torch.equal(together, apart) and together.dtype == torch.float32
    zero = together[0, :, 0, 0].view(3, 1)  # 12 x 10 -> 8 x 7 in 9 x 9: zeros in columns 0, 8 and row 8
    assert torch.equal(zero.flatten(), -torch.tensor(MEAN) / torch.tensor(STD))
    assert all((together[i, :, :, j] == zero).all() and (together[i, :, 8, :] == zero).all()
               for i in range(3) for j in (0, 8))
    assert not (together[:, :, :8, 1:8] == zero.view(3, 1, 1)).all()
    calls.clear()
    for images in (torch.empty(2, 3, 12, 10, dtype=torch.uint8, device='meta'),
                   [torch.empty(3, 12, 10, dtype=torch.uint8, device='meta'),
                    torch.empty(3, 9, 14, dtype=torch.uint8, device='meta')]):
        out = ev(images)
        assert out.device.type == 'meta' and out.shape == (2, 3, 9, 9) and out.dtype == torch.float32
    assert [shape[0] for shape in calls] == [2, 3, 3]


@pytest.mark.parametrize('images', [torch.zeros(2, 3, 12, 10), torch.zeros(2, 1, 12, 10, dtype=torch.uint8),
                                    torch.zeros(2, 4, 12, 10, dtype=torch.uint8),
                                    torch.zeros(3, 12, 10, dtype=torch.uint8)],
                         ids=['float', 'one channel', 'four channels', 'one image'])
def test_eval_refuses_what_is_not_a_uint8_rgb_batch(images):
    with pytest.raises(InvalidArgumentError, match='must be'):
        BatchEval(9)(images)


def _params(aug: BatchAugment, sizes) -> Dict[str, torch.Tensor]:
    return default_collate([aug.draw(random.Random(i), size) for i, size in enumerate(sizes)])


def test_only_a_gpu_resizes_a_batchs_crops_together():
    assert batch_augment.batched_resize(torch.device('cuda'))
    assert not batch_augment.batched_resize(torch.device('cpu')) and not batch_augment.batched_resize(
        torch.device('meta'))


def test_batch_augment_stays_on_the_images_device():
    """The result, the crops and the flipped images' index are on the images' device, seen on the meta device: a
    batch of whole crops (one copy, flips gathered), and a list of images of other sizes (a resize each)."""
    aug = BatchAugment(16, auto_augment=None, color_jitter=0.4, hflip=1.0, scale=(1, 1), ratio=(1, 1))
    batch = torch.empty(4, 3, 16, 16, dtype=torch.uint8, device='meta')
    out = aug(batch, _params(aug, [(16, 16)] * 4))
    assert out.device.type == 'meta' and out.dtype == torch.float32 and out.shape == (4, 3, 16, 16)
    aug = BatchAugment(16, auto_augment=None, re_prob=1.0, re_mode='const')
    images = [torch.empty(3, 20 + i, 24, dtype=torch.uint8, device='meta') for i in range(3)]
    out = aug(images, _params(aug, [(20 + i, 24) for i in range(3)]))
    assert out.device.type == 'meta' and out.dtype == torch.float32 and out.shape == (3, 3, 16, 16)


def test_rand_augment_on_the_cpu_goes_in_chunks_of_the_batch(monkeypatch):
    """On the CPU a RandAugment batch goes through in chunks of CPU_CHUNK_ELEMENTS // (3 * size^2) images (at least
    one), each with its slice of a stacked batch; colour jitter alone takes the batch at once. The chunks give the
    batch's pixels."""
    seen = []
    augment = BatchAugment._augment

    def spy(self, images, p, result, stacked=None):
        seen.append((len(images), None if stacked is None else len(stacked), len(p['crop']), len(result)))
        return augment(self, images, p, result, stacked)
    monkeypatch.setattr(BatchAugment, '_augment', spy)
    aug = BatchAugment(16, auto_augment='rand-m9-mstd0.5-inc1', scale=(1, 1), ratio=(1, 1))
    batch = torch.randint(0, 256, (7, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    params = _params(aug, [(16, 16)] * 7)
    whole = aug(batch, params)
    assert seen == [(7, 7, 7, 7)]  # 1 << 19 elements: 682 images of 16 px
    for elements, chunks in ((3 * 16 * 16 * 3, [3, 3, 1]), (100, [1] * 7)):
        seen.clear()
        monkeypatch.setattr(batch_augment, 'CPU_CHUNK_ELEMENTS', elements)
        assert torch.equal(aug(batch, params), whole)
        assert seen == [(k, k, k, k) for k in chunks]
        seen.clear()
        assert torch.equal(aug(list(batch), params), whole)
        assert seen == [(k, None, k, k) for k in chunks]
    seen.clear()
    jitter = BatchAugment(16, auto_augment=None, color_jitter=0.4, scale=(1, 1), ratio=(1, 1))
    jitter(batch, _params(jitter, [(16, 16)] * 7))
    assert seen == [(7, 7, 7, 7)]


def test_a_stacked_batch_of_whole_crops_is_copied_and_other_crops_are_resized(monkeypatch):
    """Where every crop is the whole image of the output size (the demo's scale (1, 1) on its 96 px data), a stacked
    batch is copied, not resized image by image; other crops of a stacked batch, and crops of the output size from
    larger images, are resized: both as the list of the same images gives them."""
    calls = []
    resize = batch_geometry.resize
    monkeypatch.setattr(batch_geometry, 'resize', lambda x, *args: calls.append(tuple(x.shape)) or resize(x, *args))
    g = torch.Generator().manual_seed(2)
    aug = BatchAugment(16, auto_augment=None, color_jitter=None, hflip=0.5, scale=(1, 1), ratio=(1, 1))
    batch = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8, generator=g)
    params = _params(aug, [(16, 16)] * 4)
    whole = aug(batch, params)
    assert calls == []
    assert torch.equal(whole, aug(list(batch), params)) and len(calls) == 4
    for images, crops in ((batch, [[0, 0, 16, 16], [2, 3, 10, 12], [0, 0, 16, 16], [1, 1, 15, 15]]),
                          (torch.randint(0, 256, (4, 3, 20, 24), dtype=torch.uint8, generator=g),
                           [[0, 0, 16, 16]] * 4)):
        params['crop'] = torch.tensor(crops)
        calls.clear()
        out = aug(images, params)
        assert len(calls) == 4 and torch.equal(out, aug(list(images), params))


def test_ops_on_images_of_an_odd_size_gather_and_scatter_them_as_bytes():
    """RandAugment's ops gather the images that drew them and scatter the results back as int32 words where an image
    is whole words; an image of 3 x 15 x 15 bytes is not, and takes the byte copy: each image of the batch gets what
    it gets augmented alone."""
    aug = BatchAugment(15, auto_augment='rand-m9-n3-mstd0.5-inc1', color_jitter=None, scale=(1, 1), ratio=(1, 1))
    batch = torch.randint(0, 256, (6, 3, 15, 15), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    params = _params(aug, [(15, 15)] * 6)
    assert len(torch.unique(params['ra_op'])) > 3  # several ops, each on some of the images
    out = aug(batch, params)
    for i in range(6):
        assert torch.equal(out[i:i + 1], aug(batch[i:i + 1], {k: v[i:i + 1] for k, v in params.items()}))


@pytest.mark.parametrize('images, message', [
    (torch.zeros(3, 12, 10, dtype=torch.uint8), 'images must be (B, 3, H, W), got shape (3, 12, 10)'),
    ([], 'images is empty'),
    ([np.zeros((3, 4, 4), np.uint8)], 'images[0] must be a uint8 (3, H, W) tensor, got ndarray'),
    ([torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(3, 4, 4)],
     'images[1] must be a uint8 (3, H, W) tensor, got torch.float32 (3, 4, 4)'),
    ([torch.zeros(3, 4, dtype=torch.uint8)], 'images[0] must be a uint8 (3, H, W) tensor, got torch.uint8 (3, 4)'),
    ([torch.zeros(1, 4, 4, dtype=torch.uint8)],
     'images[0] must be a uint8 (3, H, W) tensor, got torch.uint8 (1, 4, 4)'),
    ([torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(3, 4, 4, dtype=torch.uint8, device='meta')],
     'images[1] is on meta, images[0] on cpu: one device only'),
], ids=['one image', 'none', 'numpy', 'float', 'two dims', 'one channel', 'two devices'])
def test_the_transforms_refuse_what_is_not_uint8_rgb_images_on_one_device_naming_it(images, message):
    for transform in (BatchEval(9), BatchAugment(9, auto_augment=None)):
        with pytest.raises(InvalidArgumentError) as info:
            transform(images) if isinstance(transform, BatchEval) else transform(images, {})
        assert str(info.value) == message


def test_color_jitter_strengths_are_torchvisions_ranges():
    """Each component is a strength s (factors 1 - s .. 1 + s, clipped at 0; hue -s .. s) or a (min, max) pair, as
    torchvision's ``ColorJitter`` reads it; 0 (or the pair (1, 1)) turns a component off."""
    aug = BatchAugment(16, color_jitter=((0.6, 1.4), 1.5, 0, 0.1))
    assert aug.jitter == ((0.6, 1.4), (0.0, 2.5), None, (-0.1, 0.1))
    assert BatchAugment(16, color_jitter=(0.3, (1, 1), [0.5, 0.5], (-0.2, 0.3))).jitter == (
        (0.7, 1.3), None, (0.5, 0.5), (-0.2, 0.3))
    assert BatchAugment(16, color_jitter=(0, 0, 0, 0.5)).jitter == (None, None, None, (-0.5, 0.5))  # hue's bounds


@pytest.mark.parametrize('jitter, error, message', [
    ((-0.1, 0.4, 0.4), InvalidArgumentError, 'color_jitter brightness must be non-negative, got -0.1'),
    ((True, 0.4, 0.4), InvalidTypeError, 'color_jitter brightness must be a number or a (min, max) pair, got True'),
    ((0.4, 'ab', 0.4), InvalidTypeError, "color_jitter contrast must be a number or a (min, max) pair, got 'ab'"),
    ((0.4, 0.4, (0.5,)), InvalidTypeError, 'color_jitter saturation must be a number or a (min, max) pair, got (0.5,)'),
    ((0.4, 0.4, 0.4, 0.6), InvalidArgumentError, 'color_jitter hue must lie in (-0.5, 0.5), got (-0.6, 0.6)'),
])
def test_color_jitter_refuses_what_torchvision_refuses_naming_the_component(jitter, error, message):
    with pytest.raises(error) as info:
        BatchAugment(16, color_jitter=jitter)
    assert str(info.value) == message


def test_batch_augment_refuses_parameters_of_another_batch_size():
    aug = BatchAugment(16, auto_augment=None)
    images = [torch.zeros(3, 20, 24, dtype=torch.uint8)] * 3
    with pytest.raises(InvalidArgumentError, match='^3 images but parameters for 5$'):
        aug(images, _params(aug, [(20, 24)] * 5))


def test_erasing_takes_every_box_with_pixels_and_skips_empty_ones():
    """Boxes one pixel high or wide are erased; boxes with no pixel (zero height or width) draw no noise, so the
    boxes after them get the first draws of the image's seed."""
    aug = BatchAugment(16, auto_augment=None, color_jitter=None, re_prob=1.0, re_mode='rand', re_count=3,
                       scale=(1, 1), ratio=(1, 1))
    batch = torch.full((2, 3, 16, 16), 100, dtype=torch.uint8)
    params = _params(aug, [(16, 16)] * 2)
    params['flip'][:] = False
    params['re_box'] = torch.tensor([[[2, 3, 0, 5], [4, 1, 6, 0], [5, 6, 4, 3]],
                                     [[2, 3, 1, 5], [4, 1, 6, 1], [0, 0, 0, 0]]])
    out = aug(batch, params)
    plain = out[1, :, 0, 0]
    g = torch.Generator().manual_seed(int(params['re_seed'][0]))
    colour = torch.randn((3, 1, 1), generator=g)
    assert torch.equal(out[0, :, 5:9, 6:9], colour.expand(3, 4, 3))
    changed = (out != plain.view(1, 3, 1, 1)).any(1)
    assert changed[0].sum() == 12 and changed[0, 5:9, 6:9].all()
    assert changed[1].sum() == 5 + 6 and changed[1, 2, 3:8].all() and changed[1, 4:10, 1].all()


# ------------------------------------------------------------------------------------ what is refused, the benchmark


@pytest.mark.parametrize('kwargs', [dict(auto_augment='original'), dict(auto_augment='v0r'),
                                    dict(auto_augment='augmix-m5-w4-d2'), dict(auto_augment='rand-m9-t3a'),
                                    dict(auto_augment='rand-m9-x3'), dict(interpolation='lanczos'),
                                    dict(re_mode='noise')])
def test_what_is_not_implemented_is_refused(kwargs):
    with pytest.raises(UnsupportedAugmentation) as info:
        BatchAugment(96, **kwargs)
    assert isinstance(info.value, TcnnError) and 'support' in str(info.value)


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(img_size=0), InvalidArgumentError, 'img_size must be >= 1, got 0'),
    (dict(img_size=9.0), InvalidTypeError, 'img_size must be an integer, got 9.0'),
    (dict(img_size=9, crop_pct=0.0, crop_mode='squash'), None, 10),  # no crop_pct: timm's default, floor(9 / 0.875)
    (dict(img_size=1, crop_pct=1.0), None, 1),
    (dict(img_size=9, crop_pct=-0.5), InvalidArgumentError, 'crop_pct must be > 0, got -0.5'),
    (dict(img_size=9, interpolation='random'), UnsupportedAugmentation, "interpolation 'random' is not implemented"),
])
def test_eval_checks_its_arguments_naming_them(kwargs, error, message):
    if error is None:  # accepted: message is the scale size
        assert BatchEval(**kwargs).scale_size == message
        return
    with pytest.raises(error) as info:
        BatchEval(**kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_eval_takes_no_crop_mode_as_center():
    image = torch.randint(0, 256, (1, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(BatchEval(4, crop_mode=None)(image), BatchEval(4, crop_mode='center')(image))


def test_eval_to_one_pixel_is_torchvisions_resize_of_the_shorter_side():
    image = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ours = BatchEval(1, crop_pct=1.0, mean=(0, 0, 0), std=(1 / 255,) * 3)(image)
    theirs = TF.resize(image, 1, antialias=True).float()
    assert ours.shape == (2, 3, 1, 1) and (ours - theirs).abs().max() <= 1


def test_eval_refuses_other_crop_modes():
    with pytest.raises(UnsupportedAugmentation, match='center, squash'):
        BatchEval(96, crop_mode='border')
    with pytest.raises(UnsupportedAugmentation):
        BatchEval(96, interpolation='random')


def test_the_benchmark_runs(capsys):
    """``benchmarks/batch_augment.py --quick`` (96 px, both settings, ours and timm's) prints its table."""
    import benchmarks.batch_augment
    assert benchmarks.batch_augment.main(['--quick', '--repeats', '1', '--device', 'cpu']) == 0
    out = capsys.readouterr().out
    assert 'batched train' in out and 'timm PIL train' in out and 'x PIL' in out


def test_the_transforms_print_every_setting():
    """What a run's log and ``print(transform)`` show: every setting the batch is augmented with, by name."""
    aug = BatchAugment(64, color_jitter=0.4, hflip=0., re_prob=0.25, interpolation='bicubic')
    assert repr(aug) == ("BatchAugment(img_size=64, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), hflip=0.0, "
                         "rand_augment=None, jitter=((0.6, 1.4), (0.6, 1.4), (0.6, 1.4), None), "
                         "interpolation='bicubic', re_prob=0.25, re_mode='const', re_count=1)")
    assert 'rand_augment=RandAugmentConfig(' in repr(BatchAugment(64, auto_augment='rand-m9-mstd0.5-inc1'))
    assert repr(BatchEval(96, crop_pct=0.875)) == ("BatchEval(img_size=96, crop_pct=0.875, crop_mode='center', "
                                                   "interpolation='bilinear')")
