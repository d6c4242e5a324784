"""Live dashboards of a training run: ``tcnn train --log tensorboard wandb`` (rank 0 only).

What a run logs (the step is the global optimiser-update count):

* every ``log_every`` updates: ``train/loss`` (that update's mean loss over all processes), ``train/lr``,
  ``train/gating_lr``, ``train/grad_norm`` (before clipping), ``train/img_per_s`` (all processes) and
  ``train/data_wait`` (the share of the time spent waiting for the loader), both since the previous point;
* every epoch, at the update that ends it: ``epoch``, ``val/loss``, ``val/top1``, ``val/top5`` (``ema_val/*`` with
  an EMA), ``train/epoch_loss``, ``train/epoch_top1``, ``train/epoch_time_s``, the learning rates of the epoch's last
  update ``train/epoch_lr`` and ``train/epoch_gating_lr`` (the base and gating parameter groups; a run shorter than
  ``log_every`` updates has no other lr curve), the epoch's ``train/epoch_img_per_s``,
  ``train/epoch_step_img_per_s`` and ``train/epoch_data_wait`` (``metrics.jsonl``'s loop numbers); per GPSA layer
  the mean and per-head gate sigmoid(lambda_h) (T-CNN, arXiv:2106.05795, eq. 7) and span 1/alpha_h (Fig. 4):
  ``gate/LAYER/mean``, ``gate/LAYER/head_H``, ``span/LAYER/...``; the nonlocality (ConViT, arXiv:2103.10697, eq. 8)
  of a fixed batch of validation images, ``nonlocality/LAYER`` and ``nonlocality/mean``; and ``attention``, the
  Fig. 5 figure (every head's gated attention of the centre pixel, the gates in red; ``tcnn inspect``'s first row) of
  the first of them;
* once, at the start: the recipe as hyperparameters (TensorBoard's HPARAMS tab and a ``recipe`` text; the W&B
  run's config).

A resumed run continues the same dashboards. TensorBoard: the same folder ``OUTPUT/tensorboard``; the new event file
starts with a purge point at the checkpoint's update + 1, so TensorBoard hides whatever an earlier process logged
after the checkpoint it resumes from (a crash between two checkpoints) and shows every step once. W&B: the run id is
stored in the checkpoint and the run reopened with ``resume='allow'``; a process logs the steps after its
checkpoint's, so a preempted run (whose checkpoint is its last update) continues without a gap or a repeated step.
After a crash between two checkpoints the steps since the last one are logged again (the resumed training repeats
them exactly); W&B keeps a step's first values and ignores a step below its current one, so its run shows each step
once too (offline, both files hold them until ``wandb sync`` uploads them in order). Each backend's buffer is flushed
before every checkpoint, so nothing a checkpoint covers is lost in a crash.
"""
import importlib
import itertools
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import yaml

from ..analysis.figures import attention_figure, figure_pixels
from ..analysis.heads import attention_maps, nonlocality
from ..convert.settings import gpsa_layers
from ..data.images import denormalize
from ..errors import TcnnError, first_line
from .recipe import Recipe, dump_recipe

__all__ = ['Dashboards', 'check_backends', 'TENSORBOARD_DIR', 'PROBE_IMAGES', 'epoch_scalars']

TENSORBOARD_DIR = 'tensorboard'
PROBE_IMAGES = 8  # validation images the nonlocality is measured on every epoch (the first one is drawn)
PACKAGES = {'tensorboard': 'tensorboard', 'wandb': 'wandb'}  # backend -> the package it imports (= its extra)
UPDATE_TAGS = ('loss', 'lr', 'gating_lr', 'grad_norm', 'img_per_s', 'data_wait')
# metrics.jsonl keys of an epoch -> dashboard tags
EPOCH_TAGS = {'val_loss': 'val/loss', 'val_top1': 'val/top1', 'val_top5': 'val/top5', 'ema_val_loss': 'ema_val/loss',
              'ema_val_top1': 'ema_val/top1', 'ema_val_top5': 'ema_val/top5', 'train_loss': 'train/epoch_loss',
              'train_top1': 'train/epoch_top1', 'epoch_time_s': 'train/epoch_time_s',
              # per epoch too, so that a run of fewer than log_every updates shows its schedule and throughput
              'lr': 'train/epoch_lr', 'gating_lr': 'train/epoch_gating_lr', 'img_per_s': 'train/epoch_img_per_s',
              'step_img_per_s': 'train/epoch_step_img_per_s', 'data_wait': 'train/epoch_data_wait'}


