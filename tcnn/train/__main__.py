"""``python -m tcnn.train`` and ``torchrun --nproc_per_node=N -m tcnn.train``: the arguments of ``tcnn train``.

As a program the process keeps the memory a training step frees (``tcnn.allocator``: malloc's settings and the
``MALLOC_*`` environment its loader workers and child processes inherit), before its first large allocation;
``tcnn.train.main`` called from Python leaves its caller's process as it is.
"""
import sys

from ..allocator import keep_freed_memory

keep_freed_memory()

from .launch import main  # noqa: E402  (after the malloc settings: the imports allocate too)

sys.exit(main())
