"""Small generated image datasets for tests: an ImageFolder of drawn shapes (no downloads).

``make_image_folder(root)`` writes ``root/train/<class>/*.png`` and ``root/val/<class>/*.png``: one class per shape
(circle, square, triangle, cross, ...), each image a randomly placed, sized and coloured shape on a noisy background,
so that a small CNN can learn something in a few epochs. Deterministic for a given seed.
"""
import os
from typing import Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

__all__ = ['SHAPES', 'make_image_folder', 'draw_shape']

SHAPES = ('circle', 'square', 'triangle', 'cross', 'ring', 'bar')


def draw_shape(shape: str, size: int, rng: np.random.Generator) -> Image.Image:
    """One ``size`` x ``size`` RGB image of ``shape`` on a noisy background."""
    background = rng.integers(0, 96, size=3)
    noise = rng.integers(-24, 24, size=(size, size, 3))
    pixels = np.clip(background[None, None, :] + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, 'RGB')
    draw = ImageDraw.Draw(img)
    color = tuple(int(c) for c in rng.integers(128, 256, size=3))
    r = int(rng.integers(size // 6, size // 3))
    cx, cy = (int(v) for v in rng.integers(r, size - r, size=2))
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == 'circle':
        draw.ellipse(box, fill=color)
    elif shape == 'square':
        draw.rectangle(box, fill=color)
    elif shape == 'triangle':
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
    elif shape == 'cross':
        w = max(r // 3, 1)
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=color)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=color)
    elif shape == 'ring':
        draw.ellipse(box, outline=color, width=max(r // 3, 2))
    elif shape == 'bar':
        w = max(r // 3, 1)
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=color)
    else:
        raise ValueError(f'unknown shape {shape!r}; known: {", ".join(SHAPES)}')
    return img


def make_image_folder(
        root: str,
        num_classes: int = 3,
        train_per_class: int = 8,
        val_per_class: int = 4,
        size: int = 64,
        seed: int = 0,
        splits: Sequence[Tuple[str, int]] = (),
) -> str:
    """Write an ImageFolder dataset of drawn shapes and return ``root``.

    Args:
        root: Output folder (created).
        num_classes: Number of classes (shapes), at most ``len(SHAPES)``.
        train_per_class: Images per class in ``train/``.
        val_per_class: Images per class in ``val/``.
        size: Image side in pixels.
        seed: Seed of the drawing.
        splits: Extra ``(name, per_class)`` splits to write besides train/ and val/.
    """
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be in [1, {len(SHAPES)}], got {num_classes}')
    rng = np.random.default_rng(seed)
    for split, per_class in (('train', train_per_class), ('val', val_per_class), *splits):
        for shape in SHAPES[:num_classes]:
            folder = os.path.join(root, split, shape)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                draw_shape(shape, size, rng).save(os.path.join(folder, f'{shape}_{i:03d}.png'))
    return root
