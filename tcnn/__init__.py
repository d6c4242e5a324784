"""tcnn: Transformed CNNs. Reparameterise pretrained CNNs into CNN + GPSA hybrids that start from the CNN's function."""
from . import models  # registers the t_* models with timm
from .convert import ConversionError, EquivalenceReport, check_equivalence, exact_configuration, gpsa_layers, \
    gpsa_summary, reparameterize, reparameterize_
from .gpsa import GPSA
from .io import load, save

__version__ = '0.2.0'
__all__ = ['GPSA', 'reparameterize', 'reparameterize_', 'check_equivalence', 'exact_configuration', 'gpsa_layers',
           'gpsa_summary', 'ConversionError', 'EquivalenceReport', 'load', 'save', 'models']
