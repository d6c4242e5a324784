"""Fine-tune a T-CNN (T-CNN, arXiv:2106.05795, section 3) or its no-SA baseline: ``tcnn train``,
``python -m tcnn.train`` and ``torchrun --nproc_per_node=N -m tcnn.train`` take the same arguments.

A run, in order: resolve the recipe (``tcnn.train.recipe``) and, with ``--resume``, the checkpoint
(``tcnn.train.resume``); set up torch.distributed from the torchrun environment (``tcnn.train.distributed``); open the
datasets (which fixes the number of classes); build the ``Trainer`` (``tcnn.train.trainer``): create the CNN
(``tcnn.files.sources.create_cnn``) and reparameterise it (``tcnn.reparameterize_``, verified in the exact
configuration) unless ``no_sa``, or later for ``reparam_epoch``, build the loaders with the model's preprocessing
(``tcnn.train.builders``); then train epoch by epoch (``tcnn.train.engine``). Only rank 0 writes, through
``tcnn.files.run_folder.RunFolder``: ``OUTPUT/config.yaml``, ``OUTPUT/metrics.jsonl`` (one JSON object per epoch),
``OUTPUT/status.json`` and the checkpoints ``OUTPUT/last.pt`` / ``OUTPUT/best.pt`` (atomic,
``torch.load(weights_only=True)``-loadable; ``tcnn.load`` reads the model out of them).

SIGTERM/SIGUSR1 (cluster preemption) and Ctrl-C stop every rank at the next optimiser update; ``last.pt`` then holds
the state in the middle of the epoch and ``--resume`` continues exactly there. Exit codes: 0 done, 2 user error,
75 stopped by SIGTERM/SIGUSR1 (requeue), 130 Ctrl-C.
"""
import argparse
import contextlib
import dataclasses
import os
import sys
from typing import Any, Optional, Sequence

from .data import open_training_data
from ..errors import TcnnError, first_line
from ..paths import check_output_dir, output_dir
from .args import add_arguments
from .dashboards import check_backends
from .distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest, cleanup_distributed, setup_distributed
from .recipe import dump_recipe
from .resume import resolve
from ..files.run_folder import LAST_CHECKPOINT, RunFolder
from .trainer import Trainer

__all__ = ['add_arguments', 'run', 'main', 'RunStatus']


class RunStatus:
    """Rank 0's ``OUTPUT/status.json`` (``RunFolder.write_status``): where the run stands, so that a cluster script can
    decide to requeue (``preempted``) or stop (``finished``, ``failed``), whatever exit code torchrun or srun made of
    the run's own (torchrun turns a worker's 75 into 1 when it was signalled itself)."""

    STATE_OF_EXIT = {0: 'finished', EXIT_PREEMPTED: 'preempted', EXIT_INTERRUPTED: 'interrupted'}

    def __init__(self, folder: RunFolder, active: bool, process_group: Optional[str] = None):
        self.folder = folder
        self.active = active
        self.process_group = process_group

    def write(self, state: str, trainer: Optional[Trainer], **info: Any) -> None:
        if not self.active:
            return
        info = dict(process_group=self.process_group, **info)
        if trainer is not None:
            info = dict(epochs=trainer.recipe.epochs,
                        completed_epochs=trainer.num_updates // trainer.updates_per_epoch,
                        num_updates=trainer.num_updates, **info)
        self.folder.write_status(state, **info)

    def write_if_started(self, state: str, trainer: Optional[Trainer], **info: Any) -> None:
        """After an error or Ctrl-C: only where a status exists (this run's, or a previous attempt's that a script
        would otherwise act on), and without hiding the error if the write fails too."""
        if self.active and os.path.isfile(self.folder.status):
            with contextlib.suppress(Exception):
                self.write(state, trainer, **info)


def run(args: argparse.Namespace) -> int:
    """Run ``tcnn train`` with parsed arguments; user mistakes raise ``TcnnError``.

    The calling process's malloc and environment are left as they are: the programs (``tcnn train``, ``python -m
    tcnn.train``, ``torchrun -m tcnn.train``) tune malloc for themselves (``tcnn.allocator.keep_freed_memory``),
    a Python caller decides for its own process.
    """
    recipe, checkpoint, notes = resolve(args)
    if args.print_config:
        print(dump_recipe(recipe), end='')
        return 0
    output = recipe.output
    folder = RunFolder(output)
    if checkpoint is None and os.path.isfile(folder.last):
        raise TcnnError(f'{output} already holds a run ({LAST_CHECKPOINT}): continue it with --resume {output} '
                        f'(or --resume auto) or choose another --output')
    check_output_dir(output, '--output')
    check_backends(recipe.log)
    ctx = setup_distributed(recipe.device)
    status = RunStatus(folder, ctx.is_main, ctx.backend)
    trainer, code = None, 1
    try:
        with StopRequest() as stop, (output_dir(output) if ctx.is_main else contextlib.nullcontext()):
            for note in notes if ctx.is_main else ():
                print(f'note: {note}')
            data = open_training_data(recipe, resumed=checkpoint is not None)
            recipe = dataclasses.replace(recipe, num_classes=data.num_classes)  # a fresh run may leave it to the data
            trainer = Trainer(recipe, data, ctx, checkpoint, stop)
            del checkpoint
            if ctx.is_main:  # the trainer's recipe: with the data pipeline it chose
                folder.write_config(dump_recipe(trainer.recipe))
            status.write('running', trainer)
            trainer.describe()
            code = trainer.fit()
            status.write(RunStatus.STATE_OF_EXIT.get(code, 'failed'), trainer, exit_code=code)
            return code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        status.write_if_started('interrupted', trainer, exit_code=code)
        if ctx.is_main:
            where = (f'{folder.last} holds the last checkpoint; continue with --resume {output}'
                     if os.path.isfile(folder.last) else 'no checkpoint was written')
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
    """``python -m tcnn.train`` / ``torchrun -m tcnn.train`` (and ``tcnn.train.main``, the Python API): errors print
    as one line (``--debug``: traceback). Process-wide settings are the programs' (``run``)."""
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

