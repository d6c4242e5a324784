"""The data of a training run: the recipe's ``data`` (an image folder or a timm reader) opened at its train and val
splits, with the class count they imply checked against the recipe's."""
import dataclasses
import os
from typing import TYPE_CHECKING, List, Optional

from torch.utils.data import Dataset

from ..errors import TcnnError
from .folders import open_dataset
from .readers import StreamDataset, is_reader_spec, open_reader_datasets

if TYPE_CHECKING:
    from ..train.recipe import Recipe

__all__ = ['TrainingData', 'class_names', 'num_images', 'open_training_data']


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
