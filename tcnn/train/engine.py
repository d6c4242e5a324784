"""One training epoch and one validation pass (DeiT / ConvNeXt style), single-process or DDP.

Metrics are reduced across processes (sums of losses, counts and correct predictions), so every rank returns the
same global numbers. A non-finite loss raises ``NonFiniteLossError`` on every rank at the same update, before the
optimiser step, so the model and the last checkpoint stay clean. A stop request (preemption signal, Ctrl-C) ends the
epoch early at an update boundary on every rank at once; the returned ``EpochPosition`` lets a checkpoint resume
the epoch exactly there.
"""
import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, ContextManager, Dict, Iterable, Optional, Tuple, Union

import torch
import torch.nn as nn
from tqdm import tqdm

from ..errors import TcnnError
from ..runtime.compiling import CompiledForward, begin_step
from .distributed import all_reduce_sum, start_workers, world_size
from .optim import group_lrs

__all__ = ['NonFiniteLossError', 'EpochPosition', 'UpdateStep', 'ForwardPass', 'EpochPlan', 'train_one_epoch',
           'validate', 'autocast_fn', 'grad_norm', 'to_device', 'loop_rates', 'DATA_BOUND_FRACTION']

# A run is "data-bound" when the step waits this fraction of its time or more for the loader.
DATA_BOUND_FRACTION = 0.1


class NonFiniteLossError(TcnnError):
    """The training loss became NaN or infinite."""


def autocast_fn(device: torch.device, amp_dtype: Optional[torch.dtype]) -> Callable[[], ContextManager]:
    """A callable returning the autocast context of ``amp_dtype`` on ``device`` (a no-op context without AMP)."""
    if amp_dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=amp_dtype)


@dataclasses.dataclass
class EpochPosition:
    """How far an epoch got: updates done and this process's running sums. A mid-epoch checkpoint stores it, so the
    resumed epoch reports the same metrics as an uninterrupted one."""
    updates: int = 0
    loss_sum: float = 0.0  # sum over updates of the global mean loss
    correct: int = 0  # this process's correct predictions (against the dominant label)
    images: int = 0  # this process's training images
    compute_time_s: float = 0.0  # time spent in the steps (forward, backward, update), the wait for data excluded
    data_time_s: float = 0.0  # time spent waiting for the loader

    @property
    def loop_time_s(self) -> float:
        """The training loop's wall time: waiting for the loader plus computing."""
        return self.compute_time_s + self.data_time_s

    def state_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: Optional[Dict[str, Any]]) -> 'EpochPosition':
        state = dict(state or {})
        if 'train_time_s' in state:  # checkpoints of tcnn <= 0.3 named the compute time so
            state['compute_time_s'] = state.pop('train_time_s')
        return cls(**state)


@dataclasses.dataclass
class UpdateStep:
    """Everything one optimiser update needs besides the batch: optimiser, per-update scheduler, gradient scaler
    (always present; a disabled ``GradScaler`` passes the loss through), clipping, accumulation and the EMA."""
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    scaler: Optional[torch.amp.GradScaler] = None
    clip_grad: Optional[float] = None
    accum_steps: int = 1
    model_ema: Optional[nn.Module] = None
    ema_source: Optional[nn.Module] = None  # the raw model the EMA averages (not the DDP/compiled wrapper)
    # Keep zeroed gradient tensors between updates instead of dropping them. Needed when a CUDA-graph model
    # accumulates micro-batches: a backward pass into absent gradients hands over tensors of the graph pool, which
    # the next micro-batch's replay overwrites; into existing ones it adds in place.
    keep_grads: bool = False

    def __post_init__(self):
        if self.scaler is None:
            self.scaler = torch.amp.GradScaler('cpu', enabled=False)

    def zero_grad(self) -> None:
        """Drop the gradients (set them to zero, allocated, with ``keep_grads``)."""
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        if self.keep_grads:
            for group in self.optimizer.param_groups:
                for p in group['params']:
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss / self.accum_steps).backward()

    def step(self, model: nn.Module, num_updates: int, measure_norm: bool = False) -> Optional[torch.Tensor]:
        """Clip, step (through the scaler), zero the gradients, advance the scheduler to ``num_updates`` and
        update the EMA. Returns the gradient norm before clipping when clipping or ``measure_norm`` (else None)."""
        norm = None
        if self.clip_grad is not None or measure_norm:
            self.scaler.unscale_(self.optimizer)  # what scaler.step would do anyway: the update is the same
            if self.clip_grad is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad)
            else:
                norm = grad_norm(model.parameters())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=num_updates)
        if self.model_ema is not None:
            self.model_ema.update(self.ema_source, step=num_updates)
        return norm


def grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients together (what ``clip_grad_norm_`` measures), without touching them."""
    norms = [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32) for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def to_device(x: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """``x`` on ``device`` (asynchronously from pinned memory), channels-last if asked and 4-D."""
    x = x.to(device, non_blocking=True)
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.ndim == 4 else x


@dataclasses.dataclass
class ForwardPass:
    """How a CPU batch becomes the model's input and targets, and the precision of the forward pass.

    Attributes:
        device: Where to run.
        prepare: ``(images, labels) -> (images, targets)`` on ``device`` (memory format, mixup); default: a plain
            move, labels as targets.
        autocast: Returns the autocast context of a forward pass (timm's ``amp_autocast``).
        compile_mode: The ``torch.compile`` mode of the training model (None: eager); under a CUDA-graph mode every
            training forward starts a new CUDA-graph step (``tcnn.runtime.compiling.begin_step``).
    """
    device: torch.device
    prepare: Optional[Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]] = None
    autocast: Callable[[], ContextManager] = contextlib.nullcontext
    compile_mode: Optional[str] = None

    def batch(self, images: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.prepare is None:
            return images.to(self.device), labels.to(self.device)
        return self.prepare(images, labels)


@dataclasses.dataclass
class EpochPlan:
    """Which epoch to train and where it stands.

    Attributes:
        epoch: 0-based index of the epoch (messages say ``epoch + 1``).
        updates_per_epoch: Optimiser updates in a whole epoch.
        num_updates: Updates done before this call (the scheduler's position).
        position: Where a resumed epoch stands (default: at its start).
        should_stop: Polled after every update; the stop is agreed between processes.
        progress: Show a tqdm bar (main process).
        desc: Bar description.
        on_update: Called after every ``log_every``-th update (by the global update count) with that update's
            ``step`` (the global update count), global mean ``loss``, ``lr``, ``gating_lr``, ``grad_norm`` (before
            clipping) and, since the previous call, ``img_per_s`` (all processes) and ``data_wait`` (the share of
            the time spent waiting for the loader). Only the process that logs passes it: the norm costs a pass
            over the gradients.
        log_every: See ``on_update``.
    """
    epoch: int
    updates_per_epoch: int
    num_updates: int = 0
    position: EpochPosition = dataclasses.field(default_factory=EpochPosition)
    should_stop: Callable[[], bool] = lambda: False
    progress: bool = False
    desc: str = ''
    on_update: Optional[Callable[[Dict[str, Optional[float]]], None]] = None
    log_every: int = 1


def loop_rates(images: int, compute_s: float, wait_s: float) -> Dict[str, Optional[float]]:
    """The throughput of a stretch of the training loop that trained ``images`` images in ``compute_s`` seconds of
    steps after waiting ``wait_s`` seconds for the loader: ``img_per_s`` over the whole time (the loop's),
    ``step_img_per_s`` over the steps alone (= ``img_per_s / (1 - data_wait)``) and ``data_wait``, the share of the
    whole time spent waiting (in [0, 1]); None where a time is zero."""
    elapsed = compute_s + wait_s
    return {'img_per_s': images / elapsed if elapsed > 0 else None,
            'step_img_per_s': images / compute_s if compute_s > 0 else None,
            'data_wait': wait_s / elapsed if elapsed > 0 else None}


def _bar_postfix(position: EpochPosition, lr: Optional[float], world: int) -> Dict[str, str]:
    rates = loop_rates(position.images * world, position.compute_time_s, position.data_time_s)
    return {'loss': f'{position.loss_sum / max(position.updates, 1):.4f}', 'lr': f'{lr:.3g}',
            'img_s': f'{rates["img_per_s"] or 0:.1f}', 'data': f'{100 * (rates["data_wait"] or 0):.0f}%'}


class _UpdateReporter:
    """What ``EpochPlan.on_update`` receives: the update's own numbers and the throughput since the last report."""

    def __init__(self, plan: EpochPlan, position: EpochPosition):
        self.plan = plan
        self.enabled = plan.on_update is not None and plan.log_every > 0
        self._since = (position.images, position.compute_time_s, position.data_time_s)

    def wants(self, num_updates: int) -> bool:
        """Whether update ``num_updates`` (1-based global count) is reported."""
        return self.enabled and num_updates % self.plan.log_every == 0

    def report(self, num_updates: int, loss: float, lrs: Dict[str, Optional[float]], norm: Optional[torch.Tensor],
               position: EpochPosition) -> None:
        now = (position.images, position.compute_time_s, position.data_time_s)
        images, computed, waited = (a - b for a, b in zip(now, self._since))
        self._since = now
        rates = loop_rates(images * world_size(), computed, waited)
        self.plan.on_update({
            'step': num_updates, 'loss': loss, 'lr': lrs['lr'], 'gating_lr': lrs['gating_lr'],
            'grad_norm': None if norm is None else norm.item(),
            'img_per_s': rates['img_per_s'], 'data_wait': rates['data_wait'],
        })


class _UpdateSums:
    """The loss and correct predictions of the micro-batches since the last optimiser update, kept on the device so
    that a micro-batch costs no host synchronisation."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, accum_steps: int) -> None:
        self.loss += loss.detach().double() / accum_steps
        dominant = targets.argmax(dim=-1) if targets.ndim == 2 else targets  # mixup: the dominant label
        self.correct += (logits.detach().argmax(dim=-1) == dominant).sum()

    def agree(self, stop: bool) -> Tuple[float, bool]:
        """The global mean loss of the update and whether any process wants to stop: one all-reduce for both, so
        every process stops after the same update."""
        flags = all_reduce_sum(torch.stack([self.loss, torch.tensor(float(stop), dtype=torch.float64,
                                                                     device=self.loss.device)]))
        return flags[0].item() / world_size(), flags[1].item() > 0

    def take_correct(self) -> int:
        correct = int(self.correct.item())
        self.correct.zero_()
        self.loss.zero_()
        return correct


def train_one_epoch(
        model: nn.Module,
        loader: Iterable[Tuple[torch.Tensor, torch.Tensor]],
        criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        update: UpdateStep,
        plan: EpochPlan,
        forward: ForwardPass,
) -> Tuple[EpochPosition, Dict[str, Any]]:
    """Train until the epoch has ``plan.updates_per_epoch`` optimiser updates of ``update.accum_steps``
    micro-batches, or until ``plan.should_stop()`` is true on any process at an update boundary.

    Args:
        model: The model to call (possibly DDP-wrapped and/or compiled).
        loader: Yields ``(images, labels)`` on the CPU; for a resumed epoch, only the batches not yet trained on.
        criterion: ``loss(logits, target)``.
        update: What performs an optimiser update.
        plan: The epoch, its length and position, the stop poll and the progress bar.
        forward: Batch placement and autocast.

    Returns:
        The epoch's position (``updates < updates_per_epoch`` when stopped early) and, for a whole epoch, the global
        ``train_loss``, ``train_top1``, ``lr``/``gating_lr`` of the last update, ``img_per_s`` (images over the
        loop's whole time, waiting for the loader included), ``step_img_per_s`` (images over the steps' time alone),
        ``data_wait`` (the share of the loop's time spent waiting, in [0, 1]), ``train_images``, ``train_time_s``
        (the loop's whole time: waiting plus computing, over the resumed parts too) and the new ``num_updates``; an
        empty dict when stopped early.

    Raises:
        NonFiniteLossError: The mean loss of an update is NaN or infinite.
    """
    model.train()
    position, num_updates = dataclasses.replace(plan.position), plan.num_updates
    no_sync = getattr(model, 'no_sync', None)
    update.zero_grad()
    sums = _UpdateSums(forward.device)
    lrs = group_lrs(update.optimizer)
    reporter = _UpdateReporter(plan, position)
    micro, stopped, loss_value, norm = 0, False, math.nan, None
    bar = tqdm(total=plan.updates_per_epoch, initial=position.updates, desc=plan.desc, disable=not plan.progress,
               dynamic_ncols=True, leave=True)
    tick = time.perf_counter()
    try:
        for images, labels in start_workers(loader):
            if position.updates >= plan.updates_per_epoch:
                break
            now = time.perf_counter()
            position.data_time_s += now - tick
            images, targets = forward.batch(images, labels)
            micro += 1
            last_micro = micro % update.accum_steps == 0
            with contextlib.nullcontext() if (last_micro or no_sync is None) else no_sync():
                begin_step(forward.compile_mode)  # the previous step's logits and loss are no longer read
                with forward.autocast():
                    logits = model(images)
                    loss = criterion(logits, targets)
                update.backward(loss)
            sums.add(loss, logits, targets, update.accum_steps)
            position.images += images.shape[0]
            if last_micro:
                # The loss is checked before stepping, so a NaN never reaches the weights.
                loss_value, stopped = sums.agree(plan.should_stop())
                if not math.isfinite(loss_value):
                    raise NonFiniteLossError(f'non-finite training loss ({loss_value}) in epoch {plan.epoch + 1}, '
                                             f'update {position.updates + 1}: stopping')
                lrs = group_lrs(update.optimizer)
                num_updates += 1
                norm = update.step(model, num_updates, measure_norm=reporter.wants(num_updates))
                position.updates += 1
                position.loss_sum += loss_value
                position.correct += sums.take_correct()
            tick = time.perf_counter()
            position.compute_time_s += tick - now
            if last_micro:
                if plan.progress:
                    bar.set_postfix(_bar_postfix(position, lrs['lr'], world_size()), refresh=False)
                bar.update(1)
                if reporter.wants(num_updates):
                    reporter.report(num_updates, loss_value, lrs, norm, position)
                if stopped:
                    break
    finally:
        bar.close()
    if stopped and position.updates < plan.updates_per_epoch:
        return position, {}
    if position.updates < plan.updates_per_epoch:
        raise TcnnError(f'the training loader ended after {position.updates} of {plan.updates_per_epoch} updates')
    return position, _epoch_stats(position, lrs, num_updates, forward.device)


def _epoch_stats(position: EpochPosition, lrs: Dict[str, Optional[float]], num_updates: int,
                 device: torch.device) -> Dict[str, Any]:
    sums = all_reduce_sum(torch.tensor([position.correct, position.images], dtype=torch.float64, device=device))
    correct, seen = (int(v) for v in sums.tolist())
    return {
        'train_loss': position.loss_sum / max(position.updates, 1),
        'train_top1': 100.0 * correct / seen if seen else None,
        'lr': lrs['lr'],
        'gating_lr': lrs['gating_lr'],
        # this process's times: every process trains the same number of batches, and the all-reduces of each update
        # keep them in step
        **loop_rates(seen, position.compute_time_s, position.data_time_s),
        'train_images': seen,
        'train_time_s': position.loop_time_s,
        'num_updates': num_updates,
    }


@torch.no_grad()
def validate(
        model: Union[nn.Module, CompiledForward],
        loader: Iterable[Tuple[torch.Tensor, torch.Tensor]],
        *,
        device: torch.device,
        autocast: Callable[[], ContextManager] = contextlib.nullcontext,
        channels_last: bool = False,
        prefix: str = 'val',
) -> Dict[str, Any]:
    """Cross-entropy loss, top-1 and top-5 accuracy (in %) over the (sharded) loader, summed over processes.

    Top-5 is top-min(5, classes). Returns ``{prefix}_loss``, ``{prefix}_top1``, ``{prefix}_top5``,
    ``{prefix}_images``. A ``CompiledForward`` model may run under CUDA graphs: each batch's logits are used before
    the next forward (which may overwrite them), the sums are tensors of their own.
    """
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top1, top5, images
    for images, labels in start_workers(loader):
        images = to_device(images, device, channels_last)
        labels = labels.to(device, non_blocking=True)
        with autocast():
            logits = model(images)
        logits = logits.float()
        sums[0] += nn.functional.cross_entropy(logits, labels, reduction='sum')
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hits = top == labels[:, None]
        sums[1] += hits[:, 0].sum()
        sums[2] += hits.any(dim=-1).sum()
        sums[3] += labels.shape[0]
    sums = all_reduce_sum(sums)
    n = sums[3].item()
    if n == 0:
        raise TcnnError('the validation set is empty')
    return {
        f'{prefix}_loss': sums[0].item() / n,
        f'{prefix}_top1': 100.0 * sums[1].item() / n,
        f'{prefix}_top5': 100.0 * sums[2].item() / n,
        f'{prefix}_images': int(n),
    }
