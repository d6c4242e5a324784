"""Training and validation data of ``tcnn train``: image folders, the model's preprocessing, the recipe's augmentation.

* ``open_dataset``: an ImageFolder split (``DATA/SPLIT/CLASS/IMAGE``) whose unreadable images either stop the run
  with one line naming the file (default) or are replaced by the next readable image and logged once each
  (``skip_bad_images``). timm's own dataset would skip them silently; on ImageNet-scale folders a user wants to know.
* ``open_reader_datasets``: ``--data READER/...``, timm's dataset readers (``wds/FOLDER`` webdataset shards,
  ``hfds/NAME``, ``hfids/NAME``, ``tfds/NAME``); streams become ``StreamDataset`` (no index, no sampler: timm's
  reader splits the shards between processes and workers), the map-style ``hfds`` a ``ReaderDataset``.
* ``data_config``: the model's pretrained preprocessing (mean, std, crop, interpolation), overridden by the recipe.
* ``build_transforms``: timm's train/eval transforms with the recipe's DeiT augmentation, made safe for every
  supported Pillow (see ``posterize``).
"""
import dataclasses
import difflib
import importlib.util
import json
import multiprocessing
import os
import random
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from PIL import Image, ImageOps
from timm.data import create_dataset, create_transform, resolve_data_config
from timm.data.readers import create_reader
from torch.utils.data import Dataset

from .errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number

if TYPE_CHECKING:
    from .train.recipe import Recipe

__all__ = ['BadImageError', 'SampleError', 'ImageFolderDataset', 'open_dataset', 'DATA_CONFIG_KEYS', 'data_config',
           'recipe_data_config', 'class_names', 'check_image_options', 'IMAGE_EXTENSIONS', 'find_images',
           'sample_images', 'load_images', 'denormalize', 'build_transforms', 'posterize', 'SKIP_HINT', 'READERS',
           'split_data_spec', 'is_reader_spec', 'open_reader_datasets', 'StreamDataset', 'ReaderDataset',
           'TrainingData', 'num_images', 'open_training_data', 'dense_data_config']

# The preprocessing a model needs at evaluation (timm's data config keys), stored in T-CNN files.
DATA_CONFIG_KEYS = ('input_size', 'interpolation', 'mean', 'std', 'crop_pct', 'crop_mode')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
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


def data_config(model: nn.Module, img_size: Optional[int] = None, crop_pct: Optional[float] = None,
                use_test_size: bool = False) -> Dict[str, Any]:
    """The eval preprocessing of ``model`` (``DATA_CONFIG_KEYS``): the one place tcnn asks for it.

    timm's ``resolve_data_config`` reads the model's ``pretrained_cfg`` (``tcnn.load`` puts a T-CNN file's stored
    config there); a torchvision model has none, so its default weights' eval transform is used instead of timm's
    ImageNet defaults (a torchvision ResNet is evaluated at resize 232 / crop 224, not 224 / 0.875).

    Args:
        model: The model itself (not a DDP wrapper: ``tcnn.save`` unwraps before asking).
        img_size: Square input resolution instead of the model's.
        crop_pct: Centre-crop fraction instead of the model's.
        use_test_size: The model's test size and crop (``test_input_size``, ``test_crop_pct`` of its
            ``pretrained_cfg``, as timm's ``validate.py`` uses by default) where it has them, instead of its
            ``input_size`` and ``crop_pct`` (for timm's pretrained CNNs, often the smaller training size: resnetrs50
            160 px vs 224 px at test).
    """
    check_image_options(img_size, crop_pct)
    config = None
    source = (getattr(model, 'tcnn_source', None) or {}).get('model', '')
    if not getattr(model, 'pretrained_cfg', None) and source.startswith('torchvision:'):
        config = _torchvision_data_config(source.split(':', 1)[1])
    if config is None:
        config = resolve_data_config({}, model=model, use_test_size=use_test_size)
    config = {k: config[k] for k in DATA_CONFIG_KEYS if k in config}
    config.setdefault('crop_mode', 'center')
    if img_size is not None:
        config['input_size'] = (3, int(img_size), int(img_size))
    if crop_pct is not None:
        config['crop_pct'] = float(crop_pct)
    return config


