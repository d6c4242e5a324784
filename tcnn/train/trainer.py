"""Fine-tune a T-CNN (T-CNN, arXiv:2106.05795, section 3) or its no-SA baseline: ``tcnn train``,
``python -m tcnn.train`` and ``torchrun --nproc_per_node=N -m tcnn.train`` take the same arguments.

A run, in order: resolve the recipe (``tcnn.train.recipe``) and, with ``--resume``, the checkpoint; set up
torch.distributed from the torchrun environment (``tcnn.train.distributed``); open the datasets (which fixes the number of
classes); create the CNN (``tcnn.files.weights.create_cnn``) and reparameterise it (``tcnn.reparameterize_``, verified in the
exact configuration) unless ``no_sa``, or later for ``reparam_epoch``; build the loaders with the model's
preprocessing; then train epoch by epoch (``tcnn.train.engine``). Only rank 0 writes ``OUTPUT/config.yaml``,
``OUTPUT/metrics.jsonl`` (one JSON object per epoch) and the checkpoints ``OUTPUT/last.pt`` / ``OUTPUT/best.pt``
(atomic, ``torch.load(weights_only=True)``-loadable; ``tcnn.load`` reads the model out of them).

SIGTERM/SIGUSR1 (cluster preemption) and Ctrl-C stop every rank at the next optimiser update; ``last.pt`` then holds
the state in the middle of the epoch and ``--resume`` continues exactly there. Exit codes: 0 done, 2 user error,
75 stopped by SIGTERM/SIGUSR1 (requeue), 130 Ctrl-C.
"""
import argparse
import contextlib
import itertools
import math
import os
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3, distribute_bn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ..atomic import atomic_copy, atomic_write_text
from .compiling import CompiledForward, compile_model, uses_cuda_graphs
from ..data import TrainingData, build_transforms, class_names, num_images, open_training_data, recipe_data_config
from ..convert.settings import ConversionSettings, gpsa_layers, gpsa_summary
from ..convert.stages import find_convertible_convs
from ..convert.transform import reparameterize_
from ..convert.verify import full_precision_matmul
from .dashboards import Dashboards, check_backends
from .distributed import (EXIT_INTERRUPTED, EXIT_PREEMPTED, DistContext, StopRequest, all_reduce_sum,
                          cleanup_distributed, gather, ignore_stop_signals, rng_state, seed_all, set_deterministic,
                          set_rng_state, setup_distributed)
from .engine import (DATA_BOUND_FRACTION, EpochPlan, EpochPosition, ForwardPass, NonFiniteLossError, UpdateStep,
                     autocast_fn, to_device, train_one_epoch, validate)
from ..errors import TcnnError, first_line
from ..layers.gpsa import GPSA
from ..files.weights import CLI_HINT, WeightsUnavailableError, create_cnn
from ..files.tcnn_file import model_from_dict
from .run_folder import (BEST_CHECKPOINT, CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, STATUS_FILE, make_checkpoint,
                         read_checkpoint, read_metrics, write_checkpoint, write_metrics, write_status)
from ..paths import check_output_dir, output_dir
from .optim import add_gpsa_groups, apply_group_settings, create_optimizer, create_scheduler
from .recipe import (apply_overrides, auto_workers, default_recipe, dump_recipe, mark_absolute_lrs, parse_set,
                     resolve_recipe, scaled_lrs, validate_recipe)
from .args import add_arguments, flag_overrides

__all__ = ['add_arguments', 'run', 'main', 'Trainer', 'CheckpointWriteError']

# Keys a resumed run cannot change: they define the model or the optimiser's parameter layout.
FROZEN_ON_RESUME = ('model', 'num_classes', 'no_sa', 'reparam_epoch', 'stages', 'qk_dim', 'locality_strength',
                    'gating_init', 'opt', 'drop_path_rate')
# If these are unchanged on resume, the saved scheduler state is loaded as is; otherwise it is rebuilt.
SCHEDULE_KEYS = ('sched', 'epochs', 'warmup_epochs', 'warmup_lr', 'min_lr', 'lr', 'gating_lr', 'lr_base_batch',
                 'scale_lr', 'absolute_lrs')
# Below this batch-scaling factor (global batch 64 for the paper's reference 1024) a small run barely moves.
SMALL_LR_FACTOR = 1 / 16


class CheckpointWriteError(TcnnError):
    """A checkpoint or the metrics file could not be written; the previous files are intact."""


# ---------------------------------------------------------------------------------------------------- recipe

def _default_output(args: argparse.Namespace, recipe: Dict[str, Any]) -> str:
    stem = os.path.splitext(os.path.basename(args.recipe))[0] if args.recipe else recipe['model']
    return os.path.join('runs', stem.replace(':', '_'))


def _fresh_recipe(args: argparse.Namespace, notes: List[str]) -> Dict[str, Any]:
    recipe = resolve_recipe(args.recipe, flag_overrides(args), args.set_items, notes)
    if recipe['output'] is None:
        recipe['output'] = _default_output(args, recipe)
    return recipe


def _resumed_recipe(args: argparse.Namespace, checkpoint: Dict[str, Any], path: str) -> Dict[str, Any]:
    recipe = default_recipe()
    apply_overrides(recipe, checkpoint['config'], f'the checkpoint {path}')
    overrides = dict(flag_overrides(args), **parse_set(args.set_items))
    changed = [k for k in FROZEN_ON_RESUME if k in overrides and overrides[k] != recipe[k]]
    if changed:
        raise TcnnError(f'cannot change {", ".join(changed)} when resuming (they define the model and the '
                        'optimiser); start a new run instead')
    apply_overrides(recipe, overrides)
    mark_absolute_lrs(recipe, overrides)
    if 'output' not in overrides:
        recipe['output'] = os.path.dirname(os.path.abspath(path))
    return validate_recipe(recipe)


