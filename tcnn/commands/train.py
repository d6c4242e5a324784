"""``tcnn train``: fine-tune a T-CNN (or the no-SA baseline) with a recipe; the arguments and the run are those of
``python -m tcnn.train``.

The arguments come from the torch-free ``tcnn.train.args`` and the run imports ``tcnn.train.launch`` (torch, timm) only
when it starts, so ``tcnn train --help`` and argument errors answer at once.
"""
import argparse

from ..train.args import add_arguments

__all__ = ['add_arguments', 'run']


def run(args: argparse.Namespace) -> int:
    """Run ``tcnn train`` with parsed arguments (``tcnn.train.launch.run``).

    A fresh run's recipe (the file, the flags, ``--set``) is resolved and validated first, without torch: a mistake
    in it (``--lr nan``, an unknown key, an impossible warm-up) answers at once instead of after the imports. Then
    the process keeps the memory a training step frees (``tcnn.allocator``; the command's own process, and through
    the environment the processes it starts), which ``tcnn.train.main`` called from Python does not do."""
    if args.resume is None:
        from ..train.recipe import resolve_recipe
        from ..train.args import flag_overrides
        resolve_recipe(args.recipe, flag_overrides(args), args.set_items, [])
    from ..allocator import keep_freed_memory
    keep_freed_memory()  # before the first large allocation (torch's import, a resumed checkpoint, the model)
    from ..train.launch import run as train_run
    return train_run(args)