def _torchvision_data_config(arch: str) -> Optional[Dict[str, Any]]:
    """The eval transform of torchvision's default weights for ``arch`` (resize, crop, mean/std), timm-style; None
    without one (no weights, or a detection or segmentation transform: ``dense_data_config``)."""
    import torchvision  # only for torchvision models: importing it costs ~0.5 s
    try:
        transform = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):
        return None
    if not hasattr(transform, 'crop_size'):
        return None
    crop, resize = transform.crop_size[0], transform.resize_size[0]
    return {'input_size': (3, crop, crop), 'interpolation': transform.interpolation.value,
            'mean': tuple(transform.mean), 'std': tuple(transform.std), 'crop_pct': crop / resize,
            'crop_mode': 'center'}


def dense_data_config(name: str) -> Dict[str, Any]:
    """What applies of a data config to the torchvision detection or segmentation model ``'torchvision:NAME'``.

    A detection model takes images in [0, 1] of any size and resizes and normalises them itself (its ``transform``,
    set by the builder's ``min_size``, ``max_size``, ``image_mean``, ``image_std``): nothing applies, ``{}``. A
    segmentation model's weights normalise beforehand (``mean``, ``std``, ``interpolation`` of the resize); any size
    goes in, so there is no ``input_size`` or crop.
    """
    import torchvision
    try:
        transform = torchvision.models.get_model_weights(name.split(':', 1)[-1]).DEFAULT.transforms()
    except (ValueError, AttributeError, KeyError):
        return {}
    if not hasattr(transform, 'mean'):  # ObjectDetection: only converts to float in [0, 1]
        return {}
    return {'interpolation': transform.interpolation.value, 'mean': tuple(transform.mean),
            'std': tuple(transform.std)}


def recipe_data_config(recipe: 'Recipe', model: nn.Module) -> Dict[str, Any]:
    """Eval preprocessing of a training run: the model's (``data_config``), overridden by the recipe."""
    cfg = data_config(model, img_size=recipe.eval_img_size or recipe.img_size)
    for key in ('interpolation', 'mean', 'std', 'crop_pct'):
        value = getattr(recipe, key)
        if value is not None:
            cfg[key] = tuple(value) if isinstance(value, (list, tuple)) else value
    return cfg


def check_image_options(img_size: Optional[int], crop_pct: Optional[float],
                        names: Tuple[str, str] = ('img_size', 'crop_pct')) -> None:
    """An input resolution (a positive int) and a centre-crop fraction in (0, 1], each optional; ``names`` are the
    arguments (or flags) named in messages."""
    if img_size is not None:
        check_number(img_size, names[0], ge=1, integer=True)
    if crop_pct is not None:
        check_number(crop_pct, names[1], gt=0, le=1)


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


# ---------------------------------------------------------------------------------------------------- timm readers

# ``--data READER/REST``: timm's dataset readers (``timm.data.create_dataset`` names). REST is the shard folder (or
# URL) for ``wds``, the dataset name or local dataset folder for the others. The package each needs, and its install.
READERS: Dict[str, Tuple[str, str]] = {
    'wds': ('webdataset', "pip install 'tcnn[wds]'"),
    'hfds': ('datasets', 'pip install datasets'),
    'hfids': ('datasets', 'pip install datasets'),
    'tfds': ('tensorflow_datasets', 'pip install tensorflow-datasets'),
}
# timm's split synonyms: a recipe's 'val' finds a 'validation' split (timm's webdataset ImageNet) and back.
_SPLIT_SYNONYMS = (('train', 'training'), ('val', 'validation', 'valid', 'eval', 'evaluation'))
_INFO_FILES = ('_info.json', 'info.json')