def _resume_path(args: argparse.Namespace, notes: List[str]) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    """The checkpoint to resume from (None: a fresh run) and, for a fresh run, its recipe."""
    if args.resume is None:
        return None, _fresh_recipe(args, notes)
    if args.resume == 'auto':
        recipe = _fresh_recipe(args, notes)
        last = os.path.join(recipe['output'], LAST_CHECKPOINT)
        return (last, None) if os.path.isfile(last) else (None, recipe)
    if args.recipe:
        raise TcnnError('--recipe cannot be combined with --resume PATH: the run\'s recipe is in the checkpoint; '
                        'override single keys with flags or --set (--resume auto accepts --recipe for the first start)')
    path = args.resume
    if os.path.isdir(path):
        path = os.path.join(path, LAST_CHECKPOINT)
        if not os.path.isfile(path):
            raise TcnnError(f'{args.resume} holds no {LAST_CHECKPOINT}: resume from a tcnn train output folder, or '
                            'pass the checkpoint file itself')
    return path, None


def _resolve(args: argparse.Namespace) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], List[str]]:
    """The recipe, the checkpoint to resume (or None) and notes to log."""
    notes: List[str] = []
    path, recipe = _resume_path(args, notes)
    if path is None:
        return recipe, None, notes
    checkpoint = read_checkpoint(path)
    return _resumed_recipe(args, checkpoint, path), checkpoint, []


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


# ---------------------------------------------------------------------------------------------------- model

def _convert_in_place(model: nn.Module, recipe: Dict[str, Any]) -> List[torch.Tensor]:
    """Replace the k x k convs of ``model`` by verified GPSA layers, keeping every other parameter object (so an
    optimiser that holds them keeps its state). Returns the replaced conv parameters."""
    removed = [p for _, conv in find_convertible_convs(model, recipe['stages']) for p in conv.parameters()]
    with full_precision_matmul():
        reparameterize_(model, ConversionSettings.of(recipe), verify=True,
                        input_size=(3, recipe['img_size'], recipe['img_size']))
    return removed


def _create_model(recipe: Dict[str, Any], num_classes: int) -> nn.Module:
    kwargs = {}
    if recipe['drop_path_rate'] > 0:
        kwargs['drop_path_rate'] = recipe['drop_path_rate']
    try:
        return create_cnn(recipe['model'], pretrained=recipe['pretrained'], weights=recipe['weights'],
                          num_classes=num_classes, classes_of="the data's", **kwargs)
    except TypeError as e:  # a timm architecture that does not take one of the kwargs
        raise TcnnError(f'cannot create {recipe["model"]} with {kwargs}: {e}') from None
    except WeightsUnavailableError as e:  # the fix in tcnn train's terms: its flags, not Python arguments
        raise e.with_hint(CLI_HINT) from None


