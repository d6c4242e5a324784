"""``tcnn train``: fine-tune a T-CNN (or the no-SA baseline) with a recipe; the arguments and the run are those of
``python -m tcnn.train``.

The arguments come from the torch-free ``tcnn.train_args`` and the run imports ``tcnn.train`` (torch, timm) only
when it starts, so ``tcnn train --help`` and argument errors answer at once.
"""
import argparse

from ..train_args import add_arguments

__all__ = ['add_arguments', 'run']


def run(args: argparse.Namespace) -> int:
    """Run ``tcnn train`` with parsed arguments (``tcnn.train.run``)."""
    from ..train import run as train_run
    return train_run(args)
