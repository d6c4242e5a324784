"""``--data READER/REST``: timm's dataset readers (``timm.data.create_dataset`` names) for ``tcnn train``.

Streams (``wds/FOLDER`` webdataset shards, ``hfids/NAME``, ``tfds/NAME``) become ``StreamDataset`` (no index, no
sampler: timm's reader splits the shards between processes and workers); the map-style ``hfds/NAME`` a
``ReaderDataset``, with the unreadable-image policy and per-sample augmentation seeds of an image folder. What
any opened split tells of itself (``num_images``, ``class_names``) is read here too.
"""
import difflib
import importlib.util
import json
import multiprocessing
import os
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import Dataset
from timm.data import create_dataset
from timm.data.readers import create_reader

from ..errors import TcnnError
from .folders import ImageFolderDataset, SampleError, error_text

__all__ = ['READERS', 'split_data_spec', 'is_reader_spec', 'open_reader_datasets', 'StreamDataset', 'ReaderDataset',
           'class_names', 'num_images']

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
        if close or prefix.lower() in ('torch', 'webdataset'):  # timm's names far from ours ('hf' is close to hfds)
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
                raise TcnnError(f'cannot read {path} ({error_text(e)}): fix or remove it') from None
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
        raise TcnnError(f'cannot read split {split!r} of wds/{root} ({error_text(e)}): check its _info.json or the '
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


def _recorded_splits(name: str) -> List[str]:
    """The splits a Hugging Face dataset builder has recorded (none before the data was prepared, or when the builder
    cannot be loaded: the reader then says why)."""
    import datasets
    try:
        return list(datasets.load_dataset_builder(name).info.splits or [])
    except Exception:  # noqa: BLE001 - the reader opens it next and its error names the problem
        return []


def _stream_split(split: str, data: str, available: List[str]) -> Tuple[str, int, int]:
    """A Hugging Face or TFDS stream's split ``NAME`` or ``NAME|N`` as (name, or its synonym among the ``available``
    splits; shards: 0; size: N, else 0 for what its builder recorded)."""
    name, sep, size = split.partition('|')
    if sep and not (size.isdigit() and int(size) > 0):
        raise TcnnError(f'the size in split {split!r} of {data} must be a positive whole number: NAME|N')
    return _resolve_split(name, available), 0, int(size) if sep else 0


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
                    raise SampleError(f'the transform failed on a sample of {self.spec} ({error_text(e)})') from e
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
    ``wds``, ``hfids`` and ``tfds`` are streams (``StreamDataset``), whose training split must state its size: a
    webdataset's ``_info.json`` or a dataset builder's split info does, else the split as ``NAME|N``.

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
        available = _recorded_splits(rest) if reader == 'hfids' else []
        splits = [_stream_split(train_split, data, available), _stream_split(val_split, data, available)]
        known = None
    sets = []
    for (split, shards, count), training in zip(splits, (True, False)):
        key = 'train_split' if training else 'val_split'
        size_hint = ('give it in the _info.json ("num_samples") or the split, e.g. --set '
                     f'{key}="train-{{0000..0099}}.tar|N"' if reader == 'wds' else
                     f'give it in the split, e.g. --set {key}="{split}|N"')
        if training and reader == 'wds' and count <= 0:
            raise TcnnError(f'the size of split {split!r} of {data} is unknown, so the epoch length is too: '
                            f'{size_hint}')
        # a webdataset's split carries its size to timm itself; the other streams' readers take it as num_samples
        # (None: what the builder recorded)
        kwargs: Dict[str, Any] = {} if reader == 'wds' else {'num_samples': count or None}
        try:
            ds = create_dataset(name, root=root, split=split, is_training=training, batch_size=batch_size, seed=seed,
                                **kwargs)
        except TcnnError:
            raise
        except Exception as e:  # noqa: BLE001 - readers raise RuntimeError, AssertionError, their libraries' errors
            if 'length is unknown' in str(e):  # timm's hfids reader, for a dataset whose builder has no split sizes
                raise TcnnError(f'the size of split {split!r} of {data} is unknown, so the epoch length is too: '
                                f'{size_hint}') from None
            raise TcnnError(f'cannot open split {split!r} of {data} ({error_text(e)})') from None
        count = count or int(getattr(ds.reader, 'num_samples', 0) or 0)
        if training and count <= 0:
            raise TcnnError(f'the size of split {split!r} of {data} is unknown, so the epoch length is too: '
                            f'{size_hint}')
        class_to_idx = getattr(ds.reader, 'class_to_idx', None)
        if training:
            known = known or len(class_to_idx or {}) or None
        # labels are checked against the training split's class count in both splits: the model's output size
        sets.append(StreamDataset(ds, data, split, count, num_classes or known, shards or 1, class_to_idx))
    if not (num_classes or known):
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
            raise TcnnError(f'cannot open split {split!r} of {spec} ({error_text(e)})') from None
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

    def _load(self, i: int, decode: Callable[[BinaryIO], Any]) -> Tuple[str, Any, int]:
        image, target = self.reader[i][:2]
        with image:
            return self.filename(i), decode(image), int(target)


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