def _copy_gpsa_init(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst``'s GPSA layers ``src``'s content/positional initialisation (everything but the loaded filter)."""
    src_layers = dict(gpsa_layers(src))
    with torch.no_grad():
        for name, layer in gpsa_layers(dst):
            for pname, param in layer.named_parameters():
                if pname not in GPSA.filter_params:
                    param.copy_(getattr(src_layers[name], pname))


def _fmt(v: Optional[float], spec: str = '.4g') -> str:
    return 'n/a' if v is None else format(v, spec)


def _loader_seed(seed: int, epoch: int, rank: int) -> int:
    """Seed of the loader's own generator (worker seeds) for one epoch and process: the global RNG, which the
    checkpoint holds, is not consumed by starting a loader, so a mid-epoch resume sees the same random draws."""
    return (seed * 1_000_003 + epoch * 1009 + rank) % 2 ** 63


# ---------------------------------------------------------------------------------------------------- trainer

class Trainer:
    """State of one training run (model, optimiser, scheduler, EMA, loaders) and its epoch loop.

    The data comes opened (``tcnn.data.open_training_data``: it fixes the class count the model needs). Set-up
    order: precision, batch layout (global batch, updates per epoch), model (created, converted or restored), loaders
    (the model's preprocessing), optimisation, loss, wrappers (DDP, compile), then the checkpoint's state or a fresh
    start.
    """

    def __init__(self, recipe: Dict[str, Any], data: TrainingData, ctx: DistContext,
                 checkpoint: Optional[Dict[str, Any]] = None, stop: Optional[StopRequest] = None):
        if recipe['num_classes'] != data.num_classes:
            raise ValueError(f'recipe num_classes {recipe["num_classes"]} != the data\'s {data.num_classes}')
        self.recipe = recipe
        self.train_set, self.val_set, self.streaming = data.train, data.val, data.streaming
        self.ctx = ctx
        self.device = ctx.device
        self.stop = stop or StopRequest()
        self.output = recipe['output']
        self.log = print if ctx.is_main else (lambda *a, **k: None)
        self.metrics_path = os.path.join(self.output, METRICS_FILE)
        self.last_path = os.path.join(self.output, LAST_CHECKPOINT)
        self.best_path = os.path.join(self.output, BEST_CHECKPOINT)
        self.start_epoch = 0
        self.position = EpochPosition()
        self.best_top1 = -math.inf
        self.model_ema = None
        self.dashboards, self.dashboards_state = Dashboards(), {}  # opened by fit()
        self._setup_precision()
        self._setup_batch_layout()
        self._setup_model(checkpoint)
        self._setup_loaders()
        self._setup_optimisation()
        self._setup_loss()
        self._wrap()
        if checkpoint is not None:
            self._restore(checkpoint)
        else:
            if ctx.is_main:
                self._write_metrics([])  # a fresh run starts a fresh file
            # same model init on every rank (above); different augmentation streams per rank from here on
            seed_all(recipe['seed'] + ctx.rank)

    # -------------------------------------------------------------- set-up

    def _setup_precision(self) -> None:
        set_deterministic(self.recipe['deterministic'], self.device)  # before the first GPU kernel of the run
        amp = self.recipe['amp']
        if amp == 'auto':
            amp = 'bf16' if self.device.type == 'cuda' else 'none'
        if amp == 'fp16' and self.device.type != 'cuda':
            raise TcnnError('amp fp16 needs a GPU (use bf16 or none on CPU)')
        self.amp_dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'none': None}[amp]
        self.autocast = autocast_fn(self.device, self.amp_dtype)
        self.compile_mode = self.recipe['compile'] or None
        self.forward = ForwardPass(self.device, self._prepare, self.autocast, self.compile_mode)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp == 'fp16')
        cl = self.recipe['channels_last']
        self.channels_last = self.device.type == 'cuda' if cl is None else cl

    def _setup_batch_layout(self) -> None:
        r, ctx = self.recipe, self.ctx
        self.global_batch = r['batch_size'] * ctx.world_size * r['accum_steps']
        train_images = num_images(self.train_set)
        per_rank = train_images // ctx.world_size
        self.updates_per_epoch = per_rank // r['batch_size'] // r['accum_steps']
        if self.updates_per_epoch == 0:
            raise TcnnError(f'the training set ({train_images} images) is smaller than one update of '
                            f'{self.global_batch} images (batch_size x processes x accum_steps): lower --batch-size '
                            'or --accum-steps')

    def _setup_model(self, checkpoint: Optional[Dict[str, Any]]) -> None:
        r = self.recipe
        self.late = r['reparam_epoch'] is not None and r['reparam_epoch'] > 0 and not r['no_sa']
        seed_all(r['seed'])
        if checkpoint is not None:
            model = model_from_dict(checkpoint['model_file'], map_location='cpu')
            self.converted = bool(checkpoint['converted'])
            model.train()
            model.to(self.device)
        else:
            model = _create_model(r, r['num_classes']).to(self.device)
            self.converted = False
            if not r['no_sa'] and not self.late:
                _convert_in_place(model, r)
                self.converted = True
                self._log_conversion(model)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        if self.device.type == 'cuda':  # TF32 for training speed (conversions are verified in full fp32)
            torch.set_float32_matmul_precision('high')
            torch.backends.cudnn.allow_tf32 = True
        self.model = model

    def _setup_loaders(self) -> None:
        r, ctx = self.recipe, self.ctx
        # the preprocessing the run validates with, and the data's class names: what its checkpoints record
        self.data_config = recipe_data_config(r, self.model)
        self.label_names = class_names(self.train_set, r['num_classes'])
        self.train_set.transform, self.val_set.transform = build_transforms(r, self.data_config)
        self.train_set.augment_seed = r['seed']  # augmentation a function of (seed, epoch, image): exact resume
        self.workers = r['workers'] if r['workers'] is not None else auto_workers(ctx.local_world_size)
        pin = r['pin_memory'] and self.device.type == 'cuda'
        self.loader_generator = torch.Generator()
        if self.streaming:
            self._setup_stream_loaders(pin)
            return
        self.train_sampler = EpochSampler(self.train_set, ctx.world_size, ctx.rank, r['seed'])
        # Non-persistent workers are seeded from the loader's generator, re-seeded every epoch: exact resume.
        self.train_loader = DataLoader(self.train_set, batch_size=r['batch_size'], sampler=self.train_sampler,
                                       num_workers=self.workers, pin_memory=pin, drop_last=True,
                                       generator=self.loader_generator, worker_init_fn=ignore_stop_signals)
        # Validation shards without padding (rank::world), so the summed metrics count every image once.
        val_shard = Subset(self.val_set, list(range(ctx.rank, len(self.val_set), ctx.world_size)))
        self.val_loader = DataLoader(val_shard, batch_size=r['batch_size'], shuffle=False, num_workers=self.workers,
                                     pin_memory=pin, worker_init_fn=ignore_stop_signals)

    def _setup_stream_loaders(self, pin: bool) -> None:
        """Loaders of a stream: timm's reader gives each process and worker its shards (no sampler). Every worker
        needs a shard of its own (an idle one would end the epoch short), so workers are capped at the shards per
        process. Validation streams the whole split on rank 0, the other ranks contribute nothing to the summed
        metrics: a split shared between processes by shards cannot count every image exactly once."""
        r, ctx = self.recipe, self.ctx
        self.train_sampler = None
        per_process = self.train_set.shards // ctx.world_size
        if per_process == 0:
            raise TcnnError(f'split {self.train_set.split!r} of {r["data"]} has {self.train_set.shards} shard(s) for '
                            f'{ctx.world_size} processes: every process needs at least one; write more shards')
        if self.workers > per_process:
            self.log(f'note: {self.train_set.shards} training shards for {ctx.world_size} process(es): '
                     f'{per_process} loader worker(s) per process instead of {self.workers} (each needs a shard)')
            self.workers = per_process
        self.train_set.set_workers(self.workers)
        self.train_loader = DataLoader(self.train_set, batch_size=r['batch_size'], num_workers=self.workers,
                                       pin_memory=pin, drop_last=True, generator=self.loader_generator,
                                       worker_init_fn=ignore_stop_signals)
        val_workers = min(self.workers, max(1, self.val_set.shards))
        self.val_set.set_workers(val_workers)
        self.val_set.use_every_sample_in_this_process()
        self.val_loader = (DataLoader(self.val_set, batch_size=r['batch_size'], num_workers=val_workers,
                                      pin_memory=pin, worker_init_fn=ignore_stop_signals) if ctx.is_main else [])

    def _log_conversion(self, model: nn.Module) -> None:
        layers = model.tcnn_config['layers']
        self.log(f'reparameterised {len(layers)} convs of {self.recipe["model"]} into GPSA layers '
                 f'({", ".join(layers)}); verified {model.tcnn_report}')

    def _setup_optimisation(self) -> None:
        r = self.recipe
        self.lrs = scaled_lrs(r, self.global_batch)
        # a resumed late-reparameterisation run that is converted already gets the layout the conversion produced
        self.optimizer = create_optimizer(self.model, r, self.lrs['lr'], self.lrs['gating_lr'],
                                          gpsa_separate=self.late and self.converted)
        self.scheduler = create_scheduler(self.optimizer, r, self.updates_per_epoch, self.lrs['warmup_lr'],
                                          self.lrs['min_lr'])
        self.num_updates = 0
        if r['model_ema']:
            self.model_ema = ModelEmaV3(self.model, decay=r['model_ema_decay'])
        # timm's rule: with an EMA, the best checkpoint is the epoch whose EMA validates best
        self.best_metric = 'ema_val_top1' if self.model_ema is not None else 'val_top1'

    def _setup_loss(self) -> None:
        """DeiT's: mixup/cutmix with smoothed soft targets, else label smoothing, else plain cross-entropy."""
        r = self.recipe
        self.mixup_fn = None
        if r['mixup'] > 0 or r['cutmix'] > 0:
            self.mixup_fn = Mixup(mixup_alpha=r['mixup'], cutmix_alpha=r['cutmix'], prob=r['mixup_prob'],
                                  switch_prob=r['mixup_switch_prob'], mode=r['mixup_mode'],
                                  label_smoothing=r['smoothing'], num_classes=r['num_classes'])
            self.criterion = SoftTargetCrossEntropy()
        elif r['smoothing'] > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=r['smoothing'])
        else:
            self.criterion = nn.CrossEntropyLoss()

    def _prepare(self, images: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A CPU batch on the device, in the training memory format, mixed up when the recipe says so."""
        images = to_device(images, self.device, self.channels_last)
        labels = labels.to(self.device, non_blocking=True)
        return self.mixup_fn(images, labels) if self.mixup_fn is not None else (images, labels)

    def _wrap(self) -> None:
        """DDP and torch.compile around the raw model (again after a late reparameterisation), and the compiled
        evaluation forwards of the model and its EMA.

        Validation compiles the raw model, not the DDP wrapper: it needs no gradient synchronisation, and DDP's
        buffer broadcast at every forward is a collective that processes with different numbers of validation
        batches would not all join. Checkpoints keep saving ``self.model`` (no ``_orig_mod.`` prefixes).
        """
        model = self.model
        if self.ctx.distributed:
            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == 'cuda' else None)
        self.eval_model, self.eval_ema = self.model, self.model_ema.module if self.model_ema is not None else None
        if self.compile_mode:
            model = compile_model(model, self.compile_mode)
            batch = self.recipe['batch_size']
            self.eval_model = CompiledForward(self.model, self.compile_mode, batch)
            if self.eval_ema is not None:
                self.eval_ema = CompiledForward(self.eval_ema, self.compile_mode, batch)
        self.train_model = model

    def _update_step(self) -> UpdateStep:
        r = self.recipe
        return UpdateStep(self.optimizer, self.scheduler, self.scaler, r['clip_grad'], r['accum_steps'], self.model_ema,
                          self.model, keep_grads=uses_cuda_graphs(self.compile_mode) and r['accum_steps'] > 1)

    def _restore(self, ckpt: Dict[str, Any]) -> None:
        r = self.recipe
        self.optimizer.load_state_dict(ckpt['optimizer'])
        # load_state_dict brings back the saved group settings; the (possibly overridden) recipe decides them
        apply_group_settings(self.optimizer, self.lrs['lr'], self.lrs['gating_lr'], r['weight_decay'])
        self.start_epoch = ckpt['epoch'] + 1
        same_layout = (ckpt.get('global_batch') == self.global_batch and
                       ckpt.get('updates_per_epoch') == self.updates_per_epoch)
        self.position = self._restored_position(ckpt, same_layout)
        self.num_updates = self.start_epoch * self.updates_per_epoch + self.position.updates
        old = ckpt['config']
        if all(old.get(k) == r[k] for k in SCHEDULE_KEYS) and same_layout:
            self.scheduler.load_state_dict(ckpt['scheduler'])
        else:
            self.log('note: the schedule or the global batch changed since the checkpoint; the learning rate follows '
                     'the new settings from the resumed position on')
        self.scheduler.step_update(self.num_updates)
        if ckpt.get('scaler'):
            self.scaler.load_state_dict(ckpt['scaler'])
        if self.model_ema is not None and ckpt.get('ema') is not None:
            self.model_ema.module.load_state_dict(ckpt['ema'])
        self.best_top1 = ckpt['best_top1'] if ckpt.get('best_top1') is not None else -math.inf
        self.dashboards_state = ckpt.get('dashboards') or {}
        if ckpt.get('best_metric', 'val_top1') != self.best_metric:
            self.log(f'note: the checkpoint chose best.pt on {ckpt.get("best_metric", "val_top1")}, this run chooses '
                     f'on {self.best_metric} (model_ema changed): the next epoch starts a new best')
            self.best_top1 = -math.inf
        if self.ctx.is_main:  # drop epochs the checkpoint does not hold
            self._write_metrics([m for m in self._read_metrics() if m['epoch'] < self.start_epoch])
        rng = ckpt.get('rng') or []
        if len(rng) == self.ctx.world_size:
            set_rng_state(rng[self.ctx.rank])
        else:
            self.log(f'note: the checkpoint holds RNG states of {len(rng)} processes, this run has '
                     f'{self.ctx.world_size}: data order is kept, augmentation draws are re-seeded')
            seed_all(r['seed'] + self.ctx.rank + 1000 * self.start_epoch)
        where = (f'in epoch {self.start_epoch + 1}/{r["epochs"]} after {self.position.updates} of '
                 f'{self.updates_per_epoch} updates' if self.position.updates else
                 f'after epoch {self.start_epoch}/{r["epochs"]}')
        self.log(f'resuming {where} (update {self.num_updates})')

    def _restored_position(self, ckpt: Dict[str, Any], same_layout: bool) -> EpochPosition:
        """Where a mid-epoch checkpoint stopped; an epoch-end checkpoint starts the next epoch afresh."""
        partial = ckpt.get('partial')
        if not partial:
            return EpochPosition()
        self.start_epoch = partial['epoch']
        positions = partial['positions']
        if same_layout and len(positions) == self.ctx.world_size:
            return EpochPosition.from_state_dict(positions[self.ctx.rank])
        self.log(f'note: the checkpoint stopped inside epoch {partial["epoch"] + 1}, but the process count or the '
                 'batch changed: that epoch restarts from its beginning')
        return EpochPosition()

    # -------------------------------------------------------------- late reparameterisation

    def _late_reparameterize(self) -> None:
        """Table 3: convert now and continue with the same optimiser; the GPSA parameters join it as new groups and
        the scheduler is rebuilt over all groups at the current position."""
        r = self.recipe
        removed = _convert_in_place(self.model, r)
        self.converted = True
        self._log_conversion(self.model)
        add_gpsa_groups(self.optimizer, self.model, removed, r['weight_decay'], self.lrs['lr'], self.lrs['gating_lr'])
        self.scheduler = create_scheduler(self.optimizer, r, self.updates_per_epoch, self.lrs['warmup_lr'],
                                          self.lrs['min_lr'])
        self.scheduler.step_update(self.num_updates)
        self._wrap()  # DDP broadcasts rank 0's new GPSA parameters to the other ranks here
        if self.model_ema is not None:
            # the EMA keeps its averaged CNN weights; its GPSA layers start from the model's (synchronised) init
            _convert_in_place(self.model_ema.module, r)
            _copy_gpsa_init(self.model, self.model_ema.module)

    # -------------------------------------------------------------- checkpoints and metrics

    def _read_metrics(self) -> List[Dict[str, Any]]:
        return read_metrics(self.metrics_path) if os.path.isfile(self.metrics_path) else []

    def _write_metrics(self, rows: Sequence[Dict[str, Any]]) -> None:
        self._guarded_write(self.metrics_path, lambda: write_metrics(self.metrics_path, rows))

    def _checkpoint(self, completed_epoch: int) -> Dict[str, Any]:
        return make_checkpoint(
            self.model, self.data_config, label_names=self.label_names,
            converted=self.converted,
            ema=self.model_ema.module.state_dict() if self.model_ema is not None else None,
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            epoch=completed_epoch,
            num_updates=self.num_updates,
            updates_per_epoch=self.updates_per_epoch,
            global_batch=self.global_batch,
            world_size=self.ctx.world_size,
            config=dict(self.recipe),
            best_top1=self.best_top1 if math.isfinite(self.best_top1) else None,
            dashboards=self.dashboards.state_dict(),
            best_metric=self.best_metric,
        )

    def _guarded_write(self, path: str, write: Callable[[], Any]) -> None:
        """Run one atomic write; a failure (full disk, read-only folder, quota) becomes one line naming the path.
        The atomic write leaves the previous file in place."""
        try:
            write()
        except Exception as e:  # noqa: BLE001 - torch.save reports a full disk as RuntimeError, not OSError
            reason = first_line(e)
            kept = (f'the previous {os.path.basename(self.last_path)} is intact' if os.path.isfile(self.last_path)
                    else 'no checkpoint was written yet')
            raise CheckpointWriteError(f'cannot write {path} ({type(e).__name__}: {reason}); {kept}; free disk space '
                                       f'or fix the permissions of {self.output}, then --resume {self.output}') from e

    def _all_ok(self, error: Optional[BaseException]) -> None:
        """Rank 0 writes alone; the other ranks learn of a failed write here instead of hanging at the next
        collective."""
        failed = all_reduce_sum(torch.tensor([0.0 if error is None else 1.0], device=self.device)).item() > 0
        if error is not None:
            raise error
        if failed:
            raise CheckpointWriteError('rank 0 could not write the checkpoint; stopping')

    def _save(self, epoch: int, row: Optional[Dict[str, Any]], is_best: bool,
              position: Optional[EpochPosition] = None) -> None:
        """Epoch end (``row``, ``epoch`` completed) or a stop inside ``epoch`` (``position``)."""
        states = gather({'rng': rng_state(), 'position': position.state_dict() if position else None})
        error = None
        if self.ctx.is_main:
            self.dashboards.flush()  # whatever the checkpoint covers is on disk before it
            try:
                ckpt = self._checkpoint(epoch - 1 if position is not None else epoch)
                ckpt['rng'] = [s['rng'] for s in states]
                if position is not None:
                    ckpt['partial'] = {'epoch': epoch, 'positions': [s['position'] for s in states]}
                if is_best:
                    self._guarded_write(self.best_path, lambda: write_checkpoint(ckpt, self.best_path))
                    self._guarded_write(self.last_path, lambda: atomic_copy(self.best_path, self.last_path))
                else:
                    self._guarded_write(self.last_path, lambda: write_checkpoint(ckpt, self.last_path))
                if row is not None:
                    self._write_metrics(self._read_metrics() + [row])
            except CheckpointWriteError as e:
                error = e
        self._all_ok(error)

    # -------------------------------------------------------------- loop

    def describe(self) -> None:
        r, ctx = self.recipe, self.ctx
        kind = 'no-SA baseline' if r['no_sa'] else 'T-CNN'
        if self.late:
            kind += f', reparameterised after {r["reparam_epoch"]} CNN epochs'
        self.log(f'model {r["model"]} ({kind}), '
                 f'{sum(p.numel() for p in self.model.parameters()) / 1e6:.2f}M params, {r["num_classes"]} classes, '
                 f'device {self.device}, {ctx.world_size} process(es)'
                 f'{f" ({ctx.backend} process group)" if ctx.backend else ""}, amp {self.amp_dtype or "none"}'
                 f'{", deterministic" if r["deterministic"] else ""}')
        val_images = num_images(self.val_set) or 'unknown'
        self.log(f'data {r["data"]}: {num_images(self.train_set)} train / {val_images} val images, '
                 f'{r["img_size"]} px, {self.workers} loader workers per process; global batch {self.global_batch} = '
                 f'{r["batch_size"]} x {ctx.world_size} process(es) x {r["accum_steps"]} accum, '
                 f'{self.updates_per_epoch} updates/epoch')
        self.log(f'lr {self.lrs["lr"]:.3g} ({self._lr_rule("lr")}), gating lr {self.lrs["gating_lr"]:.3g} '
                 f'({self._lr_rule("gating_lr")}); {r["warmup_epochs"]} warm-up epochs from '
                 f'{self.lrs["warmup_lr"]:.3g}, {r["sched"]} decay to {self.lrs["min_lr"]:.3g}')
        for warning in self.small_run_warnings():
            self.log(f'warning: {warning}')
        if self.compile_mode:
            self.log(f'torch.compile mode {self.compile_mode}: the first epoch compiles the training step and the '
                     'validation forward')
        if self.best_metric == 'ema_val_top1':
            self.log('best.pt: the epoch with the best EMA validation top-1 (ema_val_top1); it holds the model and '
                     'its EMA: read the EMA with tcnn.load(PATH, ema=True) or tcnn eval/inspect --use-ema')
        self.log(f'output {self.output}')

    def _lr_rule(self, key: str) -> str:
        """How the run got the learning rate ``key``: as the user gave it, or the recipe's value batch-scaled."""
        r = self.recipe
        if key in r['absolute_lrs']:
            return 'as given'
        if not r['scale_lr']:
            return 'recipe value, scale_lr off'
        return f'recipe value x {self.lrs["factor"]:.4g} = global batch {self.global_batch} / {r["lr_base_batch"]}'

    def small_run_warnings(self) -> List[str]:
        """What makes a small run's first try learn nothing, while the paper's recipe stays exact for ImageNet; and
        a gating lr that lost its ratio to the lr because only one of them was given (the other one scaled)."""
        r, out = self.recipe, []
        scaled = [k for k in ('lr', 'gating_lr') if k not in r['absolute_lrs']]
        if r['scale_lr'] and len(scaled) == 2 and self.lrs['factor'] < SMALL_LR_FACTOR:
            out.append(f'the batch rule scales every learning rate by {self.global_batch}/{r["lr_base_batch"]} = '
                       f'{self.lrs["factor"]:.3g} (lr {self.lrs["lr"]:.2g}, gating lr {self.lrs["gating_lr"]:.2g}): '
                       'a small run may barely move; consider --set scale_lr=false or a larger --lr')
        if r['scale_lr'] and len(scaled) == 1 and self.lrs['factor'] != 1:
            ratio, planned = self.lrs['gating_lr'] / self.lrs['lr'], r['gating_lr'] / r['lr']
            given = 'lr' if scaled == ['gating_lr'] else 'gating_lr'
            out.append(f'gating lr / lr = {ratio:.3g}, not the recipe\'s {planned:.4g}: --{given.replace("_", "-")} '
                       f'is used as given while the batch rule scales {scaled[0]}; give --{scaled[0].replace("_", "-")} '
                       'too to choose both')
        return out

    def _train_epoch(self, epoch: int, position: EpochPosition) -> Tuple[EpochPosition, Dict[str, Any]]:
        r = self.recipe
        self.loader_generator.manual_seed(_loader_seed(r['seed'], epoch, self.ctx.rank))
        if self.train_sampler is not None:
            self.train_sampler.set_epoch(epoch, start=position.updates * r['accum_steps'] * r['batch_size'])
        self.train_set.set_epoch(epoch)
        try:
            plan = EpochPlan(epoch, self.updates_per_epoch, self.num_updates, position,
                             should_stop=lambda: self.stop.requested, progress=r['progress'] and self.ctx.is_main,
                             desc=f'epoch {epoch + 1}/{r["epochs"]}', log_every=r['log_every'],
                             on_update=self.dashboards.log_update if self.dashboards.enabled else None)
            return train_one_epoch(self.train_model, self.train_loader, self.criterion, self._update_step(), plan=plan,
                                   forward=self.forward)
        except NonFiniteLossError as e:
            kept = (f'the last good checkpoint {self.last_path} (epoch {epoch}/{r["epochs"]}) is kept'
                    if os.path.isfile(self.last_path) else 'no checkpoint was written yet')
            raise NonFiniteLossError(f'{e}; {kept}; lower --lr/--gating-lr or try --amp none') from None

    def _sync_batch_norm(self) -> None:
        """Average the batch-norm running statistics of the processes, the EMA's too (timm's ``distribute_bn``,
        reduce), before validating and saving: each process updated them from its own batches, so without this the
        summed validation would judge N different models while the checkpoint keeps rank 0's. After it every rank
        holds the model that is validated and saved."""
        if not self.ctx.distributed:
            return
        distribute_bn(self.model, self.ctx.world_size, reduce=True)
        if self.model_ema is not None:
            distribute_bn(self.model_ema.module, self.ctx.world_size, reduce=True)

    def _validate(self, epoch: int, stats: Dict[str, Any], trained_at: float) -> Dict[str, Any]:
        """The epoch's ``metrics.jsonl`` row; ``trained_at`` is when its training loop ended (``perf_counter``)."""
        val = validate(self.eval_model, self.val_loader, device=self.device, autocast=self.autocast,
                       channels_last=self.channels_last)
        row = {'epoch': epoch, 'lr': stats['lr'], 'gating_lr': stats['gating_lr'],
               'train_loss': stats['train_loss'], 'train_top1': stats['train_top1'], **val,
               'img_per_s': stats['img_per_s'], 'step_img_per_s': stats['step_img_per_s'],
               'data_wait': stats['data_wait'], 'train_images': stats['train_images'], 'epoch_time_s': None,
               'gpsa': gpsa_summary(self.model)}
        if self.model_ema is not None:
            row.update(validate(self.eval_ema, self.val_loader, device=self.device, autocast=self.autocast,
                                channels_last=self.channels_last, prefix='ema_val'))
        # the epoch's wall time: its training loop (waiting for data and computing, over every resumed part) and
        # what followed it (batch-norm averaging, validation)
        row['epoch_time_s'] = stats['train_time_s'] + time.perf_counter() - trained_at
        row['bad_images'] = self._bad_images()
        return row

    def _bad_images(self) -> List[str]:
        """Images skipped (``skip_bad_images``) since the last call, over all processes, each logged once."""
        local = self.train_set.bad_images() + self.val_set.bad_images()
        paths = sorted(set(p for rank_paths in gather(local) for p in rank_paths))
        for path in paths:
            self.log(f'warning: skipped unreadable image {path}')
        return paths

    def fit(self) -> int:
        """Train the remaining epochs; returns the exit code (0, or the stop request's after its checkpoint)."""
        r = self.recipe
        if self.start_epoch >= r['epochs']:
            self.log(f'nothing to do: the run already has {r["epochs"]} epochs (raise --epochs to continue it)')
            return 0
        if self.ctx.is_main:
            self.dashboards = Dashboards(r['log'], self.output, r, self.num_updates, self.dashboards_state,
                                         self.val_set, self.data_config)
        position = self.position
        for epoch in range(self.start_epoch, r['epochs']):
            if self.late and not self.converted and epoch >= r['reparam_epoch']:
                self._late_reparameterize()
            position, stats = self._train_epoch(epoch, position)
            trained_at = time.perf_counter()
            self.num_updates = epoch * self.updates_per_epoch + position.updates
            if not stats and self.streaming:  # a stream cannot restart mid-epoch: last.pt stays at the epoch start
                return self._stopped_stream(epoch, position)
            if not stats:  # stopped inside the epoch at an update boundary
                self._save(epoch, None, False, position=position)
                return self._stopped(f'in epoch {epoch + 1} after update {position.updates}/{self.updates_per_epoch}')
            position = EpochPosition()
            self._sync_batch_norm()
            row = self._validate(epoch, stats, trained_at)
            self.dashboards.log_epoch(row, self.model, self.num_updates)
            is_best = row[self.best_metric] > self.best_top1
            self.best_top1 = max(self.best_top1, row[self.best_metric])
            row.update(best_metric=self.best_metric, is_best=is_best)
            self._save(epoch, row, is_best)
            self.log(self._summary(row, r['epochs']))
            if self._stop_agreed() and epoch + 1 < r['epochs']:
                return self._stopped(f'after epoch {epoch + 1}')
        which = 'EMA val' if self.best_metric == 'ema_val_top1' else 'val'
        self.log(f'done: best {which} top-1 {self.best_top1:.2f}%; checkpoints {self.last_path}, {self.best_path}')
        return 0

    def _stop_agreed(self) -> bool:
        """Whether any process was asked to stop (a signal may reach only some of them)."""
        flag = torch.tensor([1.0 if self.stop.requested else 0.0], device=self.device)
        return all_reduce_sum(flag).item() > 0

    def _stopped_stream(self, epoch: int, position: EpochPosition) -> int:
        """A stop inside an epoch of a stream: no mid-epoch checkpoint (the stream cannot be resumed at a sample),
        so ``last.pt`` keeps the end of the previous epoch and ``--resume`` redoes this epoch from its start."""
        cause = self.stop.signal_name or 'a signal to another process'
        kept = (f'{self.last_path} holds the end of epoch {epoch}; continue with --resume {self.output} (epoch '
                f'{epoch + 1} is redone from its start: {self.recipe["data"]} is a stream)' if epoch > 0 else
                'no epoch was completed, so there is no checkpoint; --resume auto starts the run again')
        self.log(f'stopped by {cause} in epoch {epoch + 1} after update {position.updates}/{self.updates_per_epoch}: '
                 f'{kept} (exit code {self.stop.exit_code})')
        return self.stop.exit_code

    def _stopped(self, where: str) -> int:
        cause = self.stop.signal_name or 'a signal to another process'
        self.log(f'stopped by {cause} {where}: {self.last_path} holds the state; continue with --resume '
                 f'{self.output} (exit code {self.stop.exit_code})')
        return self.stop.exit_code

    @staticmethod
    def _summary(row: Dict[str, Any], epochs: int) -> str:
        gates = [v['gate_mean'] for v in row['gpsa'].values()]
        spans = [v['span_mean'] for v in row['gpsa'].values()]
        gpsa = (f', gate {np.mean(gates):.3f}, span 1/alpha {np.mean(spans):.3f} tokens^2' if gates else '')
        line = (f'epoch {row["epoch"] + 1}/{epochs}: train loss {row["train_loss"]:.4f}, val loss '
                f'{row["val_loss"]:.4f}, top-1 {row["val_top1"]:.2f}%, top-5 {row["val_top5"]:.2f}%, lr '
                f'{_fmt(row["lr"], ".3g")}, gating lr {_fmt(row["gating_lr"], ".3g")}, '
                f'{_fmt(row["img_per_s"], ".1f")} img/s (step alone {_fmt(row["step_img_per_s"], ".1f")}, waiting for '
                f'data {100 * (row["data_wait"] or 0):.0f}% of the time), {row["epoch_time_s"]:.1f} s{gpsa}')
        if row.get('ema_val_top1') is not None:
            line += f'; EMA val loss {row["ema_val_loss"]:.4f}, top-1 {row["ema_val_top1"]:.2f}%'
        if row.get('is_best'):
            line += f'; best {row["best_metric"]} so far: best.pt'
        if (row['data_wait'] or 0) >= DATA_BOUND_FRACTION:
            line += '; data-bound: raise --workers or lighten the augmentation'
        return line


# ---------------------------------------------------------------------------------------------------- entry points

class RunStatus:
    """Rank 0's ``OUTPUT/status.json`` (``tcnn.train.run_folder.write_status``): where the run stands, so that a cluster script can
    decide to requeue (``preempted``) or stop (``finished``, ``failed``), whatever exit code torchrun or srun made of
    the run's own (torchrun turns a worker's 75 into 1 when it was signalled itself)."""

    STATE_OF_EXIT = {0: 'finished', EXIT_PREEMPTED: 'preempted', EXIT_INTERRUPTED: 'interrupted'}

    def __init__(self, output: str, active: bool, process_group: Optional[str] = None):
        self.path = os.path.join(output, STATUS_FILE)
        self.active = active
        self.process_group = process_group

    def write(self, state: str, trainer: Optional[Trainer], **info: Any) -> None:
        if not self.active:
            return
        info = dict(process_group=self.process_group, **info)
        if trainer is not None:
            info = dict(epochs=trainer.recipe['epochs'],
                        completed_epochs=trainer.num_updates // trainer.updates_per_epoch,
                        num_updates=trainer.num_updates, **info)
        if trainer is None:
            write_status(self.path, state, **info)
        else:
            trainer._guarded_write(self.path, lambda: write_status(self.path, state, **info))

    def write_if_started(self, state: str, trainer: Optional[Trainer], **info: Any) -> None:
        """After an error or Ctrl-C: only where a status exists (this run's, or a previous attempt's that a script
        would otherwise act on), and without hiding the error if the write fails too."""
        if self.active and os.path.isfile(self.path):
            with contextlib.suppress(Exception):
                self.write(state, trainer, **info)


def run(args: argparse.Namespace) -> int:
    """Run ``tcnn train`` with parsed arguments; user mistakes raise ``TcnnError``."""
    recipe, checkpoint, notes = _resolve(args)
    if args.print_config:
        print(dump_recipe(recipe), end='')
        return 0
    output = recipe['output']
    if checkpoint is None and os.path.isfile(os.path.join(output, LAST_CHECKPOINT)):
        raise TcnnError(f'{output} already holds a run ({LAST_CHECKPOINT}): continue it with --resume {output} '
                        f'(or --resume auto) or choose another --output')
    check_output_dir(output, '--output')
    check_backends(recipe['log'])
    ctx = setup_distributed(recipe['device'])
    status = RunStatus(output, ctx.is_main, ctx.backend)
    trainer, code = None, 1
    try:
        with StopRequest() as stop, (output_dir(output) if ctx.is_main else contextlib.nullcontext()):
            for note in notes if ctx.is_main else ():
                print(f'note: {note}')
            data = open_training_data(recipe, resumed=checkpoint is not None)
            recipe['num_classes'] = data.num_classes  # a fresh run may leave it to the data
            trainer = Trainer(recipe, data, ctx, checkpoint, stop)
            del checkpoint
            if ctx.is_main:
                trainer._guarded_write(os.path.join(output, CONFIG_FILE),
                                       lambda: atomic_write_text(os.path.join(output, CONFIG_FILE),
                                                                 dump_recipe(recipe)))
            status.write('running', trainer)
            trainer.describe()
            code = trainer.fit()
            status.write(RunStatus.STATE_OF_EXIT.get(code, 'failed'), trainer, exit_code=code)
            return code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        status.write_if_started('interrupted', trainer, exit_code=code)
        if ctx.is_main:
            last = os.path.join(output, LAST_CHECKPOINT)
            where = (f'{last} holds the last checkpoint; continue with --resume {output}'
                     if os.path.isfile(last) else 'no checkpoint was written')
            print(f'interrupted: {where}', file=sys.stderr)
        return code
    except BaseException as e:
        status.write_if_started('failed', trainer, exit_code=2 if isinstance(e, TcnnError) else 1,
                                message=first_line(e))
        raise
    finally:
        if trainer is not None:
            trainer.dashboards.close(code)
        cleanup_distributed()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tcnn.train`` / ``torchrun -m tcnn.train``: errors print as one line (``--debug``: traceback)."""
    parser = argparse.ArgumentParser(prog='python -m tcnn.train', description=__doc__.split('\n\n')[0])
    parser.add_argument('--debug', action='store_true', help='show tracebacks of errors')
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except TcnnError as e:
        if args.debug:
            raise
        if int(os.environ.get('RANK', '0')) == 0:  # the other ranks fail the same way; one line is enough
            print(f'tcnn train: error: {e}', file=sys.stderr)
        return 2

