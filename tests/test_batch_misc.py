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
