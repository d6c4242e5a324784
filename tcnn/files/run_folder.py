"""The output folder of a training run: what ``tcnn train`` writes there and how it is read back.

``RUN/config.yaml`` (the resolved recipe), ``RUN/metrics.jsonl`` (one JSON object per epoch), ``RUN/last.pt`` and
``RUN/best.pt`` (training checkpoints: a T-CNN dict under ``'model_file'`` plus the optimiser, scheduler, scaler,
EMA, RNG and position state, all tensors and plain values), ``RUN/status.json`` (where the run stands, for cluster
scripts). Every file is written atomically (temp + rename), so a crash leaves the previous version whole.

``RunFolder`` is the one writer of a running ``tcnn train`` (rank 0): the trainer, the run's status and its config go
through it, and a failed write (full disk, read-only folder, quota) becomes one ``CheckpointWriteError`` that names
the path and the fix. The module-level functions read and write single files for other tools (plots, Hub folders,
the demo, benchmarks).
"""
import datetime
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.nn as nn

from ..atomic import atomic_copy, atomic_torch_save, atomic_write_text
from ..errors import TcnnError, first_line
from .integrity import tensor_checksums, verify_checksums
from .tcnn_file import CHECKSUMS_KEY, EMA_CHECKSUMS_KEY, check_dict, model_to_dict
from .weights import load_torch_file

# Marks a training checkpoint (value: its layout version). Not 'format': that key marks T-CNN files, and ``read``
# recognises a checkpoint by its 'model_file' entry. Version 2 added mid-epoch checkpoints ('partial').
CHECKPOINT_KEY = 'tcnn_checkpoint'
CHECKPOINT_VERSION = 2
CONFIG_FILE = 'config.yaml'
METRICS_FILE = 'metrics.jsonl'
LAST_CHECKPOINT, BEST_CHECKPOINT = 'last.pt', 'best.pt'
STATUS_FILE = 'status.json'
# running: set up and training; preempted: stopped by SIGTERM/SIGUSR1 after writing last.pt (requeue with
# --resume auto); interrupted: Ctrl-C; finished: every epoch done; failed: stopped by an error (requeueing repeats it).
RUN_STATES = ('running', 'preempted', 'interrupted', 'finished', 'failed')


def make_checkpoint(model: nn.Module, data_config: Optional[Dict[str, Any]] = None, *,
                    label_names: Optional[Sequence[str]] = None, **state: Any) -> Dict[str, Any]:
    """A training checkpoint of ``model`` (its T-CNN dict with the run's data config and class names, so ``load``
    reads the model out of it) and ``state``, with the checksums of the model's weights and of the EMA weights
    (``state['ema']``) that ``read`` and ``read_checkpoint`` check."""
    model_file = model_to_dict(model, data_config=data_config, label_names=label_names)
    model_file[CHECKSUMS_KEY] = tensor_checksums(model_file['state_dict'])
    checkpoint = {CHECKPOINT_KEY: CHECKPOINT_VERSION, 'model_file': model_file, **state}
    if isinstance(state.get('ema'), dict):
        checkpoint[EMA_CHECKSUMS_KEY] = tensor_checksums(state['ema'])
    return checkpoint


def read_checkpoint(path: str) -> Dict[str, Any]:
    """Read a training checkpoint (``RUN/last.pt`` or ``RUN/best.pt``) with ``weights_only=True``.

    Raises:
        TcnnError: Missing, unreadable, not a training checkpoint, or written by a newer tcnn.
    """
    if not os.path.isfile(path):
        raise TcnnError(f'checkpoint not found: {path}')
    ckpt = load_torch_file(path, 'checkpoint')
    if not isinstance(ckpt, dict) or CHECKPOINT_KEY not in ckpt or 'model_file' not in ckpt:
        raise TcnnError(f'{path} is not a tcnn training checkpoint (OUTPUT/last.pt or OUTPUT/best.pt of tcnn train)')
    if not isinstance(ckpt[CHECKPOINT_KEY], int) or ckpt[CHECKPOINT_KEY] > CHECKPOINT_VERSION:
        raise TcnnError(f'{path} has training-checkpoint layout {ckpt[CHECKPOINT_KEY]!r}; this tcnn reads up to '
                        f'{CHECKPOINT_VERSION}: upgrade tcnn')
    model_file = check_dict(ckpt['model_file'], path)
    verify_checksums(model_file['state_dict'], model_file.get(CHECKSUMS_KEY), path)
    if isinstance(ckpt.get('ema'), dict):
        verify_checksums(ckpt['ema'], ckpt.get(EMA_CHECKSUMS_KEY), f'{path} (its EMA weights)')
    return ckpt


