"""The resident data pipeline: a split small enough to keep (the demo's, CIFAR-size, ImageNet at 64 px) is decoded
once into memory on the training device, and every batch is gathered and augmented there, with no loader workers
and no file reads after the first pass.

The pixels are Pillow's (the split is decoded as the PIL pipeline decodes it, bad-image policy included), and a
sample's augmentation parameters are drawn from the same (seed, epoch, index) seed as in the streamed batched pipeline
(``tcnn.data.encoded``): both pipelines give the same batches. A validation split is kept as its eval transform makes
it (resized and cropped by Pillow in the one pass, normalised per batch): the same batches as the PIL pipeline's.
"""
import math
import os
import random
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose

from .batch_misc import normalize
from .folders import sample_seed
from .prefetch import FinishedAhead, default_prefetch

# [(rng, (height, width)) per sample] -> the batch's parameters (BatchAugment.draw_many)
DrawMany = Callable[[Sequence[Tuple[random.Random, Tuple[int, int]]]], Dict[str, torch.Tensor]]

__all__ = ['DrawMany', 'ResidentSplit', 'ResidentLoader', 'estimate_decoded_bytes', 'memory_budget']


class _Decoded(Dataset):
    """Every sample of a split, decoded by Pillow (``ImageFolderDataset.read_decoded``) and ``prepare``d, for the one
    pass."""

    def __init__(self, dataset: Any, prepare: Optional[Callable[[Image.Image], Image.Image]]):
        self.dataset = dataset
        self.prepare = prepare

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        _, pixels, target = self.dataset.read_decoded(index, self.prepare)
        return pixels, target


def _split_eval_transform(transform: Any) -> Tuple[Callable[[Image.Image], Image.Image], Tuple[Tuple[float, ...],
                                                                                                 Tuple[float, ...]]]:
    """timm's eval transform (``Compose([resize, crop, MaybeToTensor, Normalize])``) as its Pillow part and the mean
    and std of its normalisation."""
    steps = list(getattr(transform, 'transforms', []))
    names = [type(t).__name__ for t in steps]
    if names[-2:] not in (['MaybeToTensor', 'Normalize'], ['ToTensor', 'Normalize']):
        raise ValueError(f'not an eval transform ending in ToTensor and Normalize: {names}')
    normalize = steps[-1]
    return Compose(steps[:-2]), (tuple(float(m) for m in normalize.mean), tuple(float(s) for s in normalize.std))


