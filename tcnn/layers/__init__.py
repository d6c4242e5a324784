"""The GPSA layer and the kernels it is built from (reusable modules, as in ``timm.layers``)."""
from .gpsa import GPSA

__all__ = ['GPSA']
