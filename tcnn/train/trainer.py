"""The ``Trainer`` of ``tcnn train``: the state of one run (model, optimiser, scheduler, EMA, loaders) and its epoch
loop (T-CNN, arXiv:2106.05795, section 3; late reparameterisation: Table 3).

``tcnn.train.launch`` builds it and calls ``fit``; the pieces it is built from are functions of the recipe
(``tcnn.train.builders``), the loops are ``tcnn.train.engine``'s, and rank 0 writes the run folder through
``tcnn.files.run_folder.RunFolder``.
"""
import dataclasses
import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from timm.utils import ModelEmaV3, distribute_bn
from torch.nn.parallel import DistributedDataParallel

from ..convert.settings import gpsa_summary
from ..data.readers import class_names, num_images
from ..errors import TcnnError
from ..files.run_folder import CheckpointWriteError, RunFolder, make_checkpoint
from ..files.tcnn_file import model_from_dict
from ..runtime.compiling import CompiledForward, compile_model, uses_cuda_graphs
from ..runtime.precision import amp_dtype
from .builders import build_loaders, build_loss, convert_in_place, copy_gpsa_init, create_model, loader_seed
from .dashboards import Dashboards
from .data import TrainingData, batched_augmentation, build_transforms, recipe_data_config, resolve_pipeline
from .distributed import (DistContext, StopRequest, all_reduce_sum, gather, rng_state, seed_all, set_deterministic,
                          set_rng_state)
from .engine import (EpochPlan, EpochPosition, ForwardPass, NonFiniteLossError, UpdateStep, autocast_fn, to_device,
                     train_one_epoch, validate)
from .optim import add_gpsa_groups, apply_group_settings, create_optimizer, create_scheduler
from .recipe import Recipe, scaled_lrs
from .resume import SCHEDULE_KEYS
from .report import epoch_summary, setup_lines

__all__ = ['Trainer']


