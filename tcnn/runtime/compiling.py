"""``torch.compile`` for ``tcnn train``, ``tcnn eval`` and the benchmarks: the modes, their check, and a model's
forward that stays correct under CUDA graphs.

Why the modes matter: at small batches on a GPU a T-CNN is host-bound (its GPSA layers launch tens of small kernels
where the conv launched three, and the GPU waits for Python to launch them). ``reduce-overhead`` records the compiled
kernels of each forward (and backward) into CUDA graphs, replayed with one launch each; ``max-autotune`` also
searches kernel configurations (much longer compilation) and records CUDA graphs; ``max-autotune-no-cudagraphs``
searches without recording; ``default`` fuses kernels only. On a CPU there are no CUDA graphs: ``reduce-overhead``
compiles as ``default`` does.

The rules of CUDA graph trees (PyTorch's "CUDAGraph Trees" notes) that the callers follow: a replay overwrites the
outputs of the previous replay of its graph, so each step starts with ``begin_step`` and nothing keeps an output
past its step (metrics are summed into tensors of their own or read with ``.item()``); gradients accumulated over
several backward passes must live outside the graph pool (``tcnn.train.engine.UpdateStep.keep_grads``).

Torch-free at import: the recipe check and the commands' argument errors answer before torch loads.
"""
from typing import TYPE_CHECKING, Any, Optional

from ..errors import TcnnError

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

__all__ = ['COMPILE_MODES', 'CUDA_GRAPH_MODES', 'COMPILE_HELP', 'compile_mode', 'uses_cuda_graphs', 'compile_model',
           'begin_step', 'CompiledForward']

COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
CUDA_GRAPH_MODES = ('reduce-overhead', 'max-autotune')  # the modes that record CUDA graphs on a GPU
# The --compile flag of tcnn train and tcnn eval (its value is checked by compile_mode: one line naming the modes).
COMPILE_HELP = (f'torch.compile the model; MODE: {", ".join(COMPILE_MODES)} (the flag alone: default); '
                'reduce-overhead and max-autotune record CUDA graphs, for small batches on a GPU (host-bound); the '
                'first batches pay the compilation')


def compile_mode(value: Any, name: str = "--compile (recipe key 'compile')") -> Optional[str]:
    """The ``torch.compile`` mode a setting asks for.

    Args:
        value: False or None (no compilation), True (``'default'``: a bare ``--compile``, and what recipes and
            checkpoints stored before modes existed), or one of ``COMPILE_MODES``.
        name: What the value is, for the error message.

    Returns:
        None or the mode.

    Raises:
        TcnnError: Any other value, naming the choices.
    """
    if value is None or value is False:
        return None
    if value is True:
        return 'default'
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    raise TcnnError(f'{name} takes a torch.compile mode: {", ".join(COMPILE_MODES)} (true: default; false: off), '
                    f'got {value!r}')


def uses_cuda_graphs(mode: Optional[str]) -> bool:
    """Whether ``mode`` records CUDA graphs (on a GPU), whose outputs the next replay overwrites."""
    return mode in CUDA_GRAPH_MODES


def compile_model(module: 'nn.Module', mode: Any) -> 'nn.Module':
    """``torch.compile(module, mode=mode, dynamic=False)`` (``mode`` as ``compile_mode`` reads it).

    ``dynamic=False``: one static graph per input shape. A training loader's batches all have one shape (it drops the
    last, smaller batch), and CUDA graphs are recorded per shape anyway; symbolic shapes would only make slower
    kernels. Shapes that occur once per pass (a validation set's last batch) run eagerly (``CompiledForward``).
    """
    import torch
    return torch.compile(module, mode=compile_mode(mode, 'compile_model'), dynamic=False)


def begin_step(mode: Optional[str]) -> None:
    """Tell CUDA graph trees that a new step (a training update's forward, an evaluation batch) begins, so that the
    previous step's graph outputs may be overwritten; a no-op unless ``mode`` records CUDA graphs.

    Explicit rather than left to the trees' heuristic (a new step at each compiled call while no backward is
    pending), which PyTorch documents as a guess: a forward whose backward never runs (an evaluation forward with
    gradients on, an exception between forward and backward) would leave a backward pending, and the following steps
    would record new graphs instead of replaying. Gated on the mode because the first call imports inductor
    (seconds).
    """
    if uses_cuda_graphs(mode):
        import torch
        torch.compiler.cudagraph_mark_step_begin()


class CompiledForward:
    """Evaluation forward of a model: compiled for batches of ``batch_size``, eager for any other batch size.

    Why eager for the others: the last batch of a validation set is smaller (and its size differs between processes
    and suites); compiling it with static shapes would cost a second compilation (minutes with ``max-autotune``) and
    a second CUDA graph with its own memory for one batch per pass, where eager costs that batch milliseconds. The
    compiled and the eager forward share the module's parameters, so both evaluate the same weights.

    Each compiled call starts a CUDA-graph step (``begin_step``): the caller uses the logits before the next call.

    Args:
        module: The model (not DDP-wrapped: evaluation needs no gradient synchronisation).
        mode: A ``torch.compile`` mode (``COMPILE_MODES``).
        batch_size: The batch size of the full batches.
    """

    def __init__(self, module: 'nn.Module', mode: str, batch_size: int):
        self.module = module
        self.mode = compile_mode(mode, 'CompiledForward')
        self.batch_size = batch_size
        self.compiled = compile_model(module, self.mode)

    def eval(self) -> 'CompiledForward':
        self.module.eval()
        return self

    def __call__(self, images: 'torch.Tensor') -> 'torch.Tensor':
        if images.shape[0] != self.batch_size:
            return self.module(images)
        begin_step(self.mode)
        return self.compiled(images)
