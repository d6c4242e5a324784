"""Tests of ``tcnn.data.batch_colour``: PIL's ``ImageOps`` and ``ImageEnhance`` ops (``pil_*``) against timm's PIL
ops, torchvision's ColorJitter ops (``tv_*``) against torchvision's, on a batch with one argument per image (how the
tolerances were set: ``augmentation.py``)."""
from typing import Tuple

import numpy as np
import pytest
import timm.data.auto_augment as timm_aa
import torch
import torchvision.transforms.functional as TF1
import torchvision.transforms.v2.functional as TF2
from PIL import Image

from augmentation import IMAGES, compare_op, make_image, to_levels, to_tensor
from tcnn.data import batch_colour
from tcnn.data.transforms import posterize as safe_posterize


# ------------------------------------------------------------------------------------ PIL: ImageOps and ImageEnhance


ENHANCE_FACTORS = [0.0, 0.1, 0.37, 0.5, 1.0, 1.3, 1.9, 2.5]
# name, our op (on a batch, per-image argument), timm's argument values (including the extremes)
EXACT_OPS = [
    ('AutoContrast', lambda x, a: batch_colour.pil_autocontrast(x), [0]),
    ('Equalize', lambda x, a: batch_colour.pil_equalize(x), [0]),
    ('Invert', lambda x, a: batch_colour.pil_invert(x), [0]),
    ('Posterize', lambda x, a: batch_colour.pil_posterize(x, a.long()), [0, 1, 2, 3, 4, 7, 8]),
    ('Solarize', lambda x, a: batch_colour.pil_solarize(x, a.long()), [0, 1, 100, 128, 255, 256]),
    ('SolarizeAdd', lambda x, a: batch_colour.pil_solarize_add(x, a.long()), [0, 30, 110, 200, 255]),
    ('Color', batch_colour.pil_color, ENHANCE_FACTORS),
    ('Contrast', batch_colour.pil_contrast, ENHANCE_FACTORS),
    ('Brightness', batch_colour.pil_brightness, ENHANCE_FACTORS),
    ('Sharpness', batch_colour.pil_sharpness, ENHANCE_FACTORS),
]


@pytest.mark.parametrize('name,ours,args', EXACT_OPS, ids=[o[0] for o in EXACT_OPS])
def test_exact_ops_equal_timms(name, ours, args):
    """PIL's integer and float32 arithmetic reproduced: measured max |diff| 0 for each, so the tolerance is 0."""
    fn = timm_aa.NAME_TO_OP[name]
    if name == 'Posterize':
        fn = safe_posterize  # tcnn's posterize: 0 bits is black on every Pillow (what tcnn's transforms run)
    d = compare_op(ours, lambda img, a: fn(img, a) if name not in ('AutoContrast', 'Equalize', 'Invert')
                   else fn(img), args)
    assert d.max() == 0, (name, d.max(), d.mean())


def test_equalize_and_autocontrast_equal_pils_at_their_corner_cases():
    """A flat image, two levels, one channel with a single level, a full-range image, two neighbouring levels, a
    level used by one pixel, two levels where the step is not 0: tables as PIL makes them."""
    cases = [np.full((9, 7, 3), 77, np.uint8), np.zeros((9, 7, 3), np.uint8)]
    two = np.zeros((9, 7, 3), np.uint8)
    two[:4] = 200
    cases.append(two)
    mixed = make_image(40, 30, 9)
    mixed[..., 1] = 13
    cases.append(mixed)
    cases.append(np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1))
    adjacent = np.full((9, 7, 3), 100, np.uint8)  # autocontrast: two neighbouring levels stretch to 0 and 255
    adjacent[:3] = 101
    cases.append(adjacent)
    # equalize: 400 pixels, so the step is 1 or more: one pixel of the top level; two levels only
    single = np.full((20, 20, 3), 10, np.uint8)
    single[0, 0] = 200
    two_levels = np.full((20, 20, 3), 50, np.uint8)
    two_levels[15:] = 180
    cases += [single, two_levels]
    for a in cases:
        for name, fn in (('AutoContrast', batch_colour.pil_autocontrast), ('Equalize', batch_colour.pil_equalize)):
            ref = np.asarray(timm_aa.NAME_TO_OP[name](Image.fromarray(a))).astype(np.int64)
            assert np.array_equal(to_levels(fn(to_tensor(a)[None])[0]), ref), (name, a.shape)


