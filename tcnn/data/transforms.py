"""The recipe's augmentation: timm's training transform (DeiT's RandAugment, random erasing, colour jitter) and its
evaluation transform, made safe for every supported Pillow (``posterize``)."""
from typing import TYPE_CHECKING, Any, Callable, Mapping, Tuple

from PIL import Image, ImageOps
from timm.data import create_transform

if TYPE_CHECKING:
    from ..train.recipe import Recipe

__all__ = ['build_transforms', 'posterize']


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


def _safe_ops(transform: Callable) -> Callable:
    """Replace the posterize function of every auto-augment op inside ``transform`` (no global patching of timm)."""
    for t in getattr(transform, 'transforms', []):
        for op in getattr(t, 'ops', []):
            if 'Posterize' in getattr(op, 'name', ''):
                op.aug_fn = posterize
    return transform


def build_transforms(recipe: 'Recipe', data_cfg: Mapping[str, Any]) -> Tuple[Callable, Callable]:
    """timm's training transform with the recipe's augmentation and its evaluation transform."""
    train = create_transform(
        recipe.img_size, is_training=True, auto_augment=recipe.aa, color_jitter=recipe.color_jitter,
        re_prob=recipe.reprob, re_mode=recipe.remode, re_count=recipe.recount,
        scale=tuple(recipe.scale) if recipe.scale else None,
        interpolation=data_cfg['interpolation'], mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']))
    val = create_transform(
        data_cfg['input_size'][-1], is_training=False, interpolation=data_cfg['interpolation'],
        mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']), crop_pct=data_cfg['crop_pct'],
        crop_mode=data_cfg['crop_mode'])
    return _safe_ops(train), val
