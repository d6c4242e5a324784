"""Training and validation data of ``tcnn train``: image folders, the model's preprocessing, the recipe's augmentation.

* ``open_dataset``: an ImageFolder split (``DATA/SPLIT/CLASS/IMAGE``) whose unreadable images either stop the run
  with one line naming the file (default) or are replaced by the next readable image and logged once each
  (``skip_bad_images``). timm's own dataset would skip them silently; on ImageNet-scale folders a user wants to know.
* ``data_config``: the model's pretrained preprocessing (mean, std, crop, interpolation), overridden by the recipe.
* ``build_transforms``: timm's train/eval transforms with the recipe's DeiT augmentation, made safe for every
  supported Pillow (see ``posterize``).
"""
import multiprocessing
import os
import random
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from .errors import TcnnError

__all__ = ['BadImageError', 'SampleError', 'ImageFolderDataset', 'open_dataset', 'data_config', 'build_transforms',
           'posterize', 'SKIP_HINT']

SKIP_HINT = 'remove or replace it, or pass --skip-bad-images (recipe key skip_bad_images) to skip such files'
_MAX_CONSECUTIVE_BAD = 50


class _OneLineError(TcnnError):
    """A ``TcnnError`` that stays one readable line when a DataLoader worker raised it: torch re-raises worker errors
    as ``type(e)("Caught ... in DataLoader worker process N.\\nOriginal Traceback ...\\nmodule.Type: message")``."""

    def __init__(self, message: str = ''):
        if message.startswith('Caught ') and 'Original Traceback' in message:
            last = [line for line in message.strip().splitlines() if line.strip()][-1]
            prefix = f'{type(self).__module__}.{type(self).__name__}: '
            message = last[len(prefix):] if last.startswith(prefix) else last
        super().__init__(message)


class BadImageError(_OneLineError):
    """An image file that cannot be read (truncated, empty, not an image)."""


class SampleError(_OneLineError):
    """Loading or transforming a readable sample failed; names the file."""


def _reason(e: BaseException) -> str:
    text = ' '.join(str(e).split())[:200]
    return f'{type(e).__name__}: {text}' if text else type(e).__name__


def _load_rgb(path: str) -> Image.Image:
    with open(path, 'rb') as f:
        img = Image.open(f)
        return img.convert('RGB')  # decodes every pixel: a truncated file fails here, not in a transform


class ImageFolderDataset(Dataset):
    """``ROOT/CLASS/IMAGE`` with timm's folder reader (its class order and file types) and an explicit policy for
    unreadable files.

    Skipped paths travel from the worker processes to the main process through a queue; ``bad_images()`` returns
    each newly skipped path once.
    """

    def __init__(self, root: str, class_map: Optional[Dict[str, int]] = None, skip_bad_images: bool = False,
                 transform: Optional[Callable] = None):
        from timm.data.readers import create_reader
        self.root = root
        self.reader = create_reader('', root=root, class_map=class_map or '')
        self.class_to_idx: Dict[str, int] = dict(self.reader.class_to_idx)
        self.skip_bad_images = skip_bad_images
        self.transform = transform
        self._bad_queue = multiprocessing.SimpleQueue() if skip_bad_images else None
        self._reported: set = set()
        self.augment_seed: Optional[int] = None
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose augmentation draws ``__getitem__`` makes (with ``augment_seed``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.reader)

    def filename(self, index: int) -> str:
        return self.reader.filename(index, absolute=True)

    def _read(self, index: int) -> Tuple[str, Image.Image, int]:
        for attempt in range(_MAX_CONSECUTIVE_BAD):
            i = (index + attempt) % len(self)
            path = self.filename(i)
            try:
                return path, _load_rgb(path), self.reader.samples[i][1]
            except Exception as e:  # noqa: BLE001 - PIL raises OSError, ValueError, SyntaxError... for bad files
                if not self.skip_bad_images:
                    raise BadImageError(f'cannot read image {path} ({_reason(e)}): {SKIP_HINT}') from None
                self._bad_queue.put(path)
        raise BadImageError(f'{_MAX_CONSECUTIVE_BAD} consecutive unreadable images from {self.filename(index)} on: '
                            'is the data folder intact?')

    def __getitem__(self, index: int) -> Tuple[Any, int]:
        path, img, target = self._read(index)
        if self.transform is not None:
            try:
                img = self._augment(img, index)
            except Exception as e:  # noqa: BLE001 - name the file, whatever the augmentation raised
                raise SampleError(f'the transform failed on {path} ({_reason(e)})') from e
        return img, target

    def _augment(self, img: Image.Image, index: int) -> Any:
        """The transform; with ``augment_seed`` set, its random draws depend on (seed, epoch, index) only.

        Why: a mid-epoch resume skips the samples already trained on, which changes which worker process loads which
        sample and how far each worker's RNG has advanced; per-sample seeds make the resumed epoch draw exactly the
        augmentations of the uninterrupted one, for any number of workers. The caller's RNG states are restored, so
        the main process (``workers=0``) keeps its own stream.
        """
        if self.augment_seed is None:
            return self.transform(img)
        seed = ((self.augment_seed * 1_000_003 + self.epoch) * 10_000_019 + index) % 2 ** 63
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            random.seed(seed)
            np.random.seed(seed % 2 ** 32)
            torch.random.default_generator.manual_seed(seed)
            try:
                return self.transform(img)
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)

    def bad_images(self) -> List[str]:
        """Paths skipped since the last call, each path reported once per dataset."""
        new = []
        while self._bad_queue is not None and not self._bad_queue.empty():
            path = self._bad_queue.get()
            if path not in self._reported:
                self._reported.add(path)
                new.append(path)
        return new