def split_data_spec(data: str) -> Tuple[Optional[str], str]:
    """``'wds/ROOT'`` -> ``('wds', 'ROOT')``; a folder (or anything without a known reader prefix) -> ``(None, data)``.

    Raises:
        TcnnError: ``data`` does not exist and starts with what looks like a misspelt reader (``wsd/...``) or one of
            timm's readers that ``tcnn train`` does not take (``torch/...``).
    """
    prefix, sep, rest = data.partition('/')
    if sep and prefix.lower() in READERS and rest:
        return prefix.lower(), rest
    if sep and prefix and not os.path.exists(data) and not os.path.exists(prefix):
        close = difflib.get_close_matches(prefix.lower(), list(READERS), n=1, cutoff=0.6)
        if close or prefix.lower() in ('torch', 'hf', 'webdataset'):
            known = ', '.join(f'{r}/' for r in READERS)
            hint = f'did you mean {close[0]}/{rest}? ' if close else ''
            raise TcnnError(f'unknown dataset reader {prefix!r} in --data {data}: {hint}tcnn train reads a folder '
                            f'(ImageFolder layout) or timm\'s readers {known}')
    return None, data


def is_reader_spec(data: str) -> bool:
    """Whether ``--data`` names one of timm's dataset readers (``wds/...``, ``hfds/...``, ...)."""
    return split_data_spec(data)[0] is not None


def _read_info(root: str) -> Dict[str, Any]:
    """A local shard folder's ``_info.json`` (timm's webdataset split description), ``{}`` without one."""
    for name in _INFO_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    info = json.load(f)
            except (OSError, ValueError) as e:
                raise TcnnError(f'cannot read {path} ({_reason(e)}): fix or remove it') from None
            if not isinstance(info, dict):
                raise TcnnError(f'{path} is not a JSON object (timm\'s webdataset info: {{"splits": {{...}}}})')
            return info
    return {}


def _resolve_split(split: str, available: List[str]) -> str:
    """``split``, or the synonym of it that the dataset has (``val`` -> ``validation``), else ``split`` unchanged."""
    if split in available:
        return split
    for group in _SPLIT_SYNONYMS:
        if split in group:
            return next((s for s in group if s in available), split)
    return split


def _is_local(root: str) -> bool:
    return '://' not in root and not root.startswith('pipe:')


def _wds_split(root: str, split: str, info: Dict[str, Any]) -> Tuple[str, List[str], int]:
    """The split name timm gets, its shard files and its sample count (0: unknown) for a webdataset folder."""
    from timm.data.readers.reader_wds import _parse_split_info
    pattern = 'tar' in split or '..' in split
    splits = info.get('splits') if isinstance(info.get('splits'), dict) else {}
    if not pattern:
        split = _resolve_split(split, list(splits))
        if split not in splits:
            where = (f'its _info.json lists {", ".join(sorted(splits)) or "no splits"}' if info else
                     'it has no _info.json')
            raise TcnnError(f'wds/{root} has no split {split!r} ({where}): name the split, or its shards and size '
                            f'in the split, e.g. --set train_split="train-{{0000..0099}}.tar|N" (N: images in them)')
    try:
        split_info = _parse_split_info(split, dict(info))
    except (KeyError, TypeError, ValueError) as e:
        raise TcnnError(f'cannot read split {split!r} of wds/{root} ({_reason(e)}): check its _info.json or the '
                        'split pattern NAME-{0000..0099}.tar|N') from None
    files = [os.path.join(root, f) for f in split_info.filenames]
    if not files:
        raise TcnnError(f'split {split!r} of wds/{root} has no shard files')
    if _is_local(root):
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            more = f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''
            raise TcnnError(f'shard not found: {missing[0]}{more}, split {split!r} of wds/{root}: check --data and '
                            'the split\'s shard names')
    return split, files, int(split_info.num_samples or 0)


