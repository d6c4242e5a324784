"""One training epoch and one evaluation pass (DeiT / ConvNeXt style), single-process or DDP.

Metrics are reduced across processes (sums of losses, counts and correct predictions), so every rank returns the
same global numbers. A non-finite loss raises ``NonFiniteLossError`` on every rank at the same update, before the
optimiser step, so the model and the last checkpoint stay clean.
"""
import contextlib
import math
import time
from typing import Any, Callable, Dict, Iterable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .errors import TcnnError
from .optim import group_lrs

__all__ = ['NonFiniteLossError', 'train_one_epoch', 'evaluate', 'all_reduce_sum']


class NonFiniteLossError(TcnnError):
    """The training loss became NaN or infinite."""


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (identity when not distributed)."""
    if _distributed():
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def _world_size() -> int:
    return dist.get_world_size() if _distributed() else 1


def _to_device(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    x = x.to(device, non_blocking=True)
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.ndim == 4 else x


def _autocast(device: torch.device, amp_dtype: Optional[torch.dtype]):
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def train_one_epoch(
        model: nn.Module,
        loader: Iterable,
        optimizer: torch.optim.Optimizer,
        criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        device: torch.device,
        epoch: int,
        updates_per_epoch: int,
        num_updates: int = 0,
        scheduler: Any = None,
        accum_steps: int = 1,
        mixup_fn: Optional[Callable] = None,
        amp_dtype: Optional[torch.dtype] = None,
        scaler: Optional[torch.amp.GradScaler] = None,
        clip_grad: Optional[float] = None,
        model_ema: Optional[nn.Module] = None,
        ema_source: Optional[nn.Module] = None,
        channels_last: bool = False,
        progress: bool = False,
        desc: str = '',
) -> Dict[str, Any]:
    """Train for ``updates_per_epoch`` optimiser updates of ``accum_steps`` micro-batches each.

    Args:
        model: The model to call (possibly DDP-wrapped and/or compiled).
        loader: Yields ``(images, labels)``; micro-batches past the last full update are skipped.
        optimizer: The optimiser.
        criterion: ``loss(logits, target)``; the target is soft when ``mixup_fn`` is given.
        device: Where to run.
        epoch: 0-based index of this epoch (messages say ``epoch + 1``).
        updates_per_epoch: Optimiser updates in this epoch.
        num_updates: Updates done before this epoch (the scheduler's position).
        scheduler: A timm scheduler, stepped with ``step_update`` after every update.
        accum_steps: Micro-batches per update (gradients of the others are not synchronised under DDP).
        mixup_fn: timm ``Mixup``; turns labels into soft targets.
        amp_dtype: Autocast dtype (None: full precision).
        scaler: GradScaler for fp16 (None or disabled otherwise).
        clip_grad: Max gradient norm (None: no clipping).
        model_ema: timm ``ModelEmaV3``, updated after every update from ``ema_source``.
        ema_source: The raw model (what the EMA averages).
        channels_last: Feed channels-last images.
        progress: Show a tqdm bar (main process).
        desc: Bar description.

    Returns:
        dict with the global ``train_loss``, ``train_top1`` (against the dominant label of each target),
        ``lr``/``gating_lr`` of the last update, ``img_per_s``, ``train_images``, ``train_time_s`` and the new
        ``num_updates``.

    Raises:
        NonFiniteLossError: The mean loss of an update is NaN or infinite.
    """
    from tqdm import tqdm

    model.train()
    world = _world_size()
    no_sync = getattr(model, 'no_sync', None)
    optimizer.zero_grad(set_to_none=True)
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum over updates, correct, images
    bar = tqdm(total=updates_per_epoch, desc=desc, disable=not progress, dynamic_ncols=True, leave=True)
    update_loss = torch.zeros((), device=device)
    lrs = group_lrs(optimizer)
    start = time.perf_counter()
    micro, updates = 0, 0
    try:
        for images, labels in loader:
            if updates >= updates_per_epoch:
                break
            images = _to_device(images, device, channels_last)
            labels = labels.to(device, non_blocking=True)
            targets = labels
            if mixup_fn is not None:
                images, targets = mixup_fn(images, labels)
            last_micro = (micro + 1) % accum_steps == 0
            sync = contextlib.nullcontext() if (last_micro or no_sync is None) else no_sync()
            with sync:
                with _autocast(device, amp_dtype):
                    logits = model(images)
                    loss = criterion(logits, targets)
                grad_loss = loss / accum_steps
                if scaler is not None and scaler.is_enabled():
                    scaler.scale(grad_loss).backward()
                else:
                    grad_loss.backward()
            update_loss += loss.detach().float() / accum_steps
            dominant = targets.argmax(dim=-1) if targets.ndim == 2 else targets
            stats[1] += (logits.detach().argmax(dim=-1) == dominant).sum()
            stats[2] += images.shape[0]
            micro += 1
            if not last_micro:
                continue

            # one optimiser update: check the global loss before stepping, so a NaN never reaches the weights
            loss_value = all_reduce_sum(update_loss).item() / world
            if not math.isfinite(loss_value):
                raise NonFiniteLossError(
                    f'non-finite training loss ({loss_value}) in epoch {epoch + 1}, update {updates + 1}: stopping')
            lrs = group_lrs(optimizer)
            if scaler is not None and scaler.is_enabled():
                if clip_grad is not None:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
                scaler.step(optimizer)
                scaler.update()
            else:
                if clip_grad is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates += 1
            num_updates += 1
            if scheduler is not None:
                scheduler.step_update(num_updates=num_updates)
            if model_ema is not None:
                model_ema.update(ema_source, step=num_updates)
            stats[0] += loss_value
            update_loss.zero_()
            if progress:
                elapsed = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(loss=f'{stats[0].item() / updates:.4f}', lr=f'{lrs["lr"]:.3g}',
                                img_s=f'{stats[2].item() * world / elapsed:.1f}', refresh=False)
            bar.update(1)
    finally:
        bar.close()
    if updates < updates_per_epoch:
        raise TcnnError(f'the training loader ended after {updates} of {updates_per_epoch} updates')
    elapsed = time.perf_counter() - start
    correct, seen = (int(v) for v in all_reduce_sum(stats[1:]).tolist())
    return {
        'train_loss': stats[0].item() / max(updates, 1),
        'train_top1': 100.0 * correct / seen if seen else None,
        'lr': lrs['lr'],
        'gating_lr': lrs['gating_lr'],
        'img_per_s': seen / elapsed if elapsed > 0 else None,
        'train_images': seen,
        'train_time_s': elapsed,
        'num_updates': num_updates,
    }


@torch.no_grad()
def evaluate(
        model: nn.Module,
        loader: Iterable,
        *,
        device: torch.device,
        amp_dtype: Optional[torch.dtype] = None,
        channels_last: bool = False,
        prefix: str = 'val',
) -> Dict[str, Any]:
    """Cross-entropy loss, top-1 and top-5 accuracy (in %) over the (sharded) loader, summed over processes.

    Top-5 is top-min(5, classes). Returns ``{prefix}_loss``, ``{prefix}_top1``, ``{prefix}_top5``,
    ``{prefix}_images``.
    """
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top1, top5, images
    for images, labels in loader:
        images = _to_device(images, device, channels_last)
        labels = labels.to(device, non_blocking=True)
        with _autocast(device, amp_dtype):
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
