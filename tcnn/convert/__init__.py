"""Conversion of a CNN into its T-CNN: which convolutions to replace, the replacement, and its verification."""
from .transform import (CONVERSION_KEYS, ConversionError, ConversionSettings, EquivalenceReport, check_equivalence,
                        exact_configuration, gpsa_layers, gpsa_summary, list_stages, reparameterize, reparameterize_,
                        resolve_stages)

__all__ = ['ConversionError', 'EquivalenceReport', 'ConversionSettings', 'CONVERSION_KEYS', 'reparameterize',
           'reparameterize_', 'check_equivalence', 'exact_configuration', 'gpsa_layers', 'gpsa_summary',
           'resolve_stages', 'list_stages']
