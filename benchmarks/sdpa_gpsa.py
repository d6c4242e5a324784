"""The alternative design of ``tcnn.GPSA``: content attention through ``scaled_dot_product_attention``.

``tcnn.GPSA`` mixes the content and positional attentions into one ``N_h x N_q x N_k`` matrix and applies it to the
values once. The obvious alternative keeps the content branch a standard attention call, so that a fused kernel can
avoid materialising the content matrix, and applies the batch-shared positional attention with a separate matmul:

    heads_h = (1 - g_h) * SDPA(Q_h, K_h, V) + g_h * P_h V    (T-CNN eq. 7, arXiv:2106.05795, after the values)

It computes the same function (exactly, up to rounding) with the same parameters; it differs in cost only: two
value products instead of one, and SDPA with a value width of C_in (512 in ResNet last stages), above the flash
kernels' head-dim limit, so the efficient or math backends run. The benchmark measures which is faster.
"""
import torch
import torch.nn.functional as F

from tcnn.layers.gpsa import GPSA
from tcnn.layers.projections import grouped_values, output_projection, pad

__all__ = ['SdpaGPSA', 'to_sdpa']


class SdpaGPSA(GPSA):
    """``tcnn.GPSA`` with an SDPA content path and a separate positional matmul (same parameters, same function)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[0], x.shape[1]
        h_out, w_out = self.output_size(x.shape[-2], x.shape[-1])
        x_pad = pad(x, self.geometry)
        ay, ax = self.anchor
        sy, sx = self.stride
        x_q = x_pad[:, :, ay::sy, ax::sx][:, :, :h_out, :w_out].reshape(b, c, h_out * w_out)
        tokens = x_pad.flatten(2)
        q = torch.matmul(self.q_weight, x_q).view(b, self.num_heads, self.qk_dim, -1).transpose(-1, -2)
        k = torch.matmul(self.k_weight, tokens).view(b, self.num_heads, self.qk_dim, -1).transpose(-1, -2)
        if self.groups == 1:
            v = torch.matmul(self.v_weight, tokens).transpose(1, 2)  # (B, N_k, C_in), shared by the heads
        else:
            v = grouped_values(tokens.transpose(1, 2), self.v_weight, self.in_chs, self.groups)
        v_heads = v[:, None].expand(b, self.num_heads, v.shape[1], c)
        content = F.scaled_dot_product_attention(q, k, v_heads, scale=self.scale)  # (B, N_h, N_q, C_in)
        pos = self.positional_attention(x.shape[-2], x.shape[-1], x.device).to(v.dtype)
        positional = torch.matmul(pos, v[:, None])  # (B, N_h, N_q, C_in): the batch-shared map, second product
        gate = torch.sigmoid(self.gating.float()).to(v.dtype)[:, None, None]
        heads = torch.lerp(content, positional, gate)
        # Per query the N_h head outputs one after the other, [q][h][c] as in GPSA.forward, and its projection.
        heads = heads.transpose(1, 2).reshape(b, h_out * w_out * self.num_heads, c)
        out = output_projection(heads, self.proj_weight, self.proj_bias, self.geometry, in_chs=self.in_chs,
                                out_chs=self.out_chs, b=b, n_q=h_out * w_out)  # (B, N_q, C_out)
        return out.transpose(1, 2).reshape(b, self.out_chs, h_out, w_out)


def to_sdpa(model: torch.nn.Module) -> torch.nn.Module:
    """Switch every ``GPSA`` of ``model`` to the SDPA design in place (same parameters) and return it."""
    for module in model.modules():
        if type(module) is GPSA:
            module.__class__ = SdpaGPSA
    return model
