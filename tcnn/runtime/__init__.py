"""Where and how a model runs, for training, evaluation and the benchmarks alike: the device a process computes on
(``devices``) and ``torch.compile`` with its modes and CUDA-graph steps (``compiling``).

Both modules are torch-free at import, so that the commands' flags (``--device``, ``--compile``) are checked before
torch loads.
"""
