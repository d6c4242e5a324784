"""timm's inference-time reparameterisation (``timm.utils.reparameterize_model``) of T-CNN blocks.

RepVGG (arXiv:2101.03697) and MobileOne (arXiv:2206.04040) blocks train as several branches, a k x k conv + BN, a
1x1 conv + BN and an identity BN, summed; their ``reparameterize()`` fuses the branches into one k x k conv for
inference. In a T-CNN the k x k conv of such a block is a GPSA layer, so timm's fusion, which reads the conv's
``weight``, cannot run. ``reparameterize_`` (``tcnn.convert.transform``) re-classes every such block that holds a
GPSA layer into the subclass below (adding methods only, as ``tcnn.models.create`` does for whole models), whose
``reparameterize()`` fuses what is exact and leaves the attention as it is:

* each k x k branch's BN into its GPSA layer's output projection and bias (the GPSA output is linear in
  ``proj_weight``/``proj_bias``, T-CNN eq. 5, and BN in eval mode is a per-channel affine map);
* the 1x1 branch and the identity BN into one 1x1 conv with bias (the same algebra as timm's own fusion);
* the block's ``reparam_conv`` becomes ``FusedBranches``, summing the GPSA layer(s) and that 1x1 conv.

Why this, and not converting the fused k x k conv (a T-CNN of the deploy-form block). Once fine-tuned, a GPSA layer
is no longer a conv (its content attention and its learned positional attention are not a fixed filter): adding a
1x1 conv to it is exact only in the exact configuration, so a fine-tuned multi-branch T-CNN could never be fused into
one layer anyway. Converting the deploy form instead would make the converted stage a plain one-branch stage for
fine-tuning, losing the multi-branch training that is the point of RepVGG and MobileOne; the T-CNN's state dict
would no longer match the source's (train-form) pretrained weights, which would need fusing at load; and
``timm.create_model('t_repvgg_a0')`` would no longer be the source architecture with GPSA layers in place of its
convs. Here the T-CNN trains, loads and saves in the train form, and reparameterisation keeps every GPSA layer a
GPSA layer, with the function kept up to float rounding at any point of fine-tuning.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import ConvNormAct
from timm.models.byobnet import MobileOneBlock, RepVggBlock

from ..layers.gpsa import GPSA

__all__ = ['FusedBranches', 'TransformedRepVggBlock', 'TransformedMobileOneBlock', 'adopt_fusion']


class FusedBranches(nn.Module):
    """Inference form of a multi-branch block whose k x k conv(s) are GPSA layers: ``sum_i gpsa_i(x) + conv(x)``.

    Args:
        gpsa: The GPSA layers, each with its branch's BN folded into its output projection and bias.
        conv: The 1x1 branch and identity BN as one 1x1 conv with bias (None when the block has neither).
    """

    def __init__(self, gpsa: List[GPSA], conv: Optional[nn.Conv2d]):
        super().__init__()
        self.gpsa = nn.ModuleList(gpsa)
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x) if self.conv is not None else None
        for layer in self.gpsa:
            out = layer(x) if out is None else out + layer(x)
        return out


def _bn_scale_shift(bn: nn.BatchNorm2d) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode BN as ``x * scale + shift`` per channel."""
    scale = bn.weight / (bn.running_var + bn.eps).sqrt()
    return scale, bn.bias - bn.running_mean * scale


@torch.no_grad()
def _fold_bn_into_gpsa(branch: ConvNormAct) -> GPSA:
    """``bn(gpsa(x))`` as one GPSA layer: per output channel, the projection times the BN scale, bias shifted."""
    layer, (scale, shift) = branch.conv, _bn_scale_shift(branch.bn)
    layer.proj_weight.mul_(scale.view(-1, 1, 1).to(layer.proj_weight))
    bias = shift if layer.proj_bias is None else layer.proj_bias * scale + shift
    layer.proj_bias = nn.Parameter(bias.to(layer.proj_weight))
    return layer