@pytest.mark.parametrize('bits, kept', [(8, 'image'), (9, 'image'), (12, 'image'), (0, 'black'), (-1, 'black'),
                                        (-4, 'black')])
def test_posterize_beyond_its_range_keeps_the_image_or_blackens_it(bits, kept):
    """8 or more bits keep every bit (the image), 0 or fewer keep none (black), as tcnn's posterize on one image."""
    images = torch.stack([to_tensor(a) for a in IMAGES[:2]])
    out = batch_colour.pil_posterize(images, torch.tensor([bits, bits]))
    assert torch.equal(out, images if kept == 'image' else torch.zeros_like(images))
    assert np.array_equal(to_levels(out[0]), np.asarray(safe_posterize(Image.fromarray(IMAGES[0]), bits)))


@pytest.mark.parametrize('size', [(3, 3), (3, 7), (7, 3), (2, 9), (9, 2), (1, 1), (4, 5)])
def test_sharpness_of_small_images_is_pils(size):
    """Pillow's SMOOTH filter leaves an image under 3 pixels on a side as it is and filters the inner pixels of a
    3-pixel side: the blend of ``ImageEnhance.Sharpness`` at every factor, on the smallest sizes."""
    h, w = size
    a = np.random.default_rng(h * 10 + w).integers(0, 256, (h, w, 3)).astype(np.uint8)
    images = to_tensor(a)[None].expand(len(ENHANCE_FACTORS), -1, -1, -1).contiguous()
    out = batch_colour.pil_sharpness(images, torch.tensor(ENHANCE_FACTORS))
    for k, factor in enumerate(ENHANCE_FACTORS):
        ref = np.asarray(timm_aa.NAME_TO_OP['Sharpness'](Image.fromarray(a), factor))
        assert np.array_equal(to_levels(out[k]), ref), (size, factor)


def test_grayscale_is_pils_l_conversion_in_uint8():
    images = torch.stack([to_tensor(a) for a in IMAGES[:2]])
    gray = batch_colour.pil_grayscale(images)
    assert gray.dtype == torch.uint8 and gray.shape == (2, 1) + images.shape[-2:]
    for k in range(2):
        assert np.array_equal(gray[k, 0].numpy(), np.asarray(Image.fromarray(IMAGES[k]).convert('L')))


def test_the_colour_ops_stay_on_the_images_device(monkeypatch):
    """Every table, level range and offset an op makes is on the images' device, seen on the meta device (no data;
    ``torch.bincount`` has no meta kernel: a stand-in there gives the histogram's shape on the input's device)."""
    bincount = torch.bincount
    monkeypatch.setattr(torch, 'bincount', lambda index, minlength=0: (
        torch.empty(minlength, dtype=torch.int64, device='meta') if index.device.type == 'meta'
        else bincount(index, minlength=minlength)))
    images, factors = torch.empty(2, 3, 8, 8, dtype=torch.uint8, device='meta'), torch.tensor([0.5, 1.5])
    for op in (batch_colour.pil_autocontrast, batch_colour.pil_equalize, batch_colour.pil_invert):
        assert op(images).device.type == 'meta', op.__name__
    for op in (batch_colour.pil_brightness, batch_colour.pil_contrast, batch_colour.pil_color,
               batch_colour.pil_sharpness, batch_colour.tv_hue, batch_colour.tv_brightness,
               batch_colour.tv_contrast, batch_colour.tv_saturation):
        out = op(images, factors)
        assert out.device.type == 'meta' and out.dtype == torch.uint8, op.__name__
    for op in (batch_colour.pil_posterize, batch_colour.pil_solarize, batch_colour.pil_solarize_add):
        assert op(images, torch.tensor([3, 100])).device.type == 'meta', op.__name__