def write_checkpoint(checkpoint: Dict[str, Any], path: str) -> None:
    """Write a training checkpoint atomically (the previous file stays whole until the new one is complete)."""
    atomic_torch_save(checkpoint, path)


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, one per epoch, sorted by epoch (empty for a run without epochs).

    A resumed run may log an epoch twice: the last record wins. A truncated last line (a file another tool is still
    appending to) is skipped; any other malformed line is an error.
    """
    try:
        with open(path, encoding='utf-8') as f:
            lines = [(n, line.strip()) for n, line in enumerate(f, 1)]
    except UnicodeDecodeError:
        raise TcnnError(f'{path} is not a metrics file (binary content); give a tcnn train run folder or its '
                        f'{METRICS_FILE}') from None
    lines = [(n, line) for n, line in lines if line]
    by_epoch: Dict[int, Dict[str, Any]] = {}
    for k, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
            epoch = int(record['epoch'])
        except (ValueError, KeyError, TypeError) as e:
            if k == len(lines) - 1 and k > 0:
                continue
            raise TcnnError(f'{path}, line {n}: not a metrics record ({type(e).__name__}: {e})') from e
        by_epoch[epoch] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def write_metrics(path: str, records: Sequence[Dict[str, Any]]) -> None:
    """Write ``metrics.jsonl`` atomically, one JSON object per line."""
    atomic_write_text(path, ''.join(json.dumps(r) + '\n' for r in records))


def write_status(path: str, state: str, **info: Any) -> None:
    """Write a run's ``status.json`` atomically: ``{"state": STATE, ...info, "time": UTC ISO time}``.

    A cluster script reads ``state`` to decide whether to requeue, whatever exit code a launcher (torchrun, srun)
    made of the run's own: ``preempted`` is the only state worth requeueing.
    """
    if state not in RUN_STATES:
        raise ValueError(f'unknown run state {state!r}; expected one of {RUN_STATES}')
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
    atomic_write_text(path, json.dumps({'state': state, **info, 'time': stamp}, indent=2) + '\n')


def read_status(path: str) -> Optional[Dict[str, Any]]:
    """The content of a ``status.json``, or None when there is none."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8') as f:
        return json.load(f)


class CheckpointWriteError(TcnnError):
    """A checkpoint or the metrics file could not be written; the previous files are intact."""


class RunFolder:
    """The files of one run's output folder (``output``) and their writes, on rank 0.

    Every write is atomic and guarded (``guarded``): it either replaces the file whole or raises
    ``CheckpointWriteError`` with the previous file in place.
    """

    def __init__(self, output: str):
        self.output = output
        self.config = os.path.join(output, CONFIG_FILE)
        self.metrics = os.path.join(output, METRICS_FILE)
        self.last = os.path.join(output, LAST_CHECKPOINT)
        self.best = os.path.join(output, BEST_CHECKPOINT)
        self.status = os.path.join(output, STATUS_FILE)

    def guarded(self, path: str, write: Callable[[], Any]) -> None:
        """Run one atomic write; a failure (full disk, read-only folder, quota) becomes one line naming the path.
        The atomic write leaves the previous file in place."""
        try:
            write()
        except Exception as e:  # noqa: BLE001 - torch.save reports a full disk as RuntimeError, not OSError
            reason = first_line(e)
            kept = (f'the previous {os.path.basename(self.last)} is intact' if os.path.isfile(self.last)
                    else 'no checkpoint was written yet')
            raise CheckpointWriteError(f'cannot write {path} ({type(e).__name__}: {reason}); {kept}; free disk space '
                                       f'or fix the permissions of {self.output}, then --resume {self.output}') from e

    def write_config(self, text: str) -> None:
        """``config.yaml``: the resolved recipe (``tcnn.train.recipe.dump_recipe``)."""
        self.guarded(self.config, lambda: atomic_write_text(self.config, text))

    def read_metrics(self) -> List[Dict[str, Any]]:
        """The epochs ``metrics.jsonl`` holds (none before the first)."""
        return read_metrics(self.metrics) if os.path.isfile(self.metrics) else []

    def write_metrics(self, rows: Sequence[Dict[str, Any]]) -> None:
        self.guarded(self.metrics, lambda: write_metrics(self.metrics, rows))

    def append_metrics(self, row: Dict[str, Any]) -> None:
        """One epoch's row after the others (the file is rewritten whole, atomically)."""
        self.write_metrics(self.read_metrics() + [row])

    def write_checkpoint(self, checkpoint: Dict[str, Any], is_best: bool) -> None:
        """``last.pt``, and ``best.pt`` first when ``is_best`` (``last.pt`` is then its copy)."""
        if is_best:
            self.guarded(self.best, lambda: write_checkpoint(checkpoint, self.best))
            self.guarded(self.last, lambda: atomic_copy(self.best, self.last))
        else:
            self.guarded(self.last, lambda: write_checkpoint(checkpoint, self.last))

    def write_status(self, state: str, **info: Any) -> None:
        """``status.json`` (``write_status``)."""
        self.guarded(self.status, lambda: write_status(self.status, state, **info))
