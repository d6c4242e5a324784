"""The device a process computes on: ``auto`` (a GPU when there is one, else the CPU), ``cpu``, ``cuda`` or
``cuda:N``, and under torchrun the GPU of the process's local rank; a device this machine lacks is one line naming the
fix (CUDA's own "invalid device ordinal" names none).

Torch-free at import: ``DEVICE_HELP`` is the ``--device`` flag of ``tcnn train``, ``tcnn eval``, ``tcnn inspect`` and
``tcnn demo``, whose argument errors answer before torch loads.
"""
from typing import TYPE_CHECKING, Optional, Union

from ..errors import TcnnError, check_device

if TYPE_CHECKING:
    import torch

__all__ = ['DEVICE_HELP', 'default_device', 'resolve_device']

# What --device takes, in every command that has it (each adds its default).
DEVICE_HELP = 'where the model runs: auto (a GPU when there is one, else the CPU), cpu, cuda or cuda:N'


def default_device() -> str:
    """What ``auto`` means on this machine: ``'cuda'`` when CUDA is available, else ``'cpu'``."""
    import torch
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def _check_gpu_count(name: str, world: int, local_rank: int, local_world: Optional[int], index: int) -> None:
    """One line naming the fix instead of CUDA's "invalid device ordinal" when this process's GPU does not exist.

    Every process of a node checks the node's process count (``LOCAL_WORLD_SIZE``, set by torchrun), not only its own
    GPU: rank 0, the only one that prints errors, has a GPU of its own and would otherwise wait for the failed ranks.
    """
    import torch
    count = torch.cuda.device_count()
    gpus = f'{count} GPU' + ('' if count == 1 else 's')
    if world == 1:
        if index >= count:
            valid = 'cuda:0' if count == 1 else f'cuda:0 to cuda:{count - 1}'
            raise TcnnError(f'device {name} requested but this machine has {gpus} ({valid}): pass one of them or '
                            '--device cpu')
        return
    if local_world is not None and local_world > count:
        what = f'{local_world} processes on this node need {local_world} GPUs'
    elif local_rank >= count:
        what = f'process LOCAL_RANK={local_rank} needs cuda:{local_rank}'
    else:
        return
    processes = 'process' if count == 1 else 'processes'
    raise TcnnError(f'{what} but this machine has {gpus}: start at most {count} {processes} per node '
                    f'(torchrun --nproc_per_node {count}) or pass --device cpu')


def resolve_device(name: Optional[Union[str, 'torch.device']] = None, world: int = 1, local_rank: int = 0,
                   local_world: Optional[int] = None, *, what: str = 'device') -> 'torch.device':
    """The device a process computes on: ``None``/``'auto'`` is the GPU when there is one, else the CPU; ``'cuda'``
    under torchrun is the GPU of the local rank. A device this machine lacks is a one-line error naming the fix;
    ``what`` names the setting in the message for a name that is no device (``'--device'``)."""
    import torch
    name = default_device() if name is None or name == 'auto' else str(check_device(name, what))
    if not name.startswith('cuda'):
        return torch.device(name)
    if not torch.cuda.is_available():
        raise TcnnError(f'device {name} requested but CUDA is not available: use device cpu')
    # under torchrun each process takes the GPU of its local rank; alone, cuda:N means GPU N
    index = local_rank if world > 1 or name == 'cuda' else torch.device(name).index or 0
    _check_gpu_count(name, world, local_rank, local_world, index)
    device = torch.device('cuda', index)
    torch.cuda.set_device(device)
    return device