def test_hue_wraps_around_as_torchvisions_for_every_shift():
    """Hue shifted by -0.5 .. 0.5 wraps modulo 1 as torchvision's ``adjust_hue`` does, bit for bit, on noise (every
    hue; a wrap modulo 2 gives other floats, off by a level on a few pixels in a million)."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 64, 64), dtype=torch.uint8, generator=g)
    factors = torch.linspace(-0.5, 0.5, 64)
    ours = batch_colour.tv_hue(images, factors)
    for i in range(64):
        assert torch.equal(ours[i], TF2.adjust_hue(images[i], float(factors[i]))), float(factors[i])


def test_color_jitter_runs_each_order_once_on_its_images_together(monkeypatch):
    """The batch is grouped by order: each op runs once per distinct order that has it (on that order's images in
    one slice, their batch order kept), not once per run of neighbours, and every image gets its own factors."""
    calls = []
    brightness = batch_colour._tv_brightness_
    monkeypatch.setattr(batch_colour, '_tv_brightness_',
                        lambda x, f: calls.append(f.tolist()) or brightness(x, f))
    images = torch.randint(0, 256, (6, 3, 5, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    orders = torch.tensor([[0, 1, 2, 3], [2, 1, 0, 3]] * 3)
    factors = torch.tensor([[0.5 + 0.1 * i, 1.0, 1.0, 0.0] for i in range(6)], dtype=torch.float64)
    active = [True, True, False, False]  # contrast at 1.0: the image as it is
    out = batch_colour.tv_color_jitter(images, factors, orders, active, out=torch.empty(images.shape))
    assert calls == [[0.5, 0.7, 0.9], [0.6, 0.8, 1.0]]  # keys (0, 1) and (1, 0): two groups, sorted
    for i in range(6):
        assert torch.equal(out[i], TF2.adjust_brightness(images[i], float(factors[i, 0])).float()), i


def test_hsv_to_rgb_is_torchvisions_up_to_a_hue_of_one():
    """``_hsv_to_rgb`` gives torchvision's floats on a grid of hue, saturation and value, including a hue of exactly
    1.0: a shifted hue just below 0 wraps to ``remainder(-1e-9, 1.0)``, which float32 rounds to 1.0."""
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb
    assert float(torch.tensor([-1e-9]).remainder_(1.0)) == 1.0
    h, s, v = torch.meshgrid(torch.cat([torch.linspace(0, 1, 97), torch.tensor([1 - 2 ** -24])]),
                             torch.linspace(0, 1, 11), torch.linspace(0, 1, 7), indexing='ij')
    hsv = torch.stack([h, s, v]).reshape(1, 3, 98, 77)
    assert torch.equal(batch_colour._hsv_to_rgb(hsv), _hsv_to_rgb(hsv))


# ------------------------------------------------------------------------------------------ torchvision: ColorJitter


# ColorJitter op -> (max |diff| vs torchvision v2 on uint8 tensors (the reference), mean |diff| vs torchvision on PIL
# images (ImageEnhance, what timm's PIL pipeline runs)), each 1.5x measured
JITTER_TOLERANCE = {'brightness': (0, 0), 'contrast': (0, 0.374), 'saturation': (0, 0.279), 'hue': (0, 1.43)}
# measured: v2 max 0 for each; vs PIL mean 0 (brightness: the same float32 product), 0.2496 (contrast: the mean of
# a float grayscale vs PIL's rounded 'L' mean), 0.1860 (saturation: float vs fixed-point grayscale), 0.9544 (hue:
# float HSV vs PIL's 8-bit HSV; max 16), max 1 for contrast and saturation
JITTER_ARGS = {'brightness': [0.0, 0.6, 0.8123, 1.0, 1.2999, 1.4], 'contrast': [0.0, 0.6, 0.8123, 1.0, 1.2999, 1.4],
               'saturation': [0.0, 0.6, 0.8123, 1.0, 1.2999, 1.4], 'hue': [-0.5, -0.1, 0.0, 0.05, 0.3, 0.5]}


def _jitter_diffs(name: str) -> Tuple[np.ndarray, np.ndarray]:
    ours = getattr(batch_colour, 'tv_' + name)
    v2 = compare_op(ours, lambda img, f: TF2.to_pil_image(getattr(TF2, 'adjust_' + name)(TF2.pil_to_tensor(img), f)),
                    JITTER_ARGS[name])
    pil = compare_op(ours, lambda img, f: getattr(TF1, 'adjust_' + name)(img, f), JITTER_ARGS[name])
    return v2, pil


@pytest.mark.parametrize('name', list(JITTER_TOLERANCE))
def test_color_jitter_ops_stay_within_the_measured_difference_from_torchvision(name):
    v2, pil = _jitter_diffs(name)
    max_v2, mean_pil = JITTER_TOLERANCE[name]
    assert v2.max() <= max_v2 and pil.mean() <= mean_pil, (v2.max(), pil.mean(), pil.max())


# ColorJitter(0.4, 0.4, 0.4, 0.1)'s draws on photo-like 224 px crops (benchmarks/pil_agreement.py: 12 images, seeded),
# the batched ops (torchvision's tensor arithmetic) against torchvision's PIL path (what timm's PIL pipeline runs):
# op -> (share of the values that differ, mean |diff|, max |diff|), a little above the measured values (comments).
# Contrast and saturation: a float grayscale against Pillow's fixed-point 'L'; hue: float HSV against Pillow's 8-bit
# HSV image (the PIL path shifts the 8-bit hue by whole steps).
JITTER_ON_PHOTOS = {
    'brightness': (0, 0, 0),  # measured 0
    'contrast': (0.103, 0.103, 1),  # measured 9.85%, 0.0985, 1
    'saturation': (0.099, 0.099, 1),  # measured 9.42%, 0.0942, 1
    'hue': (0.37, 0.78, 17),  # measured 35.69%, 0.7455, 17
    'all four': (0.46, 0.82, 13),  # measured 44.68%, 0.7891, 13
}


def test_color_jitter_on_photos_differs_from_torchvisions_pil_path_by_the_measured_amounts():
    from benchmarks.pil_agreement import jitter_agreement, photo_arrays
    result = jitter_agreement(photo_arrays(12))
    for op, (share, mean, top) in JITTER_ON_PHOTOS.items():
        s = result[op]
        print(f"\n{op}: {100 * s['differing']:.3f}% differ, mean {s['mean']:.4f}, max {s['max']}")
        assert s['differing'] <= share and s['mean'] <= mean and s['max'] <= top, (op, s)


@pytest.mark.parametrize('active', [(True, True, True, True), (True, True, True, False), (False, False, True, False)])
def test_color_jitter_in_place_on_floats_is_torchvisions_chain(active):
    """The batch's ColorJitter (float images holding uint8 values, the images of one order together, in place on
    one slice) against torchvision v2's uint8 ops chained per image in that image's order: bit-equal, on noise images
    (every clamp reached) and on photos, with factors beyond ColorJitter's usual ranges."""
    g = torch.Generator().manual_seed(11)
    noise = torch.randint(0, 256, (40, 3, 20, 24), dtype=torch.uint8, generator=g)
    photos = torch.stack([to_tensor(a)[:, :20, :24] for a in IMAGES])
    images = torch.cat([noise, photos])
    n = len(images)
    factors = torch.stack([torch.rand(n, generator=g) * 2.0, torch.rand(n, generator=g) * 2.0,
                           torch.rand(n, generator=g) * 2.0, torch.rand(n, generator=g) - 0.5], dim=1)
    factors[:4, :3] = torch.tensor([0.0, 1.0, 2.0, 1.5]).view(4, 1)  # the blends' ends and a brightening
    orders = torch.stack([torch.randperm(4, generator=g) for _ in range(n)])
    ours = batch_colour.tv_color_jitter(images, factors, orders, active, out=torch.empty(images.shape))
    fns = (TF2.adjust_brightness, TF2.adjust_contrast, TF2.adjust_saturation, TF2.adjust_hue)
    for i in range(n):
        x = images[i]
        for f in orders[i].tolist():
            if active[f]:
                x = fns[f](x, float(factors[i, f]))
        assert torch.equal(ours[i], x.float()), i
