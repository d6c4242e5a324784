"""What a ``Trainer`` (``tcnn.train.trainer``) is built from, as functions of the recipe: the CNN (created, or
converted in place into a verified T-CNN), the loss, and the loaders with their sampler.

The data order is a function of (seed, epoch) and the loaders' worker seeds of (seed, epoch, rank), never of the
global RNG: that is what makes a resume exact, at an epoch end and in the middle of an epoch.
"""
import dataclasses
import itertools
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ..convert.settings import ConversionSettings, gpsa_layers
from ..convert.stages import find_convertible_convs
from ..convert.transform import reparameterize_
from ..convert.verify import full_precision_matmul
from ..data.batch_augment import BatchAugment
from ..data.encoded import BatchFinisher, CollateAndFinish, DeviceLoader, EncodedDataset, collate_encoded
from ..data.resident import ResidentLoader, ResidentSplit
from ..errors import TcnnError
from ..files.sources import CLI_HINT, WeightsUnavailableError, create_cnn
from ..layers.gpsa import GPSA
from .distributed import DistContext, ignore_stop_signals
from .recipe import Recipe, auto_workers

__all__ = ['EpochSampler', 'Loaders', 'build_loaders', 'loader_seed', 'create_model', 'convert_in_place',
           'copy_gpsa_init', 'build_loss']


# ---------------------------------------------------------------------------------------------------- data

