"""The GPSA layer written out from the papers' formulas alone, in float64: the independent reference of the tests
(tests/test_gpsa.py, tests/test_precision.py). Nothing of ``tcnn.layers`` is called but the layer's geometry
attributes (padding, stride, anchor, heads, output size)."""
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from tcnn.layers.gpsa import GPSA


def dense_blocks(blocks: torch.Tensor, groups: int) -> torch.Tensor:
    """A grouped weight ``(O, ..., C_in / g)`` as the dense block-diagonal ``(O, ..., C_in)``: output ``o`` reads the
    input channels of group ``o // (O / g)`` (``nn.Conv2d``'s groups)."""
    o, cg = blocks.shape[0], blocks.shape[-1]
    dense = blocks.new_zeros(*blocks.shape[:-1], cg * groups)
    for g in range(groups):
        rows = slice(g * o // groups, (g + 1) * o // groups)
        dense[rows, ..., g * cg:(g + 1) * cg] = blocks[rows]
    return dense


def gpsa_formula(gpsa: GPSA, x: torch.Tensor, params: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """The layer written out from the papers' formulas alone, in float64, from its parameters (nothing of the layer's
    own code: no positional_attention, no separable softmax, no skipped padding, dense matrices for groups).

    * positional attention (T-CNN, arXiv:2106.05795, eqs. 3-4; ConViT, arXiv:2103.10697, eq. 5):
      ``softmax_k(v_pos^h . r_qk)`` with ``r_qk = (|delta|^2, delta_1, delta_2)``, ``delta = key - query`` and
      ``v_pos^h = -alpha_h (1, -2 Delta^h_1, -2 Delta^h_2)``, ``alpha_h = softplus(raw_h, beta=5)`` (T-CNN footnote 1),
      over every key of the padded grid;
    * content attention ``softmax(Q_h K_h^T / sqrt(d))`` (T-CNN eq. 1) over the same keys;
    * gating ``(1 - sigmoid(lambda_h)) content + sigmoid(lambda_h) positional`` (T-CNN eq. 7, ConViT eq. 8);
    * ``out = sum_h A_h X W_val W_out^h + bias`` (T-CNN eqs. 5-6).

    ``params``: float64 tensors to use in place of the layer's parameters, by name (e.g. leaves that require grad, for
    the formula's own gradients); the others are the layer's, detached.
    """
    p = {name: t.detach().double() for name, t in gpsa.named_parameters()}
    p.update(params or {})
    x = x.double()
    mode = 'constant' if gpsa.padding_mode == 'zeros' else gpsa.padding_mode
    (ph, pw), (ay, ax), (sy, sx) = gpsa.padding, gpsa.anchor, gpsa.stride
    h_out, w_out = gpsa.output_size(x.shape[-2], x.shape[-1])
    x_pad = F.pad(x, (pw, pw, ph, ph), mode=mode)
    hp, wp = x_pad.shape[-2:]
    keys = x_pad.flatten(2)  # (B, C, N_k), row-major over the padded grid
    queries = x_pad[:, :, ay::sy, ax::sx][:, :, :h_out, :w_out].flatten(2)  # (B, C, N_q)
    # positions in padded coordinates: keys every pixel, queries where the conv's window is anchored
    key_pos = torch.stack(torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing='ij'), -1).reshape(-1, 2)
    query_pos = torch.stack(torch.meshgrid(torch.arange(h_out) * sy + ay, torch.arange(w_out) * sx + ax,
                                           indexing='ij'), -1).reshape(-1, 2)
    delta = (key_pos[None] - query_pos[:, None]).double()  # (N_q, N_k, 2)
    r = torch.cat([delta.square().sum(-1, keepdim=True), delta], dim=-1)  # (N_q, N_k, 3)
    alpha = torch.log1p(torch.exp(5 * p['pos_locality'])) / 5
    v_pos = -alpha[:, None] * torch.cat([torch.ones_like(alpha)[:, None], -2 * p['pos_centers']], dim=-1)  # (N_h, 3)
    positional = torch.einsum('hr,qkr->hqk', v_pos, r).softmax(-1)
    n_h, d = gpsa.num_heads, gpsa.qk_dim
    q = torch.einsum('oc,bcn->bon', p['q_weight'], queries).unflatten(1, (n_h, d))
    k = torch.einsum('oc,bcn->bon', p['k_weight'], keys).unflatten(1, (n_h, d))
    content = (torch.einsum('bhdq,bhdk->bhqk', q, k) / d ** 0.5).softmax(-1)
    gate = 1 / (1 + torch.exp(-p['gating']))[:, None, None]
    attn = (1 - gate) * content + gate * positional  # (B, N_h, N_q, N_k)
    values = torch.einsum('oc,bck->bko', dense_blocks(p['v_weight'], gpsa.groups), keys)  # X W_val
    heads = torch.einsum('bhqk,bkc->bhcq', attn, values)  # A_h X W_val, (B, N_h, C_in, N_q)
    out = torch.einsum('ohc,bhcq->boq', dense_blocks(p['proj_weight'], gpsa.groups), heads)  # sum_h ... W_out^h
    if gpsa.proj_bias is not None:
        out = out + p['proj_bias'][:, None]
    return out.view(x.shape[0], -1, h_out, w_out)