class StreamDataset(torch.utils.data.IterableDataset):
    """A timm ``IterableImageDataset`` (webdataset shards, streamed HF/TFDS datasets) as ``tcnn train`` uses it.

    timm's reader splits the shards between processes and loader workers itself (so the loader has no sampler), and
    a training stream yields ``num_samples / processes`` samples per process and epoch, repeating shards when one
    worker runs short. This wrapper adds the transform, checks each label against the class count, and rebuilds the
    reader's pipeline every epoch so that an epoch's stream depends only on (seed, epoch, loader worker seeds): a run
    resumed at an epoch boundary sees the same data as an uninterrupted one.
    """

    def __init__(self, dataset: Any, spec: str, split: str, num_samples: int, num_classes: Optional[int],
                 shards: int, class_to_idx: Optional[Dict[str, int]] = None):
        self.dataset = dataset
        self.spec = spec
        self.split = split
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.shards = shards
        self.class_to_idx: Dict[str, int] = dict(class_to_idx or {})
        self.transform: Optional[Callable] = None
        self.augment_seed: Optional[int] = None  # unused: a stream has no per-index seeds

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        if hasattr(self.dataset.reader, 'ds'):
            self.dataset.reader.ds = None  # rebuilt from (seed, epoch) at the next iteration (see the class doc)

    def set_workers(self, workers: int) -> None:
        self.dataset.set_loader_cfg(num_workers=workers)

    def use_every_sample_in_this_process(self) -> None:
        """Read the whole split here instead of this process's share (validation on rank 0: exact counts)."""
        reader = self.dataset.reader
        if hasattr(reader, 'dist_num_replicas'):
            reader.dist_rank, reader.dist_num_replicas = 0, 1

    def __iter__(self) -> Iterator[Tuple[Any, int]]:
        for img, target in self.dataset:
            if self.num_classes is not None and not (isinstance(target, int) and 0 <= target < self.num_classes):
                raise SampleError(f'a sample of {self.spec} (split {self.split}) has label {target!r}, outside 0..'
                                  f'{self.num_classes - 1}: set num_classes (--set num_classes=N) to the data\'s '
                                  'class count')
            if self.transform is not None:
                try:
                    img = self.transform(img)
                except Exception as e:  # noqa: BLE001 - name the dataset, whatever the augmentation raised
                    raise SampleError(f'the transform failed on a sample of {self.spec} ({_reason(e)})') from e
            yield img, target

    def bad_images(self) -> List[str]:
        """Always empty: timm's stream readers skip undecodable samples themselves (with a logged warning)."""
        return []


def _check_reader_package(reader: str, data: str) -> None:
    package, install = READERS[reader]
    if importlib.util.find_spec(package) is None:
        raise TcnnError(f'--data {data} needs the {package} package: {install}')