class EpochSampler(DistributedSampler):
    """``DistributedSampler`` (also for one process: the order is a function of (seed, epoch), which makes resume
    exact) that can start an epoch part-way: a mid-epoch resume skips the samples already trained on."""

    def __init__(self, dataset, num_replicas: int, rank: int, seed: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    """Seed of the loader's own generator (worker seeds) for one epoch and process: the global RNG, which the
    checkpoint holds, is not consumed by starting a loader, so a mid-epoch resume sees the same random draws."""
    return (seed * 1_000_003 + epoch * 1009 + rank) % 2 ** 63


@dataclasses.dataclass
class Loaders:
    """A run's loaders. ``sampler`` is None for a stream (timm's reader shards it); ``generator`` seeds the workers,
    re-seeded every epoch (``loader_seed``); ``workers`` is the loader worker count per process."""
    train: DataLoader
    val: Any  # a DataLoader, or [] on the ranks that do not validate a stream
    sampler: Optional[EpochSampler]
    generator: torch.Generator
    workers: int


def build_loaders(recipe: Recipe, train_set, val_set, streaming: bool, ctx: DistContext,
                  log: Callable[..., None], pipeline: str = 'pil', augment: Optional[BatchAugment] = None) -> Loaders:
    """The training and validation loaders of the run's two splits (their PIL transforms set already).

    Args:
        pipeline: ``pil``, ``device`` or ``resident`` (``tcnn.train.data.resolve_pipeline``): where the training
            images are decoded and augmented. Validation runs the split's eval transform on every pipeline; the
            resident one applies it once, when it decodes the split.
        augment: The batched pipelines' training transform (``tcnn.train.data.batched_augmentation``).
    """
    r = recipe
    workers = r.workers if r.workers is not None else auto_workers(ctx.local_world_size)
    pin = r.pin_memory and ctx.device.type == 'cuda'
    generator = torch.Generator()
    if streaming:
        return _stream_loaders(r, train_set, val_set, ctx, log, workers, pin, generator)
    sampler = EpochSampler(train_set, ctx.world_size, ctx.rank, r.seed)
    # Validation shards without padding (rank::world), so the summed metrics count every image once.
    val_indices = list(range(ctx.rank, len(val_set), ctx.world_size))
    if pipeline == 'resident':
        train = ResidentLoader(ResidentSplit(train_set, ctx.device, workers, log), sampler, r.batch_size, augment,
                               draw_many=augment.draw_many, drop_last=True)
        val = ResidentLoader(ResidentSplit(val_set, ctx.device, workers, log, prepare=val_set.transform),
                             val_indices, r.batch_size, ResidentSplit.normalizer(val_set.transform))
        return Loaders(train, val, sampler, generator, 0)
    val_loader = DataLoader(Subset(val_set, val_indices), batch_size=r.batch_size, shuffle=False, num_workers=workers,
                            pin_memory=pin, worker_init_fn=ignore_stop_signals)
    if pipeline == 'device':
        # file bytes and sampled parameters, finished (decoded, augmented) on the device: in this process on a GPU,
        # in the workers' collate_fn on the CPU (beside the step, as the PIL workers work)
        in_workers = ctx.device.type == 'cpu' and workers > 0
        finish = BatchFinisher(augment, ctx.device, train_set.report_bad, train=True)
        loader = DataLoader(EncodedDataset(train_set, augment.draw), batch_size=r.batch_size, sampler=sampler,
                            num_workers=workers, pin_memory=pin and not in_workers, drop_last=True,
                            generator=generator, worker_init_fn=ignore_stop_signals,
                            collate_fn=CollateAndFinish(finish) if in_workers else collate_encoded)
        return Loaders(DeviceLoader(loader, None if in_workers else finish), val_loader, sampler, generator, workers)
    # Non-persistent workers are seeded from the loader's generator, re-seeded every epoch: exact resume.
    train_loader = DataLoader(train_set, batch_size=r.batch_size, sampler=sampler, num_workers=workers,
                              pin_memory=pin, drop_last=True, generator=generator, worker_init_fn=ignore_stop_signals)
    return Loaders(train_loader, val_loader, sampler, generator, workers)


def _stream_loaders(r: Recipe, train_set, val_set, ctx: DistContext, log: Callable[..., None], workers: int,
                    pin: bool, generator: torch.Generator) -> Loaders:
    """Loaders of a stream: timm's reader gives each process and worker its shards (no sampler). Every worker
    needs a shard of its own (an idle one would end the epoch short), so workers are capped at the shards per
    process. Validation streams the whole split on rank 0, the other ranks contribute nothing to the summed
    metrics: a split shared between processes by shards cannot count every image exactly once."""
    per_process = train_set.shards // ctx.world_size
    if per_process == 0:
        raise TcnnError(f'split {train_set.split!r} of {r.data} has {train_set.shards} shard(s) for '
                        f'{ctx.world_size} processes: every process needs at least one; write more shards')
    if workers > per_process:
        log(f'note: {train_set.shards} training shards for {ctx.world_size} process(es): '
            f'{per_process} loader worker(s) per process instead of {workers} (each needs a shard)')
        workers = per_process
    train_set.set_workers(workers)
    train_loader = DataLoader(train_set, batch_size=r.batch_size, num_workers=workers, pin_memory=pin,
                              drop_last=True, generator=generator, worker_init_fn=ignore_stop_signals)
    val_workers = min(workers, max(1, val_set.shards))
    val_set.set_workers(val_workers)
    val_set.use_every_sample_in_this_process()
    val_loader = (DataLoader(val_set, batch_size=r.batch_size, num_workers=val_workers, pin_memory=pin,
                             worker_init_fn=ignore_stop_signals) if ctx.is_main else [])
    return Loaders(train_loader, val_loader, None, generator, workers)


# ---------------------------------------------------------------------------------------------------- model

def create_model(recipe: Recipe, num_classes: int) -> nn.Module:
    """The run's CNN (``tcnn.files.sources.create_cnn``) with the data's class count and the recipe's drop path."""
    kwargs = {}
    if recipe.drop_path_rate > 0:
        kwargs['drop_path_rate'] = recipe.drop_path_rate
    try:
        return create_cnn(recipe.model, pretrained=recipe.pretrained, weights=recipe.weights,
                          num_classes=num_classes, classes_of="the data's", **kwargs)
    except TypeError as e:  # a timm architecture that does not take one of the kwargs
        raise TcnnError(f'cannot create {recipe.model} with {kwargs}: {e}') from None
    except WeightsUnavailableError as e:  # the fix in tcnn train's terms: its flags, not Python arguments
        raise e.with_hint(CLI_HINT) from None


def convert_in_place(model: nn.Module, recipe: Recipe) -> List[torch.Tensor]:
    """Replace the k x k convs of ``model`` by verified GPSA layers, keeping every other parameter object (so an
    optimiser that holds them keeps its state). Returns the replaced conv parameters."""
    removed = [p for _, conv in find_convertible_convs(model, recipe.stages) for p in conv.parameters()]
    with full_precision_matmul():
        reparameterize_(model, ConversionSettings.of(recipe.to_dict()), verify=True,
                        input_size=(3, recipe.img_size, recipe.img_size))
    return removed


def copy_gpsa_init(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst``'s GPSA layers ``src``'s content/positional initialisation (everything but the loaded filter)."""
    src_layers = dict(gpsa_layers(src))
    with torch.no_grad():
        for name, layer in gpsa_layers(dst):
            for pname, param in layer.named_parameters():
                if pname not in GPSA.filter_params:
                    param.copy_(getattr(src_layers[name], pname))


# ---------------------------------------------------------------------------------------------------- loss

def build_loss(recipe: Recipe) -> Tuple[Optional[Mixup], nn.Module]:
    """DeiT's: mixup/cutmix with smoothed soft targets, else label smoothing, else plain cross-entropy. Returns the
    batch mixer (None without mixup/cutmix) and the criterion."""
    r = recipe
    if r.mixup > 0 or r.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=r.mixup, cutmix_alpha=r.cutmix, prob=r.mixup_prob,
                         switch_prob=r.mixup_switch_prob, mode=r.mixup_mode,
                         label_smoothing=r.smoothing, num_classes=r.num_classes)
        return mixup_fn, SoftTargetCrossEntropy()
    if r.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=r.smoothing)
    return None, nn.CrossEntropyLoss()
