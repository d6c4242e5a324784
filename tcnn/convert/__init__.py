"""Conversion of a CNN into its T-CNN: which convolutions to replace, the replacement, and its verification.

``stages`` finds the stages and the convs a conversion replaces, ``settings`` holds what it sets and reads the GPSA
layers it makes, ``verify`` measures that the T-CNN computes the CNN's function, ``transform`` is ``reparameterize``
itself, and ``fusion`` keeps timm's RepVGG/MobileOne fusion working on converted blocks.
"""
from .settings import CONVERSION_KEYS, ConversionSettings, exact_configuration, gpsa_layers, gpsa_summary
from .stages import ConversionError, list_stages, resolve_stages
from .transform import reparameterize, reparameterize_
from .verify import EquivalenceReport, check_equivalence

__all__ = ['ConversionError', 'EquivalenceReport', 'ConversionSettings', 'CONVERSION_KEYS', 'reparameterize',
           'reparameterize_', 'check_equivalence', 'exact_configuration', 'gpsa_layers', 'gpsa_summary',
           'resolve_stages', 'list_stages']