def check_backends(names: List[str]) -> None:
    """Fail with one line naming the extra when the package of a requested backend is missing.

    Raises:
        TcnnError: ``--log NAME`` without its package.
    """
    for name in names:
        try:
            importlib.import_module(PACKAGES[name])
        except ImportError:
            raise TcnnError(f'--log {name} needs the {PACKAGES[name]} package: pip install "tcnn[{name}]"') from None


def epoch_scalars(row: Mapping[str, Any]) -> Dict[str, float]:
    """The scalars of one ``metrics.jsonl`` row: accuracy, losses, per-layer and per-head gates and spans."""
    out = {'epoch': row['epoch'] + 1}
    out.update({tag: row[key] for key, tag in EPOCH_TAGS.items() if row.get(key) is not None})
    for layer, entry in row.get('gpsa', {}).items():
        for name in ('gate', 'span'):
            out[f'{name}/{layer}/mean'] = entry[f'{name}_mean']
            out.update({f'{name}/{layer}/head_{h}': v for h, v in enumerate(entry[name])})
    return out


class _Probe:
    """A fixed batch of validation images (spread over the split, in its eval transform) and the first one's name."""

    def __init__(self, dataset: Any, data_config: Mapping[str, Any], count: int = PROBE_IMAGES):
        if hasattr(dataset, '__getitem__') and hasattr(dataset, '__len__'):
            n = len(dataset)
            indices = sorted(set(np.linspace(0, n - 1, min(count, n)).round().astype(int).tolist()))
            samples = [dataset[i] for i in indices]
            filename = getattr(dataset, 'filename', None)
            if indices:  # none of an empty set, refused below
                self.name = os.path.basename(filename(indices[0])) if filename else f'validation image {indices[0]}'
        else:  # a stream: its first images
            samples = list(itertools.islice(iter(dataset), count))
            self.name = 'first validation image'
        if not samples:
            raise TcnnError('the validation set is empty')
        self.images = torch.stack([s[0] for s in samples])
        self.data_config = data_config

    def measure(self, model: nn.Module) -> Tuple[Dict[str, float], np.ndarray]:
        """Nonlocality per GPSA layer and their mean; the attention-map figure of the first image as RGB pixels."""
        values = {f'nonlocality/{layer}': v['mean'] for layer, v in nonlocality(model, self.images).items()}
        values['nonlocality/mean'] = float(np.mean(list(values.values())))
        first = self.images[:1]
        # the gated mix only, as in T-CNN Fig. 5 (its content and positional parts would triple the drawing time)
        figure = attention_figure(attention_maps(model, first), denormalize(first[0], self.data_config),
                                  parts=('mixed',), title=self.name)
        return values, figure_pixels(figure)


class _TensorBoard:
    """``torch.utils.tensorboard`` in ``OUTPUT/tensorboard``."""

    def __init__(self, output: str, start_step: int):
        from torch.utils.tensorboard import SummaryWriter
        # purge_step: TensorBoard drops what an earlier process logged from this step on (0: a fresh start)
        self.writer = SummaryWriter(os.path.join(output, TENSORBOARD_DIR), purge_step=start_step + 1 if start_step
                                    else 0)

    def hparams(self, recipe: Recipe) -> None:
        from torch.utils.tensorboard.summary import hparams
        for summary in hparams(_flat(recipe.to_dict()), {'val/top1': None, 'val/top5': None}):
            self.writer.file_writer.add_summary(summary, 0)
        text = ''.join(f'    {line}\n' for line in dump_recipe(recipe).splitlines())  # a markdown code block
        self.writer.add_text('recipe', text, 0)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, pixels: np.ndarray, caption: str, step: int) -> None:
        self.writer.add_image(tag, pixels, step, dataformats='HWC')

    def flush(self) -> None:
        self.writer.flush()

    def close(self, exit_code: int) -> None:
        self.writer.close()

    def state_dict(self) -> Dict[str, Any]:
        return {}


