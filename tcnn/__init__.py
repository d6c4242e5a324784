"""tcnn: Transformed CNNs. Reparameterise pretrained CNNs into CNN + GPSA hybrids that start from the CNN's function."""
from .convert import ConversionError, EquivalenceReport, check_equivalence, exact_configuration, gpsa_layers, \
    gpsa_summary, reparameterize
from .gpsa import GPSA

__version__ = '0.1.0'
