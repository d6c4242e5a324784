"""Where the training tests train: ``TCNN_TEST_DEVICE=cpu`` (the default, what CI runs) or ``cuda`` (a GPU machine).

The one place that reads the variable. With ``cuda`` the one-process runs of the training tests (an epoch, the
checkpoints, a SIGTERM in the middle of an epoch, the exact resume, ``torchrun --nproc_per_node 1``, whose process
group is then NCCL's) train on the GPU with ``--deterministic``: cuDNN's autotuning would let a resumed run choose
other kernels than the uninterrupted one and differ from it in the last bits. Runs of several processes stay on the
CPU (gloo): one GPU cannot hold two ranks.
"""
import os
from typing import List

import torch

__all__ = ['DEVICE', 'device_args', 'process_group_backend']

DEVICE = os.environ.get('TCNN_TEST_DEVICE', 'cpu')
if DEVICE not in ('cpu', 'cuda'):
    raise ValueError(f'TCNN_TEST_DEVICE={DEVICE!r}: expected cpu or cuda')
if DEVICE == 'cuda':
    if not torch.cuda.is_available():
        raise RuntimeError('TCNN_TEST_DEVICE=cuda but CUDA is not available')
    # cuBLAS reads it once, when a process first uses it: before any test does (tcnn train sets it too, too late
    # for a pytest process whose earlier tests ran on the GPU)
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')


def device_args(processes: int = 1) -> List[str]:
    """The ``tcnn train`` flags that place a run of ``processes`` training processes."""
    if DEVICE == 'cuda' and processes == 1:
        return ['--device', 'cuda', '--deterministic']
    return ['--device', 'cpu']


def process_group_backend(processes: int = 1) -> str:
    """The backend of the process group of a torchrun job placed by ``device_args(processes)``."""
    return 'nccl' if device_args(processes)[1] == 'cuda' else 'gloo'
