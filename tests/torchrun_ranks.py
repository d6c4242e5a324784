"""``tcnn.train`` for torchrun tests that also writes every rank's final model and EMA to OUTPUT/rank{RANK}.pt.

The checkpoints hold rank 0's state only; these files let a test compare the processes with each other (after
training they must hold the same model, batch-norm statistics included).
Usage: ``python -m torch.distributed.run --nproc_per_node=2 tests/torchrun_ranks.py TCNN_TRAIN_ARGS...``.
"""
import os
import sys

import torch

from tcnn.train import launch

_fit = launch.Trainer.fit


def _fit_and_dump(self: launch.Trainer) -> int:
    code = _fit(self)
    ema = self.model_ema.module.state_dict() if self.model_ema is not None else None
    torch.save({'model': self.model.state_dict(), 'ema': ema}, os.path.join(self.output, f'rank{self.ctx.rank}.pt'))
    return code


if __name__ == '__main__':
    launch.Trainer.fit = _fit_and_dump
    sys.exit(launch.main())