class Trainer:
    """State of one training run (model, optimiser, scheduler, EMA, loaders) and its epoch loop.

    The data comes opened (``tcnn.train.data.open_training_data``: it fixes the class count the model needs). Set-up
    order: precision, batch layout (global batch, updates per epoch), model (created, converted or restored), loaders
    (the model's preprocessing), optimisation, loss, wrappers (DDP, compile), then the checkpoint's state or a fresh
    start.
    """

    def __init__(self, recipe: Recipe, data: TrainingData, ctx: DistContext,
                 checkpoint: Optional[Dict[str, Any]] = None, stop: Optional[StopRequest] = None):
        if recipe.num_classes != data.num_classes:
            raise ValueError(f'recipe num_classes {recipe.num_classes} != the data\'s {data.num_classes}')
        self.recipe = recipe
        self.train_set, self.val_set, self.streaming = data.train, data.val, data.streaming
        self.ctx = ctx
        self.device = ctx.device
        self.stop = stop or StopRequest()
        self.output = recipe.output
        self.log = print if ctx.is_main else (lambda *a, **k: None)
        self.folder = RunFolder(self.output)  # written by rank 0 only
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
                self.folder.write_metrics([])  # a fresh run starts a fresh file
            # same model init on every rank (above); different augmentation streams per rank from here on
            seed_all(recipe.seed + ctx.rank)

    # -------------------------------------------------------------- set-up

    def _setup_precision(self) -> None:
        set_deterministic(self.recipe.deterministic, self.device)  # before the first GPU kernel of the run
        self.amp_dtype = amp_dtype(self.recipe.amp, self.device)
        self.autocast = autocast_fn(self.device, self.amp_dtype)
        self.compile_mode = self.recipe.compile or None
        self.forward = ForwardPass(self.device, self._prepare, self.autocast, self.compile_mode)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype is torch.float16)
        cl = self.recipe.channels_last
        self.channels_last = self.device.type == 'cuda' if cl is None else cl

    def _setup_batch_layout(self) -> None:
        r, ctx = self.recipe, self.ctx
        self.global_batch = r.batch_size * ctx.world_size * r.accum_steps
        train_images = num_images(self.train_set)
        per_rank = train_images // ctx.world_size
        self.updates_per_epoch = per_rank // r.batch_size // r.accum_steps
        if self.updates_per_epoch == 0:
            raise TcnnError(f'the training set ({train_images} images) is smaller than one update of '
                            f'{self.global_batch} images (batch_size x processes x accum_steps): lower --batch-size '
                            'or --accum-steps')

    def _setup_model(self, checkpoint: Optional[Dict[str, Any]]) -> None:
        r = self.recipe
        self.late = r.reparam_epoch is not None and r.reparam_epoch > 0 and not r.no_sa
        seed_all(r.seed)
        if checkpoint is not None:
            model = model_from_dict(checkpoint['model_file'], map_location='cpu')
            self.converted = bool(checkpoint['converted'])
            model.train()
            model.to(self.device)
        else:
            model = create_model(r, r.num_classes).to(self.device)
            self.converted = False
            if not r.no_sa and not self.late:
                convert_in_place(model, r)
                self.converted = True
                self._log_conversion(model)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        if self.device.type == 'cuda':  # TF32 for training speed (conversions are verified in full fp32)
            torch.set_float32_matmul_precision('high')
            torch.backends.cudnn.allow_tf32 = True
        self.model = model

    def _setup_loaders(self) -> None:
        r = self.recipe
        # the preprocessing the run validates with, and the data's class names: what its checkpoints record
        self.data_config = recipe_data_config(r, self.model)
        self.label_names = class_names(self.train_set, r.num_classes)
        data = TrainingData(self.train_set, self.val_set, r.num_classes)
        pipeline, self.pipeline_reason = resolve_pipeline(r, data, self.data_config, self.device,
                                                          self.ctx.local_world_size)
        # the run records the pipeline it chose: a resumed run keeps it, whatever 'auto' would choose then
        self.recipe = r = dataclasses.replace(r, data_pipeline=pipeline)
        # validation goes through timm's eval transform on every pipeline (its numbers are tcnn eval's)
        self.train_set.transform, self.val_set.transform = build_transforms(r, self.data_config)
        augment = batched_augmentation(r, self.data_config) if pipeline != 'pil' else None
        self.train_set.augment_seed = r.seed  # augmentation a function of (seed, epoch, image): exact resume
        loaders = build_loaders(r, self.train_set, self.val_set, self.streaming, self.ctx, self.log, pipeline,
                                augment)
        self.train_loader, self.val_loader, self.train_sampler = loaders.train, loaders.val, loaders.sampler
        self.loader_generator, self.workers = loaders.generator, loaders.workers

    def _log_conversion(self, model: nn.Module) -> None:
        layers = model.tcnn_config['layers']
        self.log(f'reparameterised {len(layers)} convs of {self.recipe.model} into GPSA layers '
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
        if r.model_ema:
            self.model_ema = ModelEmaV3(self.model, decay=r.model_ema_decay)
        # timm's rule: with an EMA, the best checkpoint is the epoch whose EMA validates best
        self.best_metric = 'ema_val_top1' if self.model_ema is not None else 'val_top1'

    def _setup_loss(self) -> None:
        self.mixup_fn, self.criterion = build_loss(self.recipe)  # DeiT's (mixup/cutmix, label smoothing)

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
            batch = self.recipe.batch_size
            self.eval_model = CompiledForward(self.model, self.compile_mode, batch)
            if self.eval_ema is not None:
                self.eval_ema = CompiledForward(self.eval_ema, self.compile_mode, batch)
        self.train_model = model

    def _update_step(self) -> UpdateStep:
        r = self.recipe
        return UpdateStep(self.optimizer, self.scheduler, self.scaler, r.clip_grad, r.accum_steps, self.model_ema,
                          self.model, keep_grads=uses_cuda_graphs(self.compile_mode) and r.accum_steps > 1)

    def _restore(self, ckpt: Dict[str, Any]) -> None:
        r = self.recipe
        self.optimizer.load_state_dict(ckpt['optimizer'])
        # load_state_dict brings back the saved group settings; the (possibly overridden) recipe decides them
        apply_group_settings(self.optimizer, self.lrs['lr'], self.lrs['gating_lr'], r.weight_decay)
        self.start_epoch = ckpt['epoch'] + 1
        same_layout = (ckpt.get('global_batch') == self.global_batch and
                       ckpt.get('updates_per_epoch') == self.updates_per_epoch)
        self.position = self._restored_position(ckpt, same_layout)
        self.num_updates = self.start_epoch * self.updates_per_epoch + self.position.updates
        old, now = ckpt['config'], r.to_dict()  # both plain: the checkpoint's lists against the recipe's tuples
        if all(old.get(k) == now[k] for k in SCHEDULE_KEYS) and same_layout:
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
            self.folder.write_metrics([m for m in self.folder.read_metrics() if m['epoch'] < self.start_epoch])
        rng = ckpt.get('rng') or []
        if len(rng) == self.ctx.world_size:
            set_rng_state(rng[self.ctx.rank])
        else:
            self.log(f'note: the checkpoint holds RNG states of {len(rng)} processes, this run has '
                     f'{self.ctx.world_size}: data order is kept, augmentation draws are re-seeded')
            seed_all(r.seed + self.ctx.rank + 1000 * self.start_epoch)
        where = (f'in epoch {self.start_epoch + 1}/{r.epochs} after {self.position.updates} of '
                 f'{self.updates_per_epoch} updates' if self.position.updates else
                 f'after epoch {self.start_epoch}/{r.epochs}')
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
        removed = convert_in_place(self.model, r)
        self.converted = True
        self._log_conversion(self.model)
        add_gpsa_groups(self.optimizer, self.model, removed, r.weight_decay, self.lrs['lr'], self.lrs['gating_lr'])
        self.scheduler = create_scheduler(self.optimizer, r, self.updates_per_epoch, self.lrs['warmup_lr'],
                                          self.lrs['min_lr'])
        self.scheduler.step_update(self.num_updates)
        self._wrap()  # DDP broadcasts rank 0's new GPSA parameters to the other ranks here
        if self.model_ema is not None:
            # the EMA keeps its averaged CNN weights; its GPSA layers start from the model's (synchronised) init
            convert_in_place(self.model_ema.module, r)
            copy_gpsa_init(self.model, self.model_ema.module)

    # -------------------------------------------------------------- checkpoints and metrics

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
            config=self.recipe.to_dict(),
            best_top1=self.best_top1 if math.isfinite(self.best_top1) else None,
            dashboards=self.dashboards.state_dict(),
            best_metric=self.best_metric,
        )

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
                self.folder.write_checkpoint(ckpt, is_best)
                if row is not None:
                    self.folder.append_metrics(row)
            except CheckpointWriteError as e:
                error = e
        self._all_ok(error)

    # -------------------------------------------------------------- loop

    def describe(self) -> None:
        """Log the run's set-up: model, data, batch layout, learning rates and their warnings, output."""
        for line in setup_lines(self):
            self.log(line)

    def _train_epoch(self, epoch: int, position: EpochPosition) -> Tuple[EpochPosition, Dict[str, Any]]:
        r = self.recipe
        self.loader_generator.manual_seed(loader_seed(r.seed, epoch, self.ctx.rank))
        if self.train_sampler is not None:
            self.train_sampler.set_epoch(epoch, start=position.updates * r.accum_steps * r.batch_size)
        self.train_set.set_epoch(epoch)
        try:
            plan = EpochPlan(epoch, self.updates_per_epoch, self.num_updates, position,
                             should_stop=lambda: self.stop.requested, progress=r.progress and self.ctx.is_main,
                             desc=f'epoch {epoch + 1}/{r.epochs}', log_every=r.log_every,
                             on_update=self.dashboards.log_update if self.dashboards.enabled else None)
            return train_one_epoch(self.train_model, self.train_loader, self.criterion, self._update_step(), plan=plan,
                                   forward=self.forward)
        except NonFiniteLossError as e:
            kept = (f'the last good checkpoint {self.folder.last} (epoch {epoch}/{r.epochs}) is kept'
                    if os.path.isfile(self.folder.last) else 'no checkpoint was written yet')
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
        if self.start_epoch >= r.epochs:
            self.log(f'nothing to do: the run already has {r.epochs} epochs (raise --epochs to continue it)')
            return 0
        if self.ctx.is_main:
            self.dashboards = Dashboards(r.log, self.output, r, self.num_updates, self.dashboards_state,
                                         self.val_set, self.data_config)
        position = self.position
        for epoch in range(self.start_epoch, r.epochs):
            if self.late and not self.converted and epoch >= r.reparam_epoch:
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
            self.log(epoch_summary(row, r.epochs))
            if self._stop_agreed() and epoch + 1 < r.epochs:
                return self._stopped(f'after epoch {epoch + 1}')
        which = 'EMA val' if self.best_metric == 'ema_val_top1' else 'val'
        self.log(f'done: best {which} top-1 {self.best_top1:.2f}%; checkpoints {self.folder.last}, {self.folder.best}')
        return 0

    def _stop_agreed(self) -> bool:
        """Whether any process was asked to stop (a signal may reach only some of them)."""
        flag = torch.tensor([1.0 if self.stop.requested else 0.0], device=self.device)
        return all_reduce_sum(flag).item() > 0

    def _stopped_stream(self, epoch: int, position: EpochPosition) -> int:
        """A stop inside an epoch of a stream: no mid-epoch checkpoint (the stream cannot be resumed at a sample),
        so ``last.pt`` keeps the end of the previous epoch and ``--resume`` redoes this epoch from its start."""
        cause = self.stop.signal_name or 'a signal to another process'
        kept = (f'{self.folder.last} holds the end of epoch {epoch}; continue with --resume {self.output} (epoch '
                f'{epoch + 1} is redone from its start: {self.recipe.data} is a stream)' if epoch > 0 else
                'no epoch was completed, so there is no checkpoint; --resume auto starts the run again')
        self.log(f'stopped by {cause} in epoch {epoch + 1} after update {position.updates}/{self.updates_per_epoch}: '
                 f'{kept} (exit code {self.stop.exit_code})')
        return self.stop.exit_code

    def _stopped(self, where: str) -> int:
        cause = self.stop.signal_name or 'a signal to another process'
        self.log(f'stopped by {cause} {where}: {self.folder.last} holds the state; continue with --resume '
                 f'{self.output} (exit code {self.stop.exit_code})')
        return self.stop.exit_code