class _Normalize:
    """torchvision's ``ToTensor`` then ``Normalize`` on a uint8 batch (the same float32 ops, so the same values)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = mean, std

    def __call__(self, images: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
        batch = images if isinstance(images, torch.Tensor) else torch.stack(images)
        return normalize(batch, self.mean, self.std)


def _as_list(samples):
    return samples


def estimate_decoded_bytes(dataset: Any, sample: int = 64) -> Optional[int]:
    """What a split takes decoded (uint8 RGB), estimated from the image sizes in the headers of ``sample`` files
    spread over it (a header read costs microseconds; decoding would cost the pass itself); None where no header
    could be read (samples that are not files: a Hugging Face dataset)."""
    n = len(dataset)
    k = min(sample, n)  # spread over the split: a split of fewer than ``sample`` files is read whole
    picks = sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})
    pixels = []
    for i in picks:
        try:
            with Image.open(dataset.filename(i)) as img:
                pixels.append(img.size[0] * img.size[1])
        except Exception:  # noqa: BLE001 - a bad or non-file sample counts as the others' mean
            continue
    if not pixels:
        return None
    return int(math.ceil(sum(pixels) / len(pixels) * 3 * n))


def memory_budget(device: torch.device, share: float, local_processes: int = 1) -> int:
    """Bytes a resident split may take on ``device``: ``share`` of the GPU's total memory, or of the memory the
    system has available for the CPU, divided between the local training processes (each holds its own copy)."""
    if device.type == 'cuda':
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        try:
            total = os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
        except (ValueError, OSError, AttributeError):
            return 0
    return int(total * share / max(local_processes, 1))


class ResidentSplit:
    """A split decoded once, kept on ``device``: one uint8 (N, 3, H, W) tensor when every image has one size, else
    one tensor per image.

    Args:
        dataset: The split (``ImageFolderDataset`` or ``ReaderDataset``).
        device: Where the pixels live.
        workers: Loader processes for the one decoding pass (0: this process).
        log: Where to say what was decoded.
        prepare: An evaluation split's eval transform (timm's: resize, centre crop, ``ToTensor``, ``Normalize``):
            its Pillow part is applied in the one pass, so that the kept pixels are the transform's, and
            ``normalizer`` gives the rest.
    """

    def __init__(self, dataset: Any, device: Union[str, torch.device], workers: int = 0,
                 log: Callable[[str], None] = lambda msg: None, prepare: Optional[Callable[..., Any]] = None):
        self.dataset = dataset
        self.device = torch.device(device)
        geometry = None if prepare is None else _split_eval_transform(prepare)[0]
        loader = DataLoader(_Decoded(dataset, geometry), batch_size=256, num_workers=workers, collate_fn=_as_list)
        images: List[torch.Tensor] = []
        targets: List[int] = []
        for batch in loader:
            for pixels, target in batch:
                images.append(pixels)
                targets.append(target)
        self.targets = torch.tensor(targets, dtype=torch.long, device=self.device)
        self.sizes = [(int(img.shape[1]), int(img.shape[2])) for img in images]
        self.stacked: Optional[torch.Tensor] = None
        self.images: List[torch.Tensor] = []
        if len(set(self.sizes)) == 1:
            self.stacked = torch.stack(images).to(self.device)
        else:
            self.images = [img.to(self.device) for img in images]
        self.nbytes = sum(h * w * 3 for h, w in self.sizes)
        log(f'decoded {len(images)} images of {dataset.root} into memory on {self.device} '
            f'({self.nbytes / 2 ** 20:.0f} MiB)')

    def __len__(self) -> int:
        return len(self.sizes)

    @staticmethod
    def normalizer(transform: Any) -> Callable[..., torch.Tensor]:
        """What is left of the eval ``transform`` a split was ``prepare``d with: its normalisation, on a batch."""
        return _Normalize(*_split_eval_transform(transform)[1])

    def gather(self, indices: Sequence[int]) -> Tuple[Union[torch.Tensor, List[torch.Tensor]], torch.Tensor]:
        """The images (a (B, 3, H, W) tensor, or a list of (3, H_i, W_i)) and labels of ``indices``."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        if self.stacked is not None:
            images = self.stacked.index_select(0, index.to(self.device))
        else:
            images = [self.images[i] for i in indices]
        return images, self.targets.index_select(0, index.to(self.device))


class ResidentLoader:
    """Batches of a ``ResidentSplit`` in the order of ``indices`` (a sampler, re-iterated every epoch), augmented by
    ``transform`` with per-sample parameters (``draw_many``: ``BatchAugment.draw_many``, each sample's ``rng``
    seeded by (seed, epoch, index) of the split's dataset) or, without it, evaluated (``transform(images)``).

    ``prefetch``: training batches a thread gathers and augments ahead of the consumer (``tcnn.data.prefetch``);
    default ``default_prefetch`` of the split's device (2 on a GPU); evaluation batches are made when asked for.
    """

    def __init__(self, split: ResidentSplit, indices: Iterable[int], batch_size: int,
                 transform: Callable[..., torch.Tensor], draw_many: Optional[DrawMany] = None,
                 drop_last: bool = False, prefetch: Optional[int] = None):
        self.split = split
        self.indices = indices
        self.batch_size = batch_size
        self.transform = transform
        self.draw_many = draw_many
        self.drop_last = drop_last
        if prefetch is None:
            prefetch = default_prefetch(split.device) if draw_many is not None else 0
        self.prefetch = prefetch

    def __len__(self) -> int:
        n = len(self.indices)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        batches = self._index_batches(iter(self.indices))
        if self.prefetch > 0:
            return FinishedAhead(batches, self._finish, self.split.device, self.prefetch)
        return map(self._finish, batches)

    def _index_batches(self, indices: Iterator[int]) -> Iterator[List[int]]:
        while True:
            batch = [i for _, i in zip(range(self.batch_size), indices)]
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def _finish(self, batch: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        images, targets = self.split.gather(batch)
        if self.draw_many is None:
            return self.transform(images), targets
        dataset = self.split.dataset
        seed, epoch = dataset.augment_seed or 0, dataset.epoch
        params = self.draw_many([(random.Random(sample_seed(seed, epoch, i)), self.split.sizes[i]) for i in batch])
        return self.transform(images, params), targets
