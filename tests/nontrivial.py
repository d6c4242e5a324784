"""Random models whose every block reaches the logits, so that equivalence checks are not vacuous."""
import torch
import torch.nn as nn


def nontrivial(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BN statistics, BN and LayerNorm affine parameters, and layer scales of order 1, in eval mode.

    timm zero-initialises the last BN of residual blocks and starts ConvNeXt layer scales (``gamma``, torchvision's
    ``layer_scale``) at 1e-6: either would hide the converted layers from the logits.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
        for name, p in model.named_parameters():
            if name.endswith(('gamma', 'layer_scale')):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
    return model.eval()


def varied_heads(model: nn.Module, seed: int = 1) -> nn.Module:
    """Distinct per-head gates, locality strengths and centres in every GPSA layer of ``model`` (away from the
    paper's uniform init, so per-head outputs can be told apart)."""
    from tcnn.convert.settings import gpsa_layers
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in gpsa_layers(model):
            layer.gating.copy_(torch.randn(layer.num_heads, generator=gen) * 2)
            layer.pos_locality.copy_(torch.rand(layer.num_heads, generator=gen) * 3 - 0.5)
            layer.pos_centers.add_(torch.randn(layer.num_heads, 2, generator=gen) * 0.3)
    return model


def away_from_exact(layer: nn.Module, value_noise: float) -> nn.Module:
    """One GPSA layer far from its exact configuration, so that every branch matters: random content queries/keys and
    gates, shifted centres, values off the identity, a random bias (uses the global RNG)."""
    with torch.no_grad():
        layer.q_weight.normal_()
        layer.k_weight.normal_()
        layer.gating.normal_()
        layer.pos_centers.add_(torch.randn_like(layer.pos_centers) * 0.5)
        layer.v_weight.add_(torch.randn_like(layer.v_weight) * value_noise)
        if layer.proj_bias is not None:
            layer.proj_bias.normal_()
    return layer
