"""Where and how a model runs, for training, evaluation and the benchmarks alike: the device a process computes on
(``devices``), ``torch.compile`` with its modes and CUDA-graph steps (``compiling``) and mixed precision
(``precision``).

The modules are torch-free at import, so that the commands' flags (``--device``, ``--compile``, ``--amp``) are checked
before torch loads.
"""
