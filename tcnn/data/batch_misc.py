"""The batch ops of timm's transforms that are neither geometry nor colour: the truncating cast to uint8 the other
ops end with (``to_uint8``), ``normalize`` (``ToTensor`` + ``Normalize``) and ``erase`` (timm's
``RandomErasing._erase`` for given boxes).

Nothing here draws a random number except ``erase``, from generators seeded by its caller.
"""
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ['to_uint8', 'normalize', 'erase']

Tensor = torch.Tensor


def to_uint8(x: Tensor) -> Tensor:
    """Float values in [0, 256) to uint8, truncated (C's cast). Through int16: torch's direct float -> uint8 cast
    is 3x slower on the CPU (measured)."""
    return x.to(torch.int16).to(torch.uint8)


# ------------------------------------------------------------------------------------------ normalise and erase


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float], out: Optional[Tensor] = None) -> Tensor:
    """torchvision's ``ToTensor`` then ``Normalize``: ``(x / 255 - mean) / std`` in float32, the same ops (into
    ``out`` if given; ``out=images``: in place on float images)."""
    m = torch.tensor(mean, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    x = images.float() if out is None else out if out is images else out.copy_(images)
    return x.div_(255).sub_(m).div_(s)


def erase(images: Tensor, boxes: List[List[Tuple[int, int, int, int]]], seeds: Optional[Sequence[int]],
          mode: str) -> Tensor:
    """timm's ``RandomErasing._erase`` for given boxes, in place on normalised float images ``(n, 3, H, W)``.

    Args:
        images: The normalised images.
        boxes: Per image its boxes ``(top, left, height, width)`` in drawing order (a later box covers an earlier).
        seeds: Per image the seed of its noise (modes 'rand' and 'pixel'): a generator on the images' device draws
            each box's normal noise in order, ``(3, h, w)`` per pixel or ``(3, 1, 1)`` per box, as timm's
            ``_get_pixels``.
        mode: 'const' (zeros), 'rand' or 'pixel'.
    """
    generator = None
    for i, image_boxes in enumerate(boxes):
        if not image_boxes:
            continue
        if mode != 'const':
            generator = generator or torch.Generator(device=images.device)
            generator.manual_seed(int(seeds[i]))
        for top, left, h, w in image_boxes:
            shape = (images.shape[1], h, w) if mode == 'pixel' else (images.shape[1], 1, 1)
            if mode == 'const':
                images[i, :, top:top + h, left:left + w] = 0
            else:
                noise = torch.randn(shape, generator=generator, dtype=images.dtype, device=images.device)
                images[i, :, top:top + h, left:left + w] = noise
    return images