class _WandB:
    """A Weights & Biases run (``WANDB_MODE=offline`` works; files under ``$WANDB_DIR``, else ``OUTPUT/wandb``)."""

    def __init__(self, output: str, recipe: Recipe, run_id: Optional[str]):
        import wandb
        self.wandb = wandb
        project = recipe.wandb_project or os.environ.get('WANDB_PROJECT') or 'tcnn'
        try:  # the config at every start: a resumed run may override recipe keys (--epochs to extend it)
            self.run = wandb.init(project=project, id=run_id, resume='allow', config=recipe.to_dict(),
                                  name=os.path.basename(os.path.normpath(output)),
                                  dir=None if os.environ.get('WANDB_DIR') else output)
        except Exception as e:  # noqa: BLE001 - wandb raises its own errors (no API key, no connection, ...)
            raise TcnnError(f'--log wandb: cannot start the W&B run ({first_line(e)}); log in (wandb login), set '
                            'WANDB_MODE=offline to sync later, or leave out wandb') from e

    def hparams(self, recipe: Recipe) -> None:
        pass  # the config, set at every start

    def _log(self, values: Mapping[str, Any], step: int) -> None:
        if step >= self.run.step:  # online, a resumed run starts after the server's last step; never log twice
            self.run.log(dict(values), step=step)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._log(values, step)

    def image(self, tag: str, pixels: np.ndarray, caption: str, step: int) -> None:
        self._log({tag: self.wandb.Image(pixels, caption=caption)}, step)

    def flush(self) -> None:
        pass  # wandb's own process writes the run file as values arrive

    def close(self, exit_code: int) -> None:
        if exit_code == 75:  # tcnn.train.distributed.EXIT_PREEMPTED: shown as preempted, not crashed, until resumed
            self.run.mark_preempting()
        self.run.finish(exit_code=exit_code)

    def state_dict(self) -> Dict[str, Any]:
        return {'wandb_id': self.run.id}


def _flat(recipe: Mapping[str, Any]) -> Dict[str, Any]:
    """Recipe values TensorBoard's hparams take: numbers, strings and booleans (lists and null as text)."""
    return {k: v if isinstance(v, (bool, int, float, str)) else yaml.safe_dump(v, default_flow_style=True).strip()
            for k, v in recipe.items()}


class Dashboards:
    """The dashboards of one training process; without backends (other ranks, no ``--log``) every call is a no-op.

    Args:
        backends: Names from ``tcnn.train.recipe.LOG_BACKENDS``.
        output: The run folder.
        recipe: The resolved recipe (logged as hyperparameters).
        start_step: Updates done before this process (0 for a fresh run, the checkpoint's count on resume).
        state: ``state_dict()`` of the process that wrote the checkpoint (the W&B run id).
        val_set: Validation dataset (eval transform) the fixed probe batch comes from.
        data_config: The model's preprocessing (to show the probe image).
    """

    def __init__(self, backends: List[str] = (), output: str = '', recipe: Optional[Recipe] = None,
                 start_step: int = 0, state: Optional[Mapping[str, Any]] = None, val_set: Any = None,
                 data_config: Optional[Mapping[str, Any]] = None):
        state = state or {}
        makers: Dict[str, Callable[[], Any]] = {
            'tensorboard': lambda: _TensorBoard(output, start_step),
            'wandb': lambda: _WandB(output, recipe, state.get('wandb_id')),
        }
        self.backends = [makers[name]() for name in backends]
        self.start_step = start_step
        self._state = dict(state)  # kept for a backend this process does not run (--log changed on resume)
        self._val_set, self._data_config, self._probe = val_set, data_config, None
        if self.backends and start_step == 0:
            self._each(lambda b: b.hparams(recipe))

    @property
    def enabled(self) -> bool:
        return bool(self.backends)

    def _each(self, call: Callable[[Any], None]) -> None:
        for backend in self.backends:
            call(backend)

    def log_update(self, stats: Mapping[str, Optional[float]]) -> None:
        """``tcnn.train.engine.EpochPlan.on_update``: one update's scalars."""
        values = {f'train/{k}': stats[k] for k in UPDATE_TAGS if stats.get(k) is not None}
        self._each(lambda b: b.scalars(values, stats['step']))

    def log_epoch(self, row: Mapping[str, Any], model: nn.Module, step: int) -> None:
        """One epoch's ``metrics.jsonl`` row and the attention of ``model`` (raw, not DDP-wrapped) on the probe."""
        if not self.enabled:
            return
        values = epoch_scalars(row)
        pixels = None
        if gpsa_layers(model):
            if self._probe is None:
                self._probe = _Probe(self._val_set, self._data_config)
            measured, pixels = self._probe.measure(model)
            values.update(measured)
        self._each(lambda b: b.scalars(values, step))
        if pixels is not None:
            caption = f'{self._probe.name}, epoch {row["epoch"] + 1}'
            self._each(lambda b: b.image('attention', pixels, caption, step))

    def flush(self) -> None:
        self._each(lambda b: b.flush())

    def close(self, exit_code: int = 0) -> None:
        self.state_dict()
        self._each(lambda b: b.close(exit_code))
        self.backends = []

    def state_dict(self) -> Dict[str, Any]:
        """What a resumed process needs to continue the same dashboards (stored in the checkpoint)."""
        state = dict(self._state)
        self._each(lambda b: state.update(b.state_dict()))
        self._state = state
        return state