def open_dataset(data: str, split: str, *, class_map: Optional[Dict[str, int]] = None,
                 skip_bad_images: bool = False) -> ImageFolderDataset:
    """The ``split`` folder of ``data`` in the ImageFolder layout; with ``class_map`` (the training set's), its
    labels use the same indices and a class the map lacks is an error."""
    if not os.path.isdir(data):
        raise TcnnError(f'data folder not found: {data}')
    path = os.path.join(data, split)
    layout = f'expected the ImageFolder layout DATA/{split}/CLASS/IMAGE'
    if not os.path.isdir(path):
        raise TcnnError(f'data folder not found: {path} ({layout})')
    if not any(e.is_dir() for e in os.scandir(path)):
        raise TcnnError(f'{path} has no class folders ({layout}): images directly in {split}/ would make a '
                        '1-class problem')
    try:
        dataset = ImageFolderDataset(path, skip_bad_images=skip_bad_images)
    except RuntimeError as e:  # timm: 'Found 0 images in subfolders of ...'
        raise TcnnError(f'no images in {path} ({layout}; {str(e).strip().splitlines()[0]})') from None
    if len(dataset) == 0:
        raise TcnnError(f'no images in {path} ({layout})')
    if class_map is not None and dataset.class_to_idx != class_map:
        unknown = sorted(set(dataset.class_to_idx) - set(class_map))
        if unknown:
            raise TcnnError(f'{path} has classes that the training set lacks: {", ".join(unknown[:5])}')
        dataset = ImageFolderDataset(path, class_map=class_map, skip_bad_images=skip_bad_images)
    return dataset


def data_config(recipe: Mapping[str, Any], model: nn.Module) -> Dict[str, Any]:
    """Eval preprocessing: the model's pretrained config, overridden by the recipe."""
    from timm.data import resolve_data_config
    cfg = resolve_data_config({}, model=model)
    size = recipe['eval_img_size'] or recipe['img_size']
    return {
        'input_size': [3, size, size],
        'interpolation': recipe['interpolation'] or cfg['interpolation'],
        'mean': list(recipe['mean'] or cfg['mean']),
        'std': list(recipe['std'] or cfg['std']),
        'crop_pct': recipe['crop_pct'] if recipe['crop_pct'] is not None else cfg['crop_pct'],
        'crop_mode': cfg.get('crop_mode', 'center'),
    }


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


def build_transforms(recipe: Mapping[str, Any], data_cfg: Mapping[str, Any]) -> Tuple[Callable, Callable]:
    """timm's training transform with the recipe's augmentation and its evaluation transform."""
    from timm.data import create_transform
    train = create_transform(
        recipe['img_size'], is_training=True, auto_augment=recipe['aa'], color_jitter=recipe['color_jitter'],
        re_prob=recipe['reprob'], re_mode=recipe['remode'], re_count=recipe['recount'],
        scale=tuple(recipe['scale']) if recipe.get('scale') else None,
        interpolation=data_cfg['interpolation'], mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']))
    val = create_transform(
        data_cfg['input_size'][-1], is_training=False, interpolation=data_cfg['interpolation'],
        mean=tuple(data_cfg['mean']), std=tuple(data_cfg['std']), crop_pct=data_cfg['crop_pct'],
        crop_mode=data_cfg['crop_mode'])
    return _safe_ops(train), val
