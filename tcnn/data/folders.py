"""Image folders in the ImageFolder layout (``DATA/SPLIT/CLASS/IMAGE``), read with timm's folder reader, with an
explicit policy for unreadable images: stop the run with one line naming the file (default), or replace it by the next
readable image and log it once (``skip_bad_images``). timm's own dataset would skip them silently; on ImageNet-scale
folders a user wants to know.
"""
import functools
import multiprocessing
import os
import random
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from timm.data.readers import create_reader
from torch.utils.data import Dataset

from ..errors import TcnnError
from .decode import decode_pil, jpeg_size, pil_to_tensor

__all__ = ['BadImageError', 'SampleError', 'SKIP_HINT', 'MAX_CONSECUTIVE_BAD', 'error_text', 'sample_seed',
           'ImageFolderDataset', 'open_dataset']

SKIP_HINT = 'remove or replace it, or pass --skip-bad-images (recipe key skip_bad_images) to skip such files'
MAX_CONSECUTIVE_BAD = 50  # a run of unreadable images this long is a damaged folder, not a few bad files


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


def error_text(e: BaseException) -> str:
    """An exception as ``Type: message`` on one line (at most 200 characters of the message), for messages that name
    a file."""
    text = ' '.join(str(e).split())[:200]
    return f'{type(e).__name__}: {text}' if text else type(e).__name__


def _load_rgb(f: BinaryIO) -> Image.Image:
    return Image.open(f).convert('RGB')  # decodes every pixel: a truncated file fails here, not in a transform


def _decode_rgb(f: BinaryIO, prepare: Optional[Callable[[Image.Image], Image.Image]] = None) -> torch.Tensor:
    img = _load_rgb(f)
    return pil_to_tensor(img if prepare is None else prepare(img))


def _encoded(f: BinaryIO) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """A file for a batched pipeline: a JPEG that a batch decoder takes as bytes, anything else decoded now."""
    data = f.read()
    size = jpeg_size(data)
    if size is not None:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), size
    pixels = decode_pil(data)
    return pixels, (pixels.shape[1], pixels.shape[2])


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's augmentation in one epoch: a function of (seed, epoch, index) only, so that any
    worker, any number of workers, and a run resumed in the middle of an epoch draw the same augmentation for it."""
    return ((seed * 1_000_003 + epoch) * 10_000_019 + index) % 2 ** 63


class ImageFolderDataset(Dataset):
    """``ROOT/CLASS/IMAGE`` with timm's folder reader (its class order and file types) and an explicit policy for
    unreadable files.

    Skipped paths travel from the worker processes to the main process through a queue; ``bad_images()`` returns
    each newly skipped path once.
    """

    def __init__(self, root: str, class_map: Optional[Dict[str, int]] = None, skip_bad_images: bool = False,
                 transform: Optional[Callable] = None):
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

    def _load(self, i: int, decode: Callable[[BinaryIO], Any]) -> Tuple[str, Any, int]:
        """Sample ``i``: its name, ``decode`` of its open file, its label."""
        path = self.filename(i)
        with open(path, 'rb') as f:
            return path, decode(f), self.reader.samples[i][1]

    def _read(self, index: int, decode: Callable[[BinaryIO], Any] = _load_rgb) -> Tuple[str, Any, int]:
        """Sample ``index`` decoded by ``decode`` (default: Pillow, RGB), or by the skip policy the next readable
        one."""
        for attempt in range(MAX_CONSECUTIVE_BAD):
            i = (index + attempt) % len(self)
            try:
                return self._load(i, decode)
            except Exception as e:  # noqa: BLE001 - PIL raises OSError, ValueError, SyntaxError... for bad files
                if not self.skip_bad_images:
                    raise BadImageError(
                        f'cannot read image {self.filename(i)} ({error_text(e)}): {SKIP_HINT}') from None
                self._bad_queue.put(self.filename(i))
        raise BadImageError(f'{MAX_CONSECUTIVE_BAD} consecutive unreadable images from {self.filename(index)} on: '
                            'is the data folder intact?')

    def read_encoded(self, index: int) -> Tuple[str, torch.Tensor, Tuple[int, int], int]:
        """Sample ``index`` for a batched pipeline (``tcnn.data.encoded``): its name, its payload, the image's
        (height, width) and its label. The payload is the file's bytes (a 1-D uint8 tensor) for a complete RGB or
        grayscale JPEG, whose pixels a batch decoder makes later, else the pixels Pillow decodes now (uint8
        (3, H, W)): other formats, and files Pillow must judge, go the PIL pipeline's way, bad-image policy
        included."""
        name, (payload, size), target = self._read(index, _encoded)
        return name, payload, size, target

    def read_decoded(self, index: int, prepare: Optional[Callable[[Image.Image], Image.Image]] = None
                     ) -> Tuple[str, torch.Tensor, int]:
        """Sample ``index`` decoded by Pillow (and ``prepare``d: an eval transform's resize and crop) as uint8
        (3, H, W) pixels, for the resident pipeline's one pass: its name, pixels and label."""
        return self._read(index, functools.partial(_decode_rgb, prepare=prepare))

    def report_bad(self, name: str) -> None:
        """Apply the bad-image policy to a sample that failed after it was read (a batch decoder's failure): raise
        ``BadImageError`` naming it, or (``skip_bad_images``) log it once with the others."""
        if not self.skip_bad_images:
            raise BadImageError(f'cannot decode image {name}: {SKIP_HINT}')
        self._bad_queue.put(name)

    def __getitem__(self, index: int) -> Tuple[Any, int]:
        path, img, target = self._read(index)
        if self.transform is not None:
            try:
                img = self._augment(img, index)
            except Exception as e:  # noqa: BLE001 - name the file, whatever the augmentation raised
                raise SampleError(f'the transform failed on {path} ({error_text(e)})') from e
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
        seed = sample_seed(self.augment_seed, self.epoch, index)
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
