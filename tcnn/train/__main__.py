"""``python -m tcnn.train`` and ``torchrun --nproc_per_node=N -m tcnn.train``: the arguments of ``tcnn train``."""
import sys

from .launch import main

sys.exit(main())
