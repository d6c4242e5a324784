"""``tcnn train``: fine-tune a T-CNN (or the no-SA baseline) with a recipe; the arguments and the run are those of
``python -m tcnn.train`` (defined once, in ``tcnn.train``)."""
from ..train import add_arguments, run

__all__ = ['add_arguments', 'run']
