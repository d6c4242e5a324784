"""What a ``tcnn train`` run prints about itself (rank 0): its set-up before the first epoch (model, data, batch
layout, learning rates and how they were scaled, with the warnings that save a small run's first try) and one summary
line per epoch.
"""
from typing import Any, Dict, List, Optional, Protocol

import numpy as np
import torch
import torch.nn as nn

from ..data.readers import num_images
from .distributed import DistContext
from .engine import DATA_BOUND_FRACTION
from .recipe import Recipe

__all__ = ['setup_lines', 'lr_rule', 'small_run_warnings', 'epoch_summary']

# Below this batch-scaling factor (global batch 64 for the paper's reference 1024) a small run barely moves.
SMALL_LR_FACTOR = 1 / 16


def _fmt(v: Optional[float], spec: str = '.4g') -> str:
    return 'n/a' if v is None else format(v, spec)


class RunSetup(Protocol):
    """What ``setup_lines`` reads of a run: the attributes a ``tcnn.train.trainer.Trainer`` has once it is set up
    (a protocol, so that this module needs nothing of the trainer and the trainer imports this one)."""
    model: nn.Module
    recipe: Recipe
    ctx: DistContext
    late: bool
    device: torch.device
    amp_dtype: Optional[torch.dtype]
    train_set: Any
    val_set: Any
    workers: int
    pipeline_reason: str
    global_batch: int
    updates_per_epoch: int
    lrs: Dict[str, float]
    compile_mode: Optional[str]
    best_metric: str
    output: str


def setup_lines(trainer: RunSetup) -> List[str]:
    """What ``Trainer.describe`` logs before the first epoch: model, data, batch layout, learning rates (with
    ``small_run_warnings``), compilation, the best-checkpoint rule and the output folder."""
    t, r, ctx, lines = trainer, trainer.recipe, trainer.ctx, []
    kind = 'no-SA baseline' if r.no_sa else 'T-CNN'
    if t.late:
        kind += f', reparameterised after {r.reparam_epoch} CNN epochs'
    lines.append(f'model {r.model} ({kind}), '
                 f'{sum(p.numel() for p in t.model.parameters()) / 1e6:.2f}M params, {r.num_classes} classes, '
                 f'device {t.device}, {ctx.world_size} process(es)'
                 f'{f" ({ctx.backend} process group)" if ctx.backend else ""}, amp {t.amp_dtype or "none"}'
                 f'{", deterministic" if r.deterministic else ""}')
    val_images = num_images(t.val_set) or 'unknown'
    lines.append(f'data {r.data}: {num_images(t.train_set)} train / {val_images} val images, '
                 f'{r.img_size} px, data pipeline {r.data_pipeline} ({t.pipeline_reason}), {t.workers} loader workers '
                 f'per process; global batch {t.global_batch} = '
                 f'{r.batch_size} x {ctx.world_size} process(es) x {r.accum_steps} accum, '
                 f'{t.updates_per_epoch} updates/epoch')
    lines.append(f'lr {t.lrs["lr"]:.3g} ({lr_rule(r, t.lrs, t.global_batch, "lr")}), gating lr '
                 f'{t.lrs["gating_lr"]:.3g} ({lr_rule(r, t.lrs, t.global_batch, "gating_lr")}); '
                 f'{r.warmup_epochs} warm-up epochs from {t.lrs["warmup_lr"]:.3g}, {r.sched} decay to '
                 f'{t.lrs["min_lr"]:.3g}')
    for warning in small_run_warnings(r, t.lrs, t.global_batch):
        lines.append(f'warning: {warning}')
    if t.compile_mode:
        lines.append(f'torch.compile mode {t.compile_mode}: the first epoch compiles the training step and the '
                     'validation forward')
    if t.best_metric == 'ema_val_top1':
        lines.append('best.pt: the epoch with the best EMA validation top-1 (ema_val_top1); it holds the model and '
                     'its EMA: read the EMA with tcnn.load(PATH, ema=True) or tcnn eval/inspect --use-ema')
    lines.append(f'output {t.output}')
    return lines


def lr_rule(recipe: Recipe, lrs: Dict[str, float], global_batch: int, key: str) -> str:
    """How the run got the learning rate ``key``: as the user gave it, or the recipe's value batch-scaled
    (``lrs``: ``tcnn.train.recipe.scaled_lrs``)."""
    r = recipe
    if key in r.absolute_lrs:
        return 'as given'
    if not r.scale_lr:
        return 'recipe value, scale_lr off'
    return f'recipe value x {lrs["factor"]:.4g} = global batch {global_batch} / {r.lr_base_batch}'


def small_run_warnings(recipe: Recipe, lrs: Dict[str, float], global_batch: int) -> List[str]:
    """What makes a small run's first try learn nothing, while the paper's recipe stays exact for ImageNet; and
    a gating lr that lost its ratio to the lr because only one of them was given (the other one scaled)."""
    r, out = recipe, []
    scaled = [k for k in ('lr', 'gating_lr') if k not in r.absolute_lrs]
    if r.scale_lr and len(scaled) == 2 and lrs['factor'] < SMALL_LR_FACTOR:
        out.append(f'the batch rule scales every learning rate by {global_batch}/{r.lr_base_batch} = '
                   f'{lrs["factor"]:.3g} (lr {lrs["lr"]:.2g}, gating lr {lrs["gating_lr"]:.2g}): '
                   'a small run may barely move; consider --set scale_lr=false or a larger --lr')
    if r.scale_lr and len(scaled) == 1 and lrs['factor'] != 1:
        ratio, planned = lrs['gating_lr'] / lrs['lr'], r.gating_lr / r.lr
        given = 'lr' if scaled == ['gating_lr'] else 'gating_lr'
        out.append(f'gating lr / lr = {ratio:.3g}, not the recipe\'s {planned:.4g}: --{given.replace("_", "-")} '
                   f'is used as given while the batch rule scales {scaled[0]}; give --{scaled[0].replace("_", "-")} '
                   'too to choose both')
    return out


def epoch_summary(row: Dict[str, Any], epochs: int) -> str:
    """The line logged after an epoch from its ``metrics.jsonl`` row."""
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
        line += '; data-bound: raise --workers, try --data-pipeline device or resident, or lighten the augmentation'
    return line
