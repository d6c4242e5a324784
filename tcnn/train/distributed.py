"""How the processes of a training run agree: torchrun set-up, reductions, RNG state, stop requests (the device each
process computes on: ``tcnn.runtime.devices``).

One process (``tcnn train``) or N processes under ``torchrun`` (NCCL on GPU, gloo on CPU) run the same code; these
helpers are the identity in a single process. Under ``torchrun`` a process group exists even for one process
(``--nproc_per_node 1``): a one-GPU job then runs what an N-GPU job runs (NCCL, DDP, the reductions).
"""
import dataclasses
import os
import random
import signal
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from ..runtime.devices import resolve_device

__all__ = ['DistContext', 'setup_distributed', 'cleanup_distributed', 'is_distributed', 'world_size',
           'all_reduce_sum', 'gather', 'launched_by_torchrun', 'rng_state', 'set_rng_state', 'seed_all',
           'set_deterministic', 'StopRequest', 'EXIT_PREEMPTED', 'EXIT_INTERRUPTED']

# Exit codes of a run stopped by a signal after writing its checkpoint. 75 is EX_TEMPFAIL of sysexits.h ("try
# again later"): a cluster script requeues on it. 130 = 128 + SIGINT, the shell's code for Ctrl-C.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


@dataclasses.dataclass
class DistContext:
    """Where this process runs and which part of the job it is."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    distributed: bool
    backend: Optional[str] = None  # the process group's ('nccl', 'gloo'); None without one

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process: it sets ``TORCHELASTIC_RUN_ID`` for every
    worker, also for ``--nproc_per_node 1``."""
    return 'TORCHELASTIC_RUN_ID' in os.environ


def setup_distributed(device_name: str) -> DistContext:
    """Device and process group from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).

    The process group (NCCL on a GPU, gloo on the CPU) is made for every job that torchrun started, one process
    included: a one-GPU ``torchrun --nproc_per_node 1`` job checks the path of a many-GPU one (NCCL, DDP, the
    reductions), whose numbers are the same as a lone process's (a sum over one process is the identity).
    """
    world = int(os.environ.get('WORLD_SIZE', '1'))
    rank = int(os.environ.get('RANK', '0'))
    local_rank = int(os.environ.get('LOCAL_RANK', '0'))
    local_world = int(os.environ.get('LOCAL_WORLD_SIZE', str(world)))
    # only torchrun's LOCAL_WORLD_SIZE counts the processes of this node (the default above counts all nodes)
    device = resolve_device(device_name, world, local_rank,
                            local_world if 'LOCAL_WORLD_SIZE' in os.environ else None)
    if (world > 1 or launched_by_torchrun()) and not dist.is_initialized():
        dist.init_process_group(backend='nccl' if device.type == 'cuda' else 'gloo')
    backend = str(dist.get_backend()) if is_distributed() else None
    return DistContext(rank, world, local_rank, local_world, device, is_distributed(), backend)


def cleanup_distributed() -> None:
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (identity when not distributed)."""
    if is_distributed():
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather(obj: Any) -> List[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` when not distributed)."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rng_state() -> Dict[str, Any]:
    """RNG states as tensors/lists/numbers only, so checkpoints load with ``weights_only=True``."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        'torch': torch.get_rng_state(),
        'cuda': list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else [],
        'numpy': [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])],
        'python': [py_state[0], list(py_state[1]), py_state[2]],
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state['torch'])
    if state['cuda'] and torch.cuda.is_available() and len(state['cuda']) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state['cuda'])
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def set_deterministic(enabled: bool, device: torch.device) -> None:
    """Bitwise-reproducible GPU computation, or the fastest (the default): a resumed run equals the uninterrupted
    one on the CPU as it is, but on a GPU only with the same kernels in both processes.

    Off: cuDNN autotunes its convolution algorithms (``cudnn.benchmark``), which times candidates in each process and
    may pick others in the resumed one. On: no autotuning, cuDNN's deterministic algorithms only, PyTorch's
    deterministic implementations where it has them (``torch.use_deterministic_algorithms``, ``warn_only``: an op
    without one warns and runs anyway) and a fixed cuBLAS workspace (``CUBLAS_WORKSPACE_CONFIG``, read when cuBLAS
    first runs in the process: set it in the environment to be sure). Slower; for checks of exactness.
    """
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = not enabled
    if enabled:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)


def ignore_stop_signals(worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: a loader worker leaves the stop signals (``StopRequest.SIGNALS``) that reach
    its whole job to the training process, and still obeys its own parent.

    Clusters signal every process of a job, not only the training process (SLURM's preemption and ``scancel``, a
    terminal's Ctrl-C to the foreground process group): a worker killed by such a signal would make the training
    process fail with "DataLoader worker ... killed by signal" instead of stopping at its next update and saving. So
    the worker blocks these signals and a thread takes them with ``sigwaitinfo``: one sent by the parent (the
    DataLoader's ``terminate()``, e.g. at interpreter exit) ends the worker at once; one from anyone else
    is dropped, since the parent got its own copy and ends its workers when it stops. Simply ignoring the signals
    would make ``terminate()`` a no-op and a parent exiting with live workers wait for them forever.
    """
    names = [n for n in StopRequest.SIGNALS if hasattr(signal, n)]
    if not hasattr(signal, 'sigwaitinfo') or not names:  # not on Linux: keep the default behaviour
        return
    signums = {getattr(signal, n) for n in names}
    signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    parent = os.getppid()

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo(signums)
            if info.si_pid == parent:
                os._exit(128 + info.si_signo)  # the shell's code for death by this signal; nothing to clean up

    threading.Thread(target=wait, name='tcnn-stop-signals', daemon=True).start()


def start_workers(loader: Iterable) -> Iterator:
    """``iter(loader)``; for a loader whose workers run ``ignore_stop_signals``, with the stop signals blocked while
    the workers are forked: a worker inherits the mask, so a job-wide signal that comes before its
    ``worker_init_fn`` runs waits for it instead of killing it. This process gets its own copy when the mask is
    restored."""
    names = [n for n in StopRequest.SIGNALS if hasattr(signal, n)]
    if (getattr(loader, 'worker_init_fn', None) is not ignore_stop_signals or not hasattr(signal, 'sigwaitinfo')
            or threading.current_thread() is not threading.main_thread()):
        return iter(loader)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, n) for n in names})
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class StopRequest:
    """Turns SIGTERM, SIGUSR1 (cluster preemption: SLURM, Kubernetes) and a first Ctrl-C into a request that the
    training loop honours at its next update boundary, where the state is consistent and can be checkpointed.

    A second Ctrl-C interrupts at once (``KeyboardInterrupt``). Use as a context manager around the run: the previous
    handlers come back on exit. Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    SIGNALS = ('SIGTERM', 'SIGUSR1', 'SIGINT')

    def __init__(self):
        self.signal_name: Optional[str] = None
        self._previous: Dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.signal_name == 'SIGINT' else EXIT_PREEMPTED

    def request(self, name: str) -> None:
        """Ask for a stop as if signal ``name`` had arrived (also what the handler does)."""
        if self.signal_name is None:
            self.signal_name = name

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if name == 'SIGINT' and self.signal_name == 'SIGINT':
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait for the update to end
        self.request(name)

    def __enter__(self) -> 'StopRequest':
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    signum = getattr(signal, name)
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
