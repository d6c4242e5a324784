"""Keep the memory a training step frees for the next step, instead of handing it back to the system.

Why: glibc's malloc returns freed memory at the top of its heap to the kernel (``M_TRIM_THRESHOLD``, 128 KiB by
default, raised as blocks are freed), and serves every block above ``M_MMAP_THRESHOLD`` (128 KiB, raised dynamically up
to 32 MiB) with a fresh ``mmap`` that ``free`` unmaps. A training step on the CPU allocates and frees the same
activations every step, so every step faults its memory in again, page by page: the kernel time a user pays (a
quarter of a CPU training run, docs/benchmarks.md). With the mmap threshold at its maximum, a trim threshold of 2 GiB
and a 256 MiB top pad, the freed blocks stay in the process and the next step reuses them; the price is a higher
resident size (measured in docs/benchmarks.md, "The CPU allocator").

Only the command line's long-running processes call ``keep_freed_memory`` (``tcnn train``, ``python -m tcnn.train``
and ``torchrun -m tcnn.train``, ``tcnn demo`` and the training processes it starts): the settings are process-wide
and pass on to every process started later, so the Python API (``tcnn.train.main``, ``tcnn.train.launch.run``) and
``import tcnn`` leave the caller's process alone. Other C libraries (musl, macOS) and a user's own ``MALLOC_*``
environment (glibc's tunables, read when the process starts) are left alone; ``TCNN_MALLOC=system`` turns it off.
"""
import ctypes
import ctypes.util
import os
import platform
from typing import Dict, Optional

__all__ = ['MALLOC_SETTINGS', 'OPT_OUT', 'keep_freed_memory']

# glibc's mallopt parameters (malloc.h) and the values: the largest mmap threshold glibc allows on 64-bit
# (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB), a trim threshold of 2 GiB (mallopt takes an int) and a 256 MiB top pad.
# name of the equivalent environment tunable -> (mallopt parameter, value)
MALLOC_SETTINGS: Dict[str, tuple] = {
    'MALLOC_MMAP_MAX_': (-4, 0),  # M_MMAP_MAX
    'MALLOC_MMAP_THRESHOLD_': (-3, 32 * 2 ** 20),  # M_MMAP_THRESHOLD
    'MALLOC_TRIM_THRESHOLD_': (-1, 2 ** 31 - 1),  # M_TRIM_THRESHOLD
    'MALLOC_TOP_PAD_': (-2, 256 * 2 ** 20),  # M_TOP_PAD
}
OPT_OUT = 'TCNN_MALLOC'  # =system: leave glibc's defaults


def _glibc() -> Optional[ctypes.CDLL]:
    if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        return libc if hasattr(libc, 'mallopt') else None
    except OSError:
        return None


def keep_freed_memory() -> Dict[str, int]:
    """Tune this process's malloc to keep freed memory (see the module docstring). Processes it forks (loader
    workers) inherit the setting; it is set in the environment as well (glibc's tunables of the same values) so that
    processes started afresh get it from their first allocation.

    Returns:
        The settings applied, by tunable name; empty where nothing was changed (not glibc, ``TCNN_MALLOC=system``, or
        the user's own ``MALLOC_*`` tunables in the environment).
    """
    if os.environ.get(OPT_OUT, '').lower() == 'system' or any(name in os.environ for name in MALLOC_SETTINGS):
        return {}
    libc = _glibc()
    if libc is None:
        return {}
    applied = {}
    for name, (param, value) in MALLOC_SETTINGS.items():
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[name] = value
    os.environ.update({name: str(value) for name, value in applied.items()})
    return applied