@torch.no_grad()
def _fold_pointwise(block: nn.Module, pointwise: Optional[ConvNormAct], in_chs: int, out_chs: int,
                    stride: Tuple[int, int]) -> Optional[nn.Conv2d]:
    """The 1x1 conv + BN branch and the identity BN of ``block`` as one 1x1 conv with bias (None if neither)."""
    identity = block.identity
    if pointwise is None and identity is None:
        return None
    groups = block.groups
    ref = pointwise.conv.weight if pointwise is not None else identity.weight
    weight = torch.zeros(out_chs, in_chs // groups, 1, 1, dtype=ref.dtype, device=ref.device)
    bias = torch.zeros(out_chs, dtype=ref.dtype, device=ref.device)
    if pointwise is not None:
        scale, shift = _bn_scale_shift(pointwise.bn)
        weight += pointwise.conv.weight * scale.view(-1, 1, 1, 1)
        bias += shift if pointwise.conv.bias is None else pointwise.conv.bias * scale + shift
    if identity is not None:  # channel i of the input to channel i of the output, within its group
        scale, shift = _bn_scale_shift(identity)
        channels = torch.arange(out_chs, device=ref.device)
        weight[channels, channels % (in_chs // groups), 0, 0] += scale
        bias += shift
    conv = nn.Conv2d(in_chs, out_chs, 1, stride=stride, groups=groups, bias=True, device=ref.device, dtype=ref.dtype)
    conv.weight.copy_(weight)
    conv.bias.copy_(bias)
    return conv


def _reparameterize(block: nn.Module, kxk: List[ConvNormAct], pointwise: Optional[ConvNormAct],
                    names: Tuple[str, ...]) -> None:
    """Replace the branches of ``block`` by ``reparam_conv = FusedBranches(...)`` and delete them, as timm does."""
    layer = kxk[0].conv
    conv = _fold_pointwise(block, pointwise, layer.in_chs, layer.out_chs, layer.stride)
    fused = FusedBranches([_fold_bn_into_gpsa(branch) for branch in kxk], conv)
    for name, param in block.named_parameters():  # timm detaches what it drops; the GPSA layers stay trainable
        if not name.startswith('conv_kxk'):
            param.detach_()
    block.reparam_conv = fused
    for name in names:
        delattr(block, name)


class TransformedRepVggBlock(RepVggBlock):
    """A timm ``RepVggBlock`` whose k x k conv is a GPSA layer; ``reparameterize()`` as in the module docstring."""

    def reparameterize(self) -> None:
        """Fuse the BN and 1x1 branches for inference; the GPSA layer stays (see ``tcnn.convert.fusion``)."""
        if self.reparam_conv is not None:
            return
        if not isinstance(self.conv_kxk.conv, GPSA):
            return super().reparameterize()
        _reparameterize(self, [self.conv_kxk], self.conv_1x1, ('conv_kxk', 'conv_1x1', 'identity', 'drop_path'))


class TransformedMobileOneBlock(MobileOneBlock):
    """A timm ``MobileOneBlock`` whose k x k convs are GPSA layers; ``reparameterize()`` as in the module
    docstring (each of its ``num_conv_branches`` GPSA layers is kept)."""

    def reparameterize(self) -> None:
        """Fuse the BN and 1x1 branches for inference; the GPSA layers stay (see ``tcnn.convert.fusion``)."""
        if self.reparam_conv is not None:
            return
        if not isinstance(self.conv_kxk[0].conv, GPSA):  # its branches are converted together or not at all
            return super().reparameterize()
        _reparameterize(self, list(self.conv_kxk), self.conv_scale,
                        ('conv_kxk', 'conv_scale', 'identity', 'drop_path'))


_SUBCLASSES = {RepVggBlock: TransformedRepVggBlock, MobileOneBlock: TransformedMobileOneBlock}


def adopt_fusion(model: nn.Module) -> List[Tuple[nn.Module, type]]:
    """Re-class every multi-branch block of ``model`` that holds a GPSA layer (see the module docstring); returns
    the blocks with their previous classes, so that a failed conversion can put them back."""
    changed = []
    for module in model.modules():
        cls = _SUBCLASSES.get(type(module))
        if cls is not None and any(isinstance(m, GPSA) for m in module.modules()):
            changed.append((module, type(module)))
            module.__class__ = cls
    return changed
