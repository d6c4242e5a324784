"""Tests of ``tcnn.data.batch_misc``: random erasing against timm's ``RandomErasing._erase`` (normalisation is
checked through the whole transform: ``test_batch_augment.py``)."""
import random

import pytest
import timm.data.random_erasing as timm_re
import torch

from tcnn.data import batch_misc


@pytest.mark.parametrize('mode', ['const', 'rand', 'pixel'])
def test_random_erasing_fills_the_box_timms_erase_picks(mode):
    """The box timm's ``_erase`` picks, given to ours: 'const' is bit-equal; the noise modes fill the same box with
    N(0, 1) noise (per pixel, or one colour per channel)."""
    random.seed(3)
    eraser = timm_re.RandomErasing(probability=1.0, mode=mode, device='cpu')
    base = torch.full((3, 96, 96), 7.0)
    theirs = eraser(base.clone())
    ys, xs = (theirs != 7.0).any(0).nonzero(as_tuple=True)
    box = (int(ys.min()), int(xs.min()), int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1))
    ours = batch_misc.erase(base.clone()[None], [[box]], [123], mode)[0]
    if mode == 'const':
        assert torch.equal(ours, theirs)
    else:
        inside = ours[:, box[0]:box[0] + box[2], box[1]:box[1] + box[3]]
        assert torch.equal((ours != 7.0), (theirs != 7.0))
        if mode == 'pixel':
            assert abs(inside.mean()) < 0.1 and abs(inside.std() - 1) < 0.1
        else:
            assert torch.equal(inside, inside[:, :1, :1].expand_as(inside))


def test_erasing_noise_is_each_images_seeded_draw_in_the_images_dtype():
    """The noise of image i comes from a generator seeded with seeds[i], box after box, drawn in the images' dtype
    (as timm's ``_get_pixels``: float64 images get float64 draws, not float32 ones cast); images without boxes draw
    nothing; 'const' needs no seeds."""
    images = torch.full((3, 3, 12, 12), 7.0, dtype=torch.float64)
    boxes = [[(1, 2, 4, 5), (6, 0, 3, 3)], [], [(0, 0, 2, 2)]]
    out = batch_misc.erase(images.clone(), boxes, [5, 6, 9], 'pixel')
    for i, seed in ((0, 5), (2, 9)):
        g = torch.Generator().manual_seed(seed)
        for top, left, h, w in boxes[i]:
            noise = torch.randn((3, h, w), generator=g, dtype=torch.float64)
            assert torch.equal(out[i, :, top:top + h, left:left + w], noise)
    assert torch.equal(out[1], images[1])
    per_box = batch_misc.erase(images.clone(), boxes, [5, 6, 9], 'rand')
    g = torch.Generator().manual_seed(5)
    colour = torch.randn((3, 1, 1), generator=g, dtype=torch.float64)
    assert torch.equal(per_box[0, :, 1:5, 2:7], colour.expand(3, 4, 5))
    const = batch_misc.erase(images.clone(), boxes, None, 'const')
    assert (const[0, :, 1:5, 2:7] == 0).all() and (const[0, :, 0] == 7).all()


def test_normalize_runs_on_the_images_device_in_float32():
    """``(x / 255 - mean) / std`` with mean and std as float32 on the images' device (seen on the meta device), into
    ``out`` when given, in place when ``out`` is the images."""
    out = batch_misc.normalize(torch.empty(2, 3, 4, 4, dtype=torch.uint8, device='meta'), (0.5,) * 3, (0.25,) * 3)
    assert out.device.type == 'meta' and out.dtype == torch.float32
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    expected = (images.float() / 255 - torch.tensor([0.5, 0.25, 0.0]).view(3, 1, 1)) / torch.tensor(
        [0.25, 0.5, 1.0]).view(3, 1, 1)
    assert torch.equal(batch_misc.normalize(images, (0.5, 0.25, 0.0), (0.25, 0.5, 1.0)), expected)
    floats = images.float()
    assert batch_misc.normalize(floats, (0.5, 0.25, 0.0), (0.25, 0.5, 1.0), out=floats) is floats
    assert torch.equal(floats, expected)