def open_reader_datasets(data: str, train_split: str, val_split: str, *, num_classes: Optional[int], batch_size: int,
                         seed: int, skip_bad_images: bool = False) -> Tuple[Any, Any, Optional[int]]:
    """The training and validation sets of ``--data READER/REST`` (timm's ``create_dataset`` readers) and the class
    count the data states itself (its class names, a webdataset's ``_info.json``; None when only ``num_classes``
    gives it). The datasets check labels against ``num_classes``, else the data's own count.

    ``hfds`` is map-style (an ``ImageFolderDataset``-like ``ReaderDataset``: sampler, exact mid-epoch resume);
    ``wds``, ``hfids`` and ``tfds`` are streams (``StreamDataset``), whose training split must state its size.

    Raises:
        TcnnError: A missing package, split or shard, an unknown training-set size, or an unknown class count.
    """
    reader, rest = split_data_spec(data)
    _check_reader_package(reader, data)
    if reader == 'hfds':
        train = ReaderDataset(data, rest, train_split, skip_bad_images=skip_bad_images)
        val = ReaderDataset(data, rest, _resolve_split(val_split, train.splits), class_map=train.class_to_idx or None,
                            skip_bad_images=skip_bad_images)
        known = len(train.class_to_idx) or None
        if not (num_classes or known):
            raise TcnnError(f'{data} does not name its classes: set --set num_classes=N')
        return train, val, known
    name, root = (reader + '/' + os.path.basename(rest.rstrip('/')), rest) if reader == 'wds' else (data, None)
    kwargs: Dict[str, Any] = {}
    splits = []
    info: Dict[str, Any] = {}
    if reader == 'wds':
        if _is_local(rest) and not os.path.isdir(rest):
            raise TcnnError(f'webdataset folder not found: {rest} (--data wds/FOLDER: the folder of the .tar shards '
                            'and their _info.json)')
        info = _read_info(rest) if _is_local(rest) else {}
        train_split, train_files, n_train = _wds_split(rest, train_split, info)
        val_split, val_files, n_val = _wds_split(rest, val_split, info)
        splits = [(train_split, len(train_files), n_train), (val_split, len(val_files), n_val)]
        known = info.get('num_classes') or None
        num_classes = num_classes or known
        if not num_classes:
            raise TcnnError(f'the classes of {data} are unknown (webdataset .cls labels are bare indices): set '
                            '--set num_classes=N (or "num_classes" in its _info.json)')
    else:
        splits = [(train_split, 0, 0), (val_split, 0, 0)]
        known = None
    sets = []
    size_hint = ('give it in the _info.json ("num_samples") or the split, e.g. --set '
                 'train_split="train-{0000..0099}.tar|N"')
    for (split, shards, count), training in zip(splits, (True, False)):
        if training and reader == 'wds' and count <= 0:
            raise TcnnError(f'the size of split {split!r} of {data} is unknown, so the epoch length is too: '
                            f'{size_hint}')
        try:
            ds = create_dataset(name, root=root, split=split, is_training=training, batch_size=batch_size, seed=seed,
                                **kwargs)
        except TcnnError:
            raise
        except Exception as e:  # noqa: BLE001 - readers raise RuntimeError, AssertionError, their libraries' errors
            raise TcnnError(f'cannot open split {split!r} of {data} ({_reason(e)})') from None
        count = count or int(getattr(ds.reader, 'num_samples', 0) or 0)
        if training and count <= 0:
            raise TcnnError(f'the size of split {split!r} of {data} is unknown, so the epoch length is too: '
                            f'{size_hint}')
        own = len(getattr(ds.reader, 'class_to_idx', None) or {}) or None
        if training:
            known = known or own
        classes = num_classes or own
        sets.append(StreamDataset(ds, data, split, count, classes, shards or 1,
                                  getattr(ds.reader, 'class_to_idx', None)))
    if sets[0].num_classes is None:
        raise TcnnError(f'the classes of {data} are unknown: set --set num_classes=N')
    return sets[0], sets[1], known


class ReaderDataset(ImageFolderDataset):
    """A map-style timm reader (``hfds/NAME``: a Hugging Face dataset by hub id or local folder) with the policy and
    per-sample augmentation seeds of ``ImageFolderDataset``; samples are named ``DATA[SPLIT]#INDEX`` in messages."""

    def __init__(self, spec: str, name: str, split: str, class_map: Optional[Dict[str, int]] = None,
                 skip_bad_images: bool = False, transform: Optional[Callable] = None):
        self.root = spec
        self.split = split
        try:
            self.reader = create_reader(f'hfds/{name}', root=None, split=split, class_map=class_map or None)
        except Exception as e:  # noqa: BLE001 - the datasets library raises many types for a missing split/name
            raise TcnnError(f'cannot open split {split!r} of {spec} ({_reason(e)})') from None
        self.splits = list(getattr(getattr(self.reader.dataset, 'info', None), 'splits', None) or [split])
        self.class_to_idx = dict(getattr(self.reader, 'class_to_idx', None) or {})
        self.skip_bad_images = skip_bad_images
        self.transform = transform
        self._bad_queue = multiprocessing.SimpleQueue() if skip_bad_images else None
        self._reported = set()
        self.augment_seed = None
        self.epoch = 0

    def filename(self, index: int) -> str:
        return f'{self.root}[{self.split}]#{index}'

    def _read(self, index: int) -> Tuple[str, Image.Image, int]:
        for attempt in range(_MAX_CONSECUTIVE_BAD):
            i = (index + attempt) % len(self)
            name = self.filename(i)
            try:
                image, target = self.reader[i][:2]
                with image:
                    img = Image.open(image)
                    return name, img.convert('RGB'), int(target)
            except Exception as e:  # noqa: BLE001 - PIL raises OSError, ValueError, SyntaxError... for bad images
                if not self.skip_bad_images:
                    raise BadImageError(f'cannot read image {name} ({_reason(e)}): {SKIP_HINT}') from None
                self._bad_queue.put(name)
        raise BadImageError(f'{_MAX_CONSECUTIVE_BAD} consecutive unreadable images from {self.filename(index)} on')


