"""The batched data pipeline for a split streamed from its files: loader workers read each file's bytes and draw the
sample's augmentation parameters; a batch is then decoded and augmented at once on a device (``decode_batch``, a
batched transform such as ``tcnn.data.batch_augment.BatchAugment``).

Where the pixel work runs: on a GPU, in the training process (``DeviceLoader`` finishes the next batches in a thread
of their own while the step runs, ``tcnn.data.prefetch``; nvjpeg and the augmentation kernels on the GPU); on the CPU,
in the loader workers (the same code as their ``collate_fn``, so that it overlaps the training step as the PIL
pipeline's workers do) or in the training process when it has none.

The parameters of a sample are drawn from a ``random.Random`` seeded by (seed, epoch, index) alone
(``tcnn.data.folders.sample_seed``): a resumed run, any worker count and the resident pipeline
(``tcnn.data.resident``) draw the same augmentation for the same sample.
"""
import dataclasses
import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import Dataset, default_collate

from .decode import decode_batch
from .folders import BadImageError, sample_seed
from .prefetch import FinishedAhead, default_prefetch

__all__ = ['Draw', 'EncodedSample', 'EncodedBatch', 'EncodedDataset', 'collate_encoded', 'BatchFinisher',
           'CollateAndFinish', 'DeviceLoader', 'replace_failed']

# (rng, (height, width)) -> one sample's augmentation parameters: fixed-shape CPU tensors (BatchAugment.draw)
Draw = Callable[[random.Random, Tuple[int, int]], Dict[str, torch.Tensor]]
EncodedSample = Tuple[str, torch.Tensor, Dict[str, torch.Tensor], int]


@dataclasses.dataclass
class EncodedBatch:
    """A collated batch before decoding: per sample its name (for messages), payload (JPEG bytes, or pixels decoded
    by Pillow) and label; the parameters stacked (``params[key]``: (B, ...))."""
    names: List[str]
    payloads: List[torch.Tensor]
    params: Dict[str, torch.Tensor]
    targets: torch.Tensor

    def pin_memory(self) -> 'EncodedBatch':  # what DataLoader(pin_memory=True) calls on a custom batch
        return dataclasses.replace(self, params={k: v.pin_memory() for k, v in self.params.items()},
                                   targets=self.targets.pin_memory())


class EncodedDataset(Dataset):
    """A map-style split (``ImageFolderDataset``, ``ReaderDataset``) served to the batched pipeline: a sample is its
    name, payload (``read_encoded``: the bad-image policy applies as in the PIL pipeline), augmentation parameters
    (``draw``; none for evaluation) and label.

    The epoch, the augmentation seed and the skipped images are the wrapped split's (``dataset``), which the trainer
    drives as it drives a PIL split.
    """

    def __init__(self, dataset: Any, draw: Optional[Draw] = None):
        self.dataset = dataset
        self.draw = draw

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> EncodedSample:
        name, payload, size, target = self.dataset.read_encoded(index)
        params = {}
        if self.draw is not None:
            seed = sample_seed(self.dataset.augment_seed or 0, self.dataset.epoch, index)
            params = self.draw(random.Random(seed), size)
        return name, payload, params, target


def collate_encoded(samples: List[EncodedSample]) -> EncodedBatch:
    names, payloads, params, targets = zip(*samples)
    return EncodedBatch(list(names), list(payloads), default_collate(list(params)) if params[0] else {},
                        torch.tensor(targets, dtype=torch.long))


def replace_failed(images: List[Optional[torch.Tensor]], batch: EncodedBatch, failed: List[int]) -> EncodedBatch:
    """Fill the images that failed to decode with copies of readable samples of the batch (the next readable one, as
    the PIL pipeline's skip policy takes the next readable file), their parameters and labels with them: a crop
    drawn for another image's size would not fit. Changes ``images`` in place; returns the batch's new parameters
    and labels.

    Raises:
        BadImageError: No image of the batch decoded.
    """
    good = [i for i, img in enumerate(images) if img is not None]
    if not good:
        raise BadImageError(f'no image of a batch of {len(images)} could be decoded (first: {batch.names[0]}): is '
                            'the data folder intact?')
    params = {k: v.clone() for k, v in batch.params.items()}
    targets = batch.targets.clone()
    for i in failed:
        j = next((g for g in good if g > i), good[0])
        images[i] = images[j]
        for v in params.values():
            v[i] = v[j]
        targets[i] = targets[j]
    return dataclasses.replace(batch, params=params, targets=targets)


class BatchFinisher:
    """Decode a collated batch on ``device`` and apply the batched ``transform`` (``transform(images, params)`` for
    training, ``transform(images)`` for evaluation).

    Args:
        transform: The batched transform.
        device: Where the pixels are decoded and augmented.
        report_bad: The split's bad-image policy for a file that fails to decode (``ImageFolderDataset.report_bad``:
            raises, or records it and lets the batch go on with a readable sample in its place).
        train: Whether ``transform`` takes the sampled parameters.
    """

    def __init__(self, transform: Callable[..., torch.Tensor], device: torch.device,
                 report_bad: Callable[[str], None], train: bool):
        self.transform = transform
        self.device = torch.device(device)
        self.report_bad = report_bad
        self.train = train

    def __call__(self, batch: EncodedBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        images, failed = decode_batch(batch.payloads, self.device)
        if failed:
            for i in failed:
                self.report_bad(batch.names[i])
            batch = replace_failed(images, batch, failed)
        out = self.transform(images, batch.params) if self.train else self.transform(images)
        return out, batch.targets.to(out.device, non_blocking=True)


class CollateAndFinish:
    """A loader's ``collate_fn`` that also decodes and augments the batch: the CPU pipeline's work done in the loader
    workers, beside the training step."""

    def __init__(self, finish: BatchFinisher):
        self.finish = finish

    def __call__(self, samples: List[EncodedSample]) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.finish(collate_encoded(samples))


class DeviceLoader:
    """A DataLoader of ``EncodedBatch`` whose batches are finished (decoded, augmented) in this process on the way
    out; with ``finish=None`` (the workers finished them) it passes them through.

    Its iterator is the DataLoader's, made at once (``iter`` of a ``DeviceLoader`` starts the workers, as
    ``tcnn.train.distributed.start_workers`` expects), and its ``worker_init_fn`` and length are the DataLoader's.

    Args:
        loader: The DataLoader of encoded batches.
        finish: What finishes a batch, or None.
        prefetch: How many batches a thread finishes ahead of the consumer (``tcnn.data.prefetch``); 0 finishes
            each batch when it is asked for. Default: ``default_prefetch`` of the finisher's device.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, finish: Optional[BatchFinisher],
                 prefetch: Optional[int] = None):
        self.loader = loader
        self.finish = finish
        if prefetch is None:
            prefetch = default_prefetch(finish.device) if finish is not None else 0
        self.prefetch = prefetch

    @property
    def worker_init_fn(self) -> Optional[Callable[[int], None]]:
        return self.loader.worker_init_fn

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(self.loader)
        if self.finish is None:
            return batches
        if self.prefetch > 0:
            return FinishedAhead(batches, self.finish, self.finish.device, self.prefetch)
        return map(self.finish, batches)
