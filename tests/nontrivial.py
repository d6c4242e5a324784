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
