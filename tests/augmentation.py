"""What the tests of the batched augmentation share (``test_batch_geometry.py``, ``test_batch_colour.py``,
``test_batch_misc.py``, ``test_rand_augment.py``, ``test_batch_augment.py``): generated images and their conversions,
the recipe, an op's comparison against timm's PIL op, and the two-sample statistical tests.

How those files test timm's training augmentation, drawn per sample and applied per batch, against timm itself:

* Each pixel op against timm's PIL op (``timm.data.auto_augment.NAME_TO_OP``, PIL's crop/resize, torchvision's
  ColorJitter ops, timm's ``RandomErasing._erase``) on generated images with smooth gradients, flat areas, edges and
  noise, in uint8 levels. Each tolerance is 1.5x the difference measured here (torch 2.14.1 CPU, Pillow 13.0,
  torchvision 0.29.1; the measured value is in the comment): 0 for the ops that reproduce PIL's arithmetic; a mean
  absolute difference and a high percentile for the resamplers that differ from PIL's.
* The sampled parameters against what timm's own transform objects draw: op frequencies by a chi-square test,
  each continuous argument by a two-sample Kolmogorov-Smirnov test, at p < 1e-4 (the draws are seeded, so a test
  that passes keeps passing), and each test is shown to fail on a deliberately wrong sampler.
"""
import math
import random
from typing import Callable, Dict, Sequence, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from tcnn.data.batch_augment import BatchAugment


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FILL = tuple(min(255, round(255 * x)) for x in MEAN)  # timm's img_mean hparam
RECIPE = dict(auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel',
              mean=MEAN, std=STD)
ALPHA = 1e-4  # significance of the statistical tests
N_DRAWS = 20000


# ------------------------------------------------------------------------------------------------------------ images


def make_image(height: int, width: int, seed: int) -> np.ndarray:
    """A real-looking HWC uint8 image: colour gradients and a sinusoid, flat rectangles and a disc (edges, and flat
    areas where blends hit exact integers), Gaussian noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 7 + y / 11)], -1)
    for _ in range(4):
        y0, x0 = rng.integers(0, height - 10), rng.integers(0, width - 10)
        img[y0:y0 + rng.integers(5, height // 2), x0:x0 + rng.integers(5, width // 2)] = rng.integers(0, 256, 3)
    disc = (y - height / 2) ** 2 + (x - width / 3) ** 2 < (min(height, width) / 5) ** 2
    img[disc] = rng.integers(0, 256, 3)
    img += rng.normal(0, 8, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


SQUARE = [make_image(96, 96, s) for s in range(3)]
TALL = [make_image(160, 120, s) for s in range(3, 6)]  # 3 x 160 x 120 (C, H, W)
IMAGES = SQUARE + TALL


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """An HWC uint8 array as a CHW tensor."""
    return torch.from_numpy(a).permute(2, 0, 1).contiguous()


def to_levels(t: torch.Tensor) -> np.ndarray:
    """A CHW uint8 tensor as HWC int64 levels, to subtract from a PIL image's array."""
    return t.permute(1, 2, 0).numpy().astype(np.int64)


def denormalize(x: torch.Tensor) -> torch.Tensor:
    """Normalised float images back to uint8 levels (exact: the float error is far below half a level)."""
    m, s = torch.tensor(MEAN).view(-1, 1, 1), torch.tensor(STD).view(-1, 1, 1)
    return ((x * s + m) * 255).round().clamp(0, 255).to(torch.uint8)





def compare_op(ours: Callable, theirs: Callable, args: Sequence) -> np.ndarray:
    """|ours - theirs| in levels over every image and argument; each same-size group runs as one batch with a
    different argument per image, as the batched path calls the ops."""
    diffs = []
    for group in (SQUARE, TALL):
        pairs = [(a, arg) for a in group for arg in args]
        batch = torch.stack([to_tensor(a) for a, _ in pairs])
        out = ours(batch, torch.tensor([float(arg) for _, arg in pairs], dtype=torch.float64))
        for k, (a, arg) in enumerate(pairs):
            ref = np.asarray(theirs(Image.fromarray(a), arg)).astype(np.int64)
            diffs.append(np.abs(to_levels(out[k]) - ref).ravel())
    return np.concatenate(diffs)


PIL_RESAMPLE = {'nearest': Image.NEAREST, 'bilinear': Image.BILINEAR, 'bicubic': Image.BICUBIC}


# ------------------------------------------------------------------------------------------------ sampled parameters


def ks_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov test: the asymptotic p-value of the largest CDF gap (conservative with ties)."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    d = np.abs(np.searchsorted(a, grid, 'right') / len(a) - np.searchsorted(b, grid, 'right') / len(b)).max()
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if lam < 0.1:  # p > 0.9999, and the alternating series below would need thousands of terms
        return 1.0
    return float(min(1.0, max(0.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101)))))


def chi2_p_value(a: Sequence, b: Sequence) -> float:
    """Chi-square test that two samples of categories come from one distribution (the p-value by Wilson and
    Hilferty's normal approximation of the chi-square tail; ample at the tests' significance)."""
    keys = sorted(set(a) | set(b), key=repr)
    if len(keys) < 2:
        return 1.0
    table = np.array([[list(a).count(k) for k in keys], [list(b).count(k) for k in keys]], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat, df = ((table - expected) ** 2 / expected).sum(), len(keys) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def draw_params(aug: BatchAugment, n: int, seed: int, size: Tuple[int, int] = (375, 500)) -> Dict[str, torch.Tensor]:
    """``n`` samples' parameters drawn by ``aug`` from one generator seeded ``seed`` for a source of ``size``,
    collated."""
    rng = random.Random(seed)
    return default_collate([aug.draw(rng, size) for _ in range(n)])