# ---------------------------------------------------------------------------------------------------- training data


@dataclasses.dataclass
class TrainingData:
    """The two splits of a training run and the class count they imply.

    Attributes:
        train: The training split: an ``ImageFolderDataset``, a ``ReaderDataset`` or a ``StreamDataset``.
        val: The validation split, labelled like ``train``.
        num_classes: The run's class count (the recipe's, or the data's when the recipe leaves it open).
        data_classes: The class count the data states itself (class folders, a reader's class names, a webdataset's
            ``_info.json``); None when only the recipe gives it.
    """
    train: Dataset
    val: Dataset
    num_classes: int
    data_classes: Optional[int] = None

    @property
    def streaming(self) -> bool:
        """A stream (webdataset shards, ...) has no index: no sampler, and a stop inside an epoch redoes it."""
        return isinstance(self.train, StreamDataset)


def class_names(dataset: Dataset, num_classes: int) -> Optional[List[str]]:
    """The class names of a training split by label index (its reader's ``class_to_idx``: an ImageFolder's sorted
    folder names, a Hugging Face dataset's label names), or None when they do not name every one of ``num_classes``
    labels (webdataset's bare indices)."""
    class_to_idx = getattr(dataset, 'class_to_idx', None) or {}
    by_index = {int(i): str(name) for name, i in class_to_idx.items()}
    if sorted(by_index) != list(range(num_classes)):
        return None
    return [by_index[i] for i in range(num_classes)]


def num_images(dataset: Dataset) -> int:
    """Images in a split: a stream's stated size (0: unknown), else the dataset's length."""
    return dataset.num_samples if isinstance(dataset, StreamDataset) else len(dataset)


def open_training_data(recipe: 'Recipe', resumed: bool = False) -> TrainingData:
    """Open the recipe's ``data`` (an ImageFolder root or a timm reader spec) at its train and val splits.

    Args:
        recipe: The resolved recipe.
        resumed: The recipe is a resumed run's (its ``num_classes`` is the checkpoint's model's), for the error
            when the class counts disagree.

    Raises:
        TcnnError: No data, a missing or malformed split, or a ``num_classes`` other than the class count the data
            states (a model trained on classes 0-2 of a 1000-class head learns nothing useful).
    """
    r = recipe
    if not r.data:
        raise TcnnError('no data: pass --data DIR (ImageFolder layout with train/ and val/) or a timm reader '
                        '(wds/FOLDER, hfds/NAME, ...)')
    if is_reader_spec(r.data):
        train, val, known = open_reader_datasets(
            r.data, r.train_split, r.val_split, num_classes=r.num_classes, batch_size=r.batch_size,
            seed=r.seed, skip_bad_images=r.skip_bad_images)
        where = f'the classes of {r.data}'
    else:
        train = open_dataset(r.data, r.train_split, skip_bad_images=r.skip_bad_images)
        val = open_dataset(r.data, r.val_split, class_map=train.class_to_idx,
                           skip_bad_images=r.skip_bad_images)
        known, where = len(train.class_to_idx), f'the class folders of {os.path.join(r.data, r.train_split)}'
    given = r.num_classes
    if given is not None and known is not None and given != known:
        if resumed:
            raise TcnnError(f'the resumed run\'s model has {given} classes, the data {known} ({where}): resume with '
                            'the data it was trained on, or start a new run')
        raise TcnnError(f'num_classes {given} disagrees with the data\'s {known} classes ({where}): leave num_classes '
                        f'out (tcnn train takes the class count from the data) or set --set num_classes={known}')
    return TrainingData(train, val, given if given is not None else known, known)
