"""GPSA written the obvious way: the baseline that ``tcnn.GPSA`` is measured against.

This is how a T-CNN layer comes out when ConViT's GPSA (arXiv:2103.10697) is taken as is and given the T-CNN
loading (arXiv:2106.05795 section 2: one head per tap, ``W_val = I``, ``W_out^h`` = filter tap), with BoTNet's
handling of stride:

* token-major layout ``(B, N, C)`` with per-head reshapes and permutes, as in ViT/ConViT code;
* positional scores computed *per sample* from the relative encodings ``r_qk = (|delta|^2, delta_row, delta_col)``
  and the per-head embedding ``v_pos^h = -alpha_h (1, -2 Delta_h)`` (T-CNN eqs. 3-4): the encodings are expanded
  over the batch and projected, like ConViT's ``pos_proj(rel_indices.expand(B, ...))``;
* the full 2-D softmax and the gated mixture (T-CNN eq. 7) materialised per sample;
* values per head: every head gathers its own ``(N_q, C_in)`` values, which are then concatenated and projected;
* stride by attention at full resolution (every stride-1 output position is a query) followed by subsampling or
  average pooling, as BoTNet does for its strided block. Subsampling equals the strided conv exactly; average
  pooling (BoTNet's choice) changes the function and is only offered to measure its cost.

The parameters have the names and shapes of a dense ``tcnn.GPSA``, so ``ReferenceGPSA.from_gpsa`` runs the same
function the obvious way, and ``from_conv`` loads a conv filter exactly as ``GPSA.from_conv`` does. A grouped or
depthwise layer is taken the obvious way too: its block-diagonal ``W_val`` and taps as dense matrices. Only zero
padding is supported.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tcnn.layers.gpsa import GPSA, _pair, locality_to_raw

__all__ = ['ReferenceGPSA', 'to_reference']


class ReferenceGPSA(nn.Module):
    """Straightforward GPSA (ConViT/BoTNet style) with the parameters of ``tcnn.GPSA``.

    Args:
        in_chs: Input channels C_in.
        out_chs: Output channels C_out.
        kernel_size: Kernel size of the conv; one head per tap.
        stride: Stride of the conv, applied after attention at full resolution.
        padding: Zero padding of the conv.
        dilation: Dilation of the conv.
        bias: Whether to add an output bias.
        qk_dim: Per-head width of queries and keys (default ``C_in // heads`` as in ``tcnn.GPSA``).
        locality_strength: Initial alpha of every head.
        gating_init: Initial lambda of every head.
        downsample: ``'subsample'`` (keep every stride-th output: equals the strided conv) or ``'avgpool'``
            (BoTNet: average the stride x stride window; not the conv's function).
    """

    def __init__(
            self,
            in_chs: int,
            out_chs: int,
            kernel_size: int = 3,
            stride: int = 1,
            padding: int = 1,
            dilation: int = 1,
            bias: bool = False,
            qk_dim: Optional[int] = None,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            downsample: str = 'subsample',
    ):
        super().__init__()
        if downsample not in ('subsample', 'avgpool'):
            raise ValueError(f'downsample must be "subsample" or "avgpool", got {downsample!r}')
        kh, kw = _pair(kernel_size, 'kernel_size', ge=1)
        self.in_chs, self.out_chs = in_chs, out_chs
        self.kernel_size = (kh, kw)
        self.stride = _pair(stride, 'stride', ge=1)
        self.padding = _pair(padding, 'padding', ge=0)
        self.dilation = _pair(dilation, 'dilation', ge=1)
        self.downsample = downsample
        self.num_heads = kh * kw
        self.qk_dim = qk_dim or max(in_chs // self.num_heads, 1)
        self.scale = self.qk_dim ** -0.5
        self.anchor = ((kh - 1) // 2 * self.dilation[0], (kw - 1) // 2 * self.dilation[1])

        qk_out = self.num_heads * self.qk_dim
        self.q_weight = nn.Parameter(torch.randn(qk_out, in_chs) * 0.02)
        self.k_weight = nn.Parameter(torch.randn(qk_out, in_chs) * 0.02)
        self.v_weight = nn.Parameter(torch.eye(in_chs))
        self.proj_weight = nn.Parameter(torch.randn(out_chs, self.num_heads, in_chs) * in_chs ** -0.5)
        self.proj_bias = nn.Parameter(torch.zeros(out_chs)) if bias else None
        self.pos_centers = nn.Parameter(_kernel_centers(self.kernel_size, self.dilation, self.anchor))
        self.pos_locality = nn.Parameter(torch.full((self.num_heads,), locality_to_raw(locality_strength)))
        self.gating = nn.Parameter(torch.full((self.num_heads,), float(gating_init)))

    @classmethod
    def from_conv(
            cls,
            conv: nn.Conv2d,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            qk_dim: Optional[int] = None,
            downsample: str = 'subsample',
    ) -> 'ReferenceGPSA':
        """Load ``conv`` the T-CNN way (T-CNN eq. 6); q/k are random, as in ``GPSA.from_conv``."""
        return cls.from_gpsa(GPSA.from_conv(conv, locality_strength, gating_init, qk_dim=qk_dim), downsample)

    @classmethod
    def from_gpsa(cls, gpsa: GPSA, downsample: str = 'subsample') -> 'ReferenceGPSA':
        """The same function as ``gpsa`` (a copy of its parameters), computed the obvious way; the blocks of a
        grouped layer become dense block-diagonal matrices."""
        if gpsa.padding_mode != 'zeros':
            raise ValueError(f'the reference GPSA supports zero padding only, got {gpsa.padding_mode!r}')
        ref = cls(gpsa.in_chs, gpsa.out_chs, gpsa.kernel_size, gpsa.stride, gpsa.padding, gpsa.dilation,
                  bias=gpsa.proj_bias is not None, qk_dim=gpsa.qk_dim, downsample=downsample)
        state = gpsa.state_dict()
        if gpsa.groups > 1:
            state['v_weight'] = block_diagonal(state['v_weight'], gpsa.groups)
            state['proj_weight'] = block_diagonal(state['proj_weight'].transpose(1, 2), gpsa.groups).transpose(1, 2)
        ref.load_state_dict(state)
        return ref.to(device=gpsa.q_weight.device, dtype=gpsa.q_weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        n_h, d = self.num_heads, self.qk_dim
        ph, pw = self.padding
        x_pad = F.pad(x, (pw, pw, ph, ph))
        hp, wp = x_pad.shape[-2:]
        # Attention at full resolution: every stride-1 output position is a query (BoTNet), strided afterwards.
        h1 = hp - self.dilation[0] * (self.kernel_size[0] - 1)
        w1 = wp - self.dilation[1] * (self.kernel_size[1] - 1)
        ay, ax = self.anchor
        tokens = x_pad.flatten(2).transpose(1, 2)  # (B, N_k, C), token-major as in ViT code
        queries = x_pad[:, :, ay:ay + h1, ax:ax + w1].flatten(2).transpose(1, 2)  # (B, N_q, C)
        n_q, n_k = queries.shape[1], tokens.shape[1]

        q = F.linear(queries, self.q_weight).reshape(b, n_q, n_h, d).permute(0, 2, 1, 3)
        k = F.linear(tokens, self.k_weight).reshape(b, n_k, n_h, d).permute(0, 2, 1, 3)
        content = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)  # (B, N_h, N_q, N_k)

        # Positional scores per sample: v_pos^h . r_qk (T-CNN eqs. 3-4). The constant alpha |Delta|^2 that
        # completes the square cancels in the softmax.
        rel = _relative_encodings(h1, w1, hp, wp, (ay, ax), x.device).to(x.dtype)  # (N_q, N_k, 3)
        alpha = F.softplus(self.pos_locality, beta=5.0)
        v_pos = -alpha[:, None] * torch.cat([torch.ones_like(alpha)[:, None], -2 * self.pos_centers], dim=1)
        pos = F.linear(rel.expand(b, -1, -1, -1), v_pos.to(x.dtype))  # (B, N_q, N_k, N_h)
        pos = pos.permute(0, 3, 1, 2).softmax(dim=-1)

        gate = torch.sigmoid(self.gating)[None, :, None, None].to(x.dtype)
        attn = (1 - gate) * content + gate * pos  # T-CNN eq. 7

        v = F.linear(tokens, self.v_weight)  # (B, N_k, C_in), W_val shared by the heads
        heads = attn @ v[:, None]  # (B, N_h, N_q, C_in): every head gathers its own values
        # Concatenate the heads (T-CNN eq. 5) and project with W_out = [W_out^1 ... W_out^N_h].
        heads = heads.permute(0, 2, 1, 3).reshape(b, n_q, n_h * self.in_chs)
        out = F.linear(heads, self.proj_weight.view(self.out_chs, -1), self.proj_bias)  # (B, N_q, C_out)
        out = out.transpose(1, 2).reshape(b, self.out_chs, h1, w1)

        sy, sx = self.stride
        if sy == 1 and sx == 1:
            return out
        if self.downsample == 'avgpool':
            return F.avg_pool2d(out, (sy, sx), ceil_mode=True)
        return out[:, :, ::sy, ::sx]


def block_diagonal(blocks: torch.Tensor, groups: int) -> torch.Tensor:
    """``(rows, cols, ...)`` blocks of ``groups`` groups (rows grouped, as in a grouped conv filter) as the dense
    ``(rows, cols * groups, ...)`` block-diagonal matrix."""
    rows, cols = blocks.shape[:2]
    dense = blocks.new_zeros(rows, cols * groups, *blocks.shape[2:])
    step = rows // groups
    for g in range(groups):
        dense[g * step:(g + 1) * step, g * cols:(g + 1) * cols] = blocks[g * step:(g + 1) * step]
    return dense


def _kernel_centers(kernel_size, dilation, anchor) -> torch.Tensor:
    ky = torch.arange(kernel_size[0], dtype=torch.float32) * dilation[0] - anchor[0]
    kx = torch.arange(kernel_size[1], dtype=torch.float32) * dilation[1] - anchor[1]
    return torch.stack(torch.meshgrid(ky, kx, indexing='ij'), dim=-1).reshape(-1, 2)


def _relative_encodings(h_q: int, w_q: int, hp: int, wp: int, anchor, device: torch.device) -> torch.Tensor:
    """``r_qk = (|delta|^2, delta_row, delta_col)`` with ``delta = key - query``, ``(N_q, N_k, 3)``."""
    qy, qx = torch.meshgrid(torch.arange(h_q, device=device) + anchor[0],
                            torch.arange(w_q, device=device) + anchor[1], indexing='ij')
    ky, kx = torch.meshgrid(torch.arange(hp, device=device), torch.arange(wp, device=device), indexing='ij')
    dy = (ky.reshape(1, -1) - qy.reshape(-1, 1)).float()
    dx = (kx.reshape(1, -1) - qx.reshape(-1, 1)).float()
    return torch.stack([dy ** 2 + dx ** 2, dy, dx], dim=-1)


def to_reference(model: nn.Module, downsample: str = 'subsample') -> nn.Module:
    """Replace every ``tcnn.GPSA`` of ``model`` (in place) by a ``ReferenceGPSA`` with the same parameters."""
    names = [name for name, module in model.named_modules() if isinstance(module, GPSA)]
    for name in names:
        model.set_submodule(name, ReferenceGPSA.from_gpsa(model.get_submodule(name), downsample))
    return model
