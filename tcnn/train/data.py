"""The data of a training run, as its recipe asks: the recipe's ``data`` (an image folder or a timm reader) opened at
its train and val splits, with the class count they imply checked against the recipe's; the run's evaluation
preprocessing (the model's data config, overridden by the recipe); and the recipe's augmentation (timm's training
transform: DeiT's RandAugment, random erasing, colour jitter).

The datasets, readers and transforms themselves are ``tcnn.data``'s, which knows nothing of recipes."""
import dataclasses
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
import torch.nn as nn
from timm.data import create_transform
from torch.utils.data import Dataset

from ..data.batch_augment import BatchAugment, UnsupportedAugmentation
from ..data.config import data_config
from ..data.folders import open_dataset
from ..data.readers import StreamDataset, is_reader_spec, open_reader_datasets
from ..data.resident import estimate_decoded_bytes, memory_budget
from ..data.transforms import safe_augmentation
from ..errors import TcnnError
from .recipe import Recipe

__all__ = ['TrainingData', 'open_training_data', 'recipe_data_config', 'build_transforms', 'batched_augmentation',
           'RESIDENT_SHARE', 'resolve_pipeline']


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



def open_training_data(recipe: Recipe, resumed: bool = False) -> TrainingData:
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


def recipe_data_config(recipe: Recipe, model: nn.Module) -> Dict[str, Any]:
    """Eval preprocessing of a training run: the model's (``data_config``), overridden by the recipe."""
    cfg = data_config(model, img_size=recipe.eval_img_size or recipe.img_size)
    for key in ('interpolation', 'mean', 'std', 'crop_pct'):
        value = getattr(recipe, key)
        if value is not None:
            cfg[key] = tuple(value) if isinstance(value, (list, tuple)) else value
    return cfg


def batched_augmentation(recipe: Recipe, data_cfg: Mapping[str, Any]) -> BatchAugment:
    """The batched pipelines' training transform: the recipe's augmentation as timm's (``build_transforms``) makes
    it, on batches. (Validation stays on timm's eval transform on every pipeline: its numbers are ``tcnn eval``'s.)

    Raises:
        UnsupportedAugmentation: The recipe asks for augmentation the batched transform does not implement.
    """
    return BatchAugment(
        recipe.img_size, scale=tuple(recipe.scale) if recipe.scale else None, auto_augment=recipe.aa,
        color_jitter=recipe.color_jitter, interpolation=data_cfg['interpolation'], mean=tuple(data_cfg['mean']),
        std=tuple(data_cfg['std']), re_prob=recipe.reprob, re_mode=recipe.remode, re_count=recipe.recount)


# The share of the device's memory (a GPU's total, the CPU's available) that resident splits may take under 'auto'
RESIDENT_SHARE = {'cuda': 0.25, 'cpu': 0.25}


def resolve_pipeline(recipe: Recipe, data: TrainingData, data_cfg: Mapping[str, Any], device: torch.device,
                     local_processes: int = 1) -> Tuple[str, str]:
    """The data pipeline a run uses (``recipe.data_pipeline``, with ``auto`` decided here) and why.

    ``auto``: a stream, or augmentation the batched transforms lack, keeps timm's PIL transform; splits whose decoded
    pixels fit ``RESIDENT_SHARE`` of the device's memory (per local training process) are kept resident; others are
    decoded and augmented in batches on the CPU (measured faster per core than the PIL pipeline: docs/benchmarks.md,
    "Feeding the model") and keep the PIL pipeline on a GPU, where the device pipeline fed the loop more slowly than
    the PIL workers when it was measured (before its finishing thread).

    Raises:
        TcnnError: ``device`` or ``resident`` asked for a stream, or for augmentation the batched path lacks.
    """
    asked = recipe.data_pipeline
    if asked == 'pil':
        return 'pil', 'asked for'
    if data.streaming:
        if asked != 'auto':
            raise TcnnError(f'data_pipeline {asked} needs data with an index (an image folder or hfds/NAME); '
                            f'{recipe.data} is a stream: use --data-pipeline pil')
        return 'pil', 'a stream'
    try:
        batched_augmentation(recipe, data_cfg)
    except UnsupportedAugmentation as e:
        if asked != 'auto':
            raise TcnnError(f'data_pipeline {asked}: {e}; use --data-pipeline pil') from None
        return 'pil', f'the batched pipelines lack part of the augmentation ({e})'
    if asked != 'auto':
        return asked, 'asked for'
    needed = [estimate_decoded_bytes(split) for split in (data.train, data.val)]
    budget = memory_budget(device, RESIDENT_SHARE[device.type], local_processes)
    if None not in needed and sum(needed) <= budget:
        return 'resident', (f'the splits take about {sum(needed) / 2 ** 20:.0f} MiB decoded, within '
                            f'{budget / 2 ** 20:.0f} MiB')
    why = 'the splits are too large to keep decoded' if None not in needed else 'image sizes unknown'
    if device.type != 'cpu':
        # measured on an H100 (docs/benchmarks.md): nvjpeg and the augmentation between the steps fed the loop at
        # 0.45 of the step's speed with 8 workers, 16 PIL workers at 0.68; until the finishing thread is measured, a
        # GPU run keeps the PIL pipeline
        return 'pil', f'{why}; --data-pipeline device decodes on the GPU'
    return 'device', why


def build_transforms(recipe: Recipe, data_cfg: Mapping[str, Any]) -> Tuple[Callable, Callable]:
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
    return safe_augmentation(train), val
