"""Image files for the CLI (``tcnn inspect``, ``tcnn eval`` on a folder, the demo): found, sampled over classes, loaded
with a model's eval transform, and denormalised for display."""
import os
import random
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from PIL import Image
from timm.data import create_transform

from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number

__all__ = ['IMAGE_EXTENSIONS', 'find_images', 'sample_images', 'load_images', 'denormalize']

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


def find_images(root: str, limit: Optional[int] = None) -> List[str]:
    """Image files under ``root`` (recursive, sorted), at most ``limit``."""
    if limit is not None:
        check_number(limit, 'limit', ge=1, integer=True)
    if not os.path.isdir(root):
        raise TcnnError(f'image folder not found: {root}')
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
        for f in sorted(filenames):
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith('.'):
                found.append(os.path.join(dirpath, f))
                if limit is not None and len(found) >= limit:
                    return found
    if not found:
        raise TcnnError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) under {root}')
    return found


def sample_images(images: Union[str, Sequence[str]], limit: int, seed: int = 0) -> List[str]:
    """A seeded sample of at most ``limit`` image files, spread evenly over their folders (the classes of an
    ImageFolder), sorted.

    The first ``limit`` files in sorted order of an ImageNet val folder are a handful of classes (512 images: 11
    classes, all fish, sharks, rays and birds); here the folders are visited in a seeded random order, one random
    image of each per round, so ``limit`` images of ``n`` folders cover ``min(limit, n)`` of them.

    Args:
        images: A folder (searched recursively, as ``find_images``) or a list of image paths.
        limit: The sample size; a folder with at most ``limit`` images gives them all.
        seed: Seed of the draw (Python's ``random.Random``: the same sample on every platform).
    """
    check_number(limit, 'limit', ge=1, integer=True)
    check_number(seed, 'seed', integer=True)
    paths = find_images(images) if isinstance(images, str) else sorted(images)
    if len(paths) <= limit:
        return paths
    rng = random.Random(seed)
    folders: Dict[str, List[str]] = {}
    for p in paths:
        folders.setdefault(os.path.dirname(p), []).append(p)
    queues = [folders[d] for d in sorted(folders)]
    for q in queues:
        rng.shuffle(q)
    rng.shuffle(queues)
    picked: List[str] = []
    for i in range(max(len(q) for q in queues)):  # round robin: one image per folder and round
        picked += [q[i] for q in queues if i < len(q)][:limit - len(picked)]
        if len(picked) == limit:
            break
    return sorted(picked)


def load_images(paths: Sequence[str], data_config: Dict[str, Any]) -> torch.Tensor:
    """Load image files with the timm eval transform of ``data_config``: ``(N, 3, H, W)``, normalised."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise InvalidTypeError(f'paths must be a list of image paths, got {type(paths).__name__}')
    if not paths:
        raise InvalidArgumentError('paths is empty: give at least one image')
    transform = create_transform(**data_config, is_training=False)
    tensors = []
    for path in paths:
        if not os.path.isfile(path):
            raise TcnnError(f'image not found: {path}')
        try:
            with Image.open(path) as img:
                tensors.append(transform(img.convert('RGB')))
        except OSError as e:
            raise TcnnError(f'cannot read image {path}: {e}') from e
    return torch.stack(tensors)


def denormalize(x: torch.Tensor, data_config: Dict[str, Any]) -> torch.Tensor:
    """Undo the normalisation of ``(..., 3, H, W)`` images for display: values in [0, 1]."""
    if not all(k in data_config for k in ('mean', 'std')):
        raise InvalidArgumentError('data_config must hold the normalisation mean and std (see data_config)')
    mean = torch.tensor(data_config['mean'], dtype=x.dtype, device=x.device)[:, None, None]
    std = torch.tensor(data_config['std'], dtype=x.dtype, device=x.device)[:, None, None]
    return (x * std + mean).clamp(0, 1)
