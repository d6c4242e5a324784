"""Augmentation made safe for every supported Pillow: timm's auto-augment ops with a ``posterize`` that accepts the 0
bits that RandAugment's magnitude noise draws (``safe_augmentation``)."""
from typing import Any, Callable

from PIL import Image, ImageOps


__all__ = ['posterize', 'safe_augmentation']


def posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """timm's posterize op for every Pillow: keeping 0 bits gives the black image older Pillow returned.

    RandAugment's "increasing" posterize (``rand-m9-mstd0.5-inc1``, the paper's policy) keeps ``4 - magnitude * 4 /
    10`` bits, 0 at magnitude 10, which the magnitude noise draws often; Pillow 12+ refuses 0 bits with a ValueError.
    """
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def safe_augmentation(transform: Callable) -> Callable:
    """Replace the posterize function of every auto-augment op inside ``transform`` (no global patching of timm)."""
    for t in getattr(transform, 'transforms', []):
        for op in getattr(t, 'ops', []):
            if 'Posterize' in getattr(op, 'name', ''):
                op.aug_fn = posterize
    return transform
