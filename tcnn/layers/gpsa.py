"""Gated Positional Self-Attention (GPSA) that can reproduce a k x k convolution exactly: T-CNN (d'Ascoli et al.
2021, arXiv:2106.05795) section 2 on top of the GPSA of ConViT (d'Ascoli et al. 2021, arXiv:2103.10697) section 3.

One head per kernel tap, head ``h = ky * kw + kx`` (row-major, the order of ``conv.weight.flatten(1)``). Queries are
the conv's output positions and keys the input padded as the conv pads it, so borders and strides are exact (a
stride-2 conv needs no pooling). The equations, and the code that computes each, in the order ``GPSA.forward`` runs
them:

* queries ``Q_h``, keys ``K_h`` and values ``X W_val``, one ``W_val`` shared by all heads (the identity at conversion,
  T-CNN eq. 6): ``GPSA._project`` (``tcnn.layers.projections.project``);
* content scores ``Q_h K_h^T / sqrt(d_qk)`` (T-CNN eq. 1, ConViT eq. 1): ``content_scores``
  (``tcnn.layers.content``);
* what does not depend on the input's values, ``GPSA._attention_terms`` (in eager mode kept from call to call,
  ``GPSA._kept_attention_terms``): the positional attention ``softmax_k(-alpha_h |delta_qk - Delta_h|^2)``,
  ``delta = key - query`` (T-CNN eq. 4, ConViT eq. 5), separable into a row and a column softmax
  (``GPSA._positional_and_gate``, ``tcnn.layers.positional``; ``delta``: ``GPSA._offsets``), with
  ``alpha_h = softplus(pos_locality_h, beta=5)`` (T-CNN footnote 1, ``GPSA.locality_strength``), and the gates
  ``sigmoid(lambda_h)`` (T-CNN eq. 7, ``GPSA.gate``);
* the content softmax over the padded grid of keys (T-CNN eq. 1): ``GPSA._content_attention``;
* the gated mixture ``A_h = (1 - sigmoid(lambda_h)) content_h + sigmoid(lambda_h) positional_h`` (T-CNN eq. 7):
  ``_lerp``;
* ``out = sum_h A_h X W_val W_out^h + bias``, ``W_out^h`` the conv filter's tap ``h`` (T-CNN eqs. 5-6):
  ``GPSA._value_product`` (``tcnn.layers.projections.output_projection``; depthwise layers
  ``tcnn.layers.depthwise``).

Grouped and depthwise convs keep their groups: ``W_val`` and every ``W_out^h`` are block-diagonal (diagonal for
depthwise), stored as the groups' blocks only, while the attention is shared by all channels. The computation reads
the layer's geometry as one frozen ``Geometry`` (``tcnn.layers.geometry``), made in the constructor; every attention
computation runs in ``promote_types(dtype, float32)``; which of the forward's three paths runs (eager, TorchScript,
exporters and tracers) is decided once per call, by ``_forward_path``. Why the layer is computed this way
(token-major, one mixed attention matrix, keys and values projected before padding, few operators) and what each
choice measured: ``docs/benchmarks.md``, "Design choices of the GPSA layer".
"""
import math
from typing import Any, Dict, Optional, Set, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .content import (at_least_float32, attention_dtype, content_attention, content_scores, padded_keys_logit,
                      real_key_content_attention)
from .depthwise import attend_depthwise, attend_heads_first, attend_traceable
from .geometry import Geometry, conv_geometry, kernel_centers, output_size
from .kept_values import KEPT_ATTRIBUTE, forget, is_exporting, keep, may_keep
from .positional import axis_offsets, outer, positional_factors
from .projections import add_bias, output_projection, project, upgrade_proj_weight
from .. import compat
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number
from ..gpsa_parameters import SOFTPLUS_BETA

__all__ = ['GPSA', 'EXACT_LOCALITY', 'EXACT_GATING', 'locality_to_raw', 'check_unsharded']

# Locality strength and gate of the exact configuration (alpha >= 30 and lambda >= 20 suffice in float32).
# With alpha = 50 a neighbouring tap gets weight exp(-50) ~ 2e-22, and sigmoid(40) = 1 - 4e-18 rounds to 1.0 in
# float64 too (sigmoid(25) = 1 - 1.4e-11 does so in float32 only, and a float64 layer computes its gate in float64),
# so the layer is the conv up to matmul rounding in either precision.
EXACT_LOCALITY = 50.0
EXACT_GATING = 40.0

_PairInt = Union[int, Tuple[int, int]]


class GPSA(nn.Module):
    """Gated positional self-attention with one head per tap of a ``kh x kw`` kernel: a drop-in for the
    ``nn.Conv2d`` it stands for (same input, output shape and memory format, any input size), which it equals in
    the exact configuration (``locality_strength=EXACT_LOCALITY``, ``gating_init=EXACT_GATING``, ``from_conv``).

    Parameters: ``q_weight``, ``k_weight`` ``(N_h * qk_dim, C_in)``; ``v_weight`` ``(C_in, C_in // groups)``
    (``W_val``, block-diagonal); ``proj_weight`` ``(C_out, N_h, C_in // groups)`` (``W_out^h``: per head its tap of
    the conv filter) and ``proj_bias``; per head ``pos_centers`` ``(N_h, 2)``, ``pos_locality`` (raw alpha) and
    ``gating`` (lambda). Attention runs in ``promote_types(dtype, float32)``. The geometry is one frozen ``geometry``
    (``tcnn.layers.geometry.Geometry``), made here and the one the computation reads, passed whole to the layer's
    functions; its fields are also attributes, for readers (``kernel_size``, ``stride``, ``padding``, ``dilation``,
    ``anchor``, ``padding_mode``, ``groups``, ``num_heads``). The equations each method computes: the module
    docstring; the design and its measurements: ``docs/benchmarks.md`` ("Design choices of the GPSA layer").

    Args:
        in_chs: Input channels C_in.
        out_chs: Output channels C_out.
        kernel_size: Kernel size of the conv the layer stands for; ``kh * kw`` heads.
        stride: Stride of the conv; queries are the conv's output positions.
        padding: Symmetric padding (rows, cols) of the conv.
        dilation: Dilation of the conv; it spaces the attention centres.
        bias: Whether to add an output bias (the conv's bias).
        padding_mode: ``'zeros'``, ``'reflect'``, ``'replicate'`` or ``'circular'``, as in ``nn.Conv2d``.
        groups: Groups of the conv (``C_in`` for depthwise, ``C_out = m * C_in`` for a channel multiplier ``m``):
            ``proj_weight`` and ``W_val`` hold the blocks of block-diagonal matrices.
        qk_dim: Per-head width of content queries/keys; default ``max(C_in // N_h, 1)`` for a dense layer (56 for
            512 channels, which reproduces the parameter counts of T-CNN Table 2), ``max(min(C_in // N_h,
            C_in // groups), 1)`` for a grouped one.
        locality_strength: Initial alpha of every head (1.0 is the paper's fine-tuning init).
        gating_init: Initial lambda of every head (1.0 is the paper's fine-tuning init).
    """

    # values kept from call to call in eager mode (``tcnn.layers.kept_values``): plain Python, never part of a
    # TorchScript module
    __jit_ignored_attributes__ = [KEPT_ATTRIBUTE]
    # annotated for TorchScript, which otherwise types the attribute as a plain tuple, without its field names
    geometry: Geometry

    # Parameter roles in fine-tuning (T-CNN section 3, as in ConViT). The gates get their own learning rate
    # (``tcnn.param_groups``). No weight decay (``no_weight_decay()``) on: the positional geometry and the gates (as
    # ConViT exempts them); the conv's bias ``proj_bias`` (timm and DeiT decay no bias, so the CNN's bias was not
    # decayed: the conversion must not start decaying it); and ``W_val`` where it is a per-channel gain (depthwise:
    # ``(C_in, 1)``), which is norm-like (timm decays no 1-D gain; decay would pull the layer's identity init towards
    # a zero output). A dense or grouped ``W_val`` is a channel-mixing matrix, the ``nn.Linear`` values of
    # ConViT/T-CNN's own code, which timm's factory decays with DeiT's weight decay there: decayed here too. The
    # filter parameters are the conv's (T-CNN eq. 6).
    positional_params = ('pos_centers', 'pos_locality')
    gating_params = ('gating',)
    no_weight_decay_params = positional_params + gating_params + ('proj_bias',)
    filter_params = ('proj_weight', 'proj_bias')

    # ------------------------------------------------------------------ construction

    def __init__(
            self,
            in_chs: int,
            out_chs: int,
            kernel_size: _PairInt = 3,
            stride: _PairInt = 1,
            padding: _PairInt = 1,
            dilation: _PairInt = 1,
            *,
            bias: bool = False,
            padding_mode: str = 'zeros',
            groups: int = 1,
            qk_dim: Optional[int] = None,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        # checked here, not in the math below: a zero or NaN setting would build a layer that computes garbage
        in_chs = int(check_number(in_chs, 'in_chs', ge=1, integer=True))
        out_chs = int(check_number(out_chs, 'out_chs', ge=1, integer=True))
        kh, kw = _pair(kernel_size, 'kernel_size', ge=1)
        groups = int(check_number(groups, 'groups', ge=1, integer=True))
        if in_chs % groups or out_chs % groups:
            raise InvalidArgumentError(f'in_chs ({in_chs}) and out_chs ({out_chs}) must be divisible by groups '
                                       f'({groups})')
        if padding_mode not in ('zeros', 'reflect', 'replicate', 'circular'):
            raise InvalidArgumentError(f'padding_mode must be zeros, reflect, replicate or circular, got '
                                       f'{padding_mode!r}')
        if qk_dim is not None:
            check_number(qk_dim, 'qk_dim', ge=1, integer=True)
        check_number(locality_strength, 'locality_strength', gt=0)
        check_number(gating_init, 'gating_init')
        self.in_chs = in_chs
        self.out_chs = out_chs
        # what the computation reads (and nothing else of the conv's settings), passed whole to the functions of
        # tcnn.layers; made once, never changed
        self.geometry = conv_geometry((kh, kw), _pair(stride, 'stride', ge=1), _pair(padding, 'padding', ge=0),
                                      _pair(dilation, 'dilation', ge=1), padding_mode, groups)
        # its fields as attributes too (nn.Conv2d's names, and ``anchor``: the query position inside the receptive
        # field, in padded coordinates, the centre tap for odd kernels), for readers, not read by the computation:
        # plain attributes, not properties, as a scripted module shows TorchScript's properties to Python as property
        # objects
        (self.kernel_size, self.stride, self.padding, self.dilation, self.anchor, self.padding_mode, self.groups,
         self.num_heads) = self.geometry
        # groups of the source conv, for the source CNN's parameter count (conv_parameters): the same as groups,
        # except in a layer that match_grouped_storage rebuilt dense for a file with a dense filter
        self.conv_groups = groups
        num_heads = self.geometry.num_heads
        self.qk_dim = int(qk_dim) if qk_dim is not None else max(min(in_chs // num_heads, in_chs // groups), 1)
        self.scale = self.qk_dim ** -0.5

        qk_out = num_heads * self.qk_dim
        self.q_weight = nn.Parameter(torch.empty(qk_out, in_chs, **dd))
        self.k_weight = nn.Parameter(torch.empty(qk_out, in_chs, **dd))
        # W_val, block-diagonal: row o holds the weights of input group o // (C_in // g), like a 1x1 grouped conv
        self.v_weight = nn.Parameter(torch.empty(in_chs, in_chs // groups, **dd))
        # W_out^h of every head: proj_weight[:, h] is tap h of the conv filter (T-CNN eq. 6), per group its block.
        self.proj_weight = nn.Parameter(torch.empty(out_chs, num_heads, in_chs // groups, **dd))
        self.proj_bias = nn.Parameter(torch.zeros(out_chs, **dd)) if bias else None
        self.pos_centers = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.pos_locality = nn.Parameter(torch.empty(num_heads, **dd))
        self.gating = nn.Parameter(torch.empty(num_heads, **dd))
        self.reset_parameters(locality_strength, gating_init)

    @classmethod
    def from_conv(
            cls,
            conv: nn.Conv2d,
            locality_strength: float = 1.0,
            gating_init: float = 1.0,
            qk_dim: Optional[int] = None,
    ) -> 'GPSA':
        """Build a GPSA layer that holds the filter of ``conv`` (T-CNN eq. 6: W_val = I, W_out^h = tap h).

        A grouped or depthwise conv (channel multipliers included) keeps its groups: the layer stores the filter
        as the conv does. ``padding='same'``/``'valid'`` and every ``padding_mode`` are supported. The result lives
        on the conv's device and dtype.
        """
        if not isinstance(conv, nn.Conv2d):
            raise InvalidTypeError(f'conv must be a torch.nn.Conv2d, got {type(conv).__name__}')
        # checked by the constructor, which names it (a conv takes a negative padding)
        padding = _string_padding(conv) if isinstance(conv.padding, str) else conv.padding
        weight = conv.weight.detach()
        gpsa = cls(
            conv.in_channels, conv.out_channels, kernel_size=conv.kernel_size, stride=conv.stride,
            padding=padding, dilation=conv.dilation, bias=conv.bias is not None,
            padding_mode=conv.padding_mode, groups=conv.groups, qk_dim=qk_dim, locality_strength=locality_strength,
            gating_init=gating_init, device=weight.device, dtype=weight.dtype,
        )
        with torch.no_grad():
            # (C_out, C_in / g, kh, kw) -> (C_out, N_h, C_in / g) with h = ky * kw + kx.
            gpsa.proj_weight.copy_(weight.flatten(2).transpose(1, 2))
            if conv.bias is not None:
                gpsa.proj_bias.copy_(conv.bias.detach())
        return gpsa

    def reset_parameters(self, locality_strength: float = 1.0, gating_init: float = 1.0) -> None:
        """Random q/k/proj, identity values, centres on the kernel taps, the given alpha and lambda."""
        nn.init.trunc_normal_(self.q_weight, std=0.02)
        nn.init.trunc_normal_(self.k_weight, std=0.02)
        nn.init.kaiming_uniform_(self.proj_weight.view(self.out_chs, -1), a=math.sqrt(5))  # fan-in N_h * C_in / g
        with torch.no_grad():
            groups = self.geometry.groups
            self.v_weight.copy_(torch.eye(self.in_chs // groups).repeat(groups, 1))  # per group identity
            self.pos_centers.copy_(self.kernel_centers())
        self.set_locality_strength(locality_strength)
        self.set_gating(gating_init)

    # ------------------------------------------------------------------ the forward, then its steps in call order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``out = sum_h A_h X W_val W_out^h + bias`` with ``A_h`` the gated mixture of the content and positional
        attentions (T-CNN eqs. 4-7): ``(B, C_in, H, W)`` -> ``(B, C_out, H_out, W_out)``, like the conv; an
        unbatched ``(C_in, H, W)`` input gives ``(C_out, H_out, W_out)``, as ``nn.Conv2d``'s does."""
        given, x = x, _batched_input(x, self.in_chs)  # the output: the shape and format given
        b, height, width = x.shape[0], x.shape[-2], x.shape[-1]
        h_out, w_out = self.output_size(height, width)
        scripted, exporting = _forward_path()
        q, k, v = self._project(x, (h_out, w_out))  # queries at the output positions; keys, values X W_val
        scores = content_scores(q, k, self.scale)  # Q_h K_h^T / sqrt(d_qk) (eq. 1), in the GEMM's dtype
        dtype = attention_dtype(scores.dtype)
        # positional attention (eq. 4) and gates sigmoid(lambda_h), kept from call to call in eager mode. The test is
        # `scripted` as TorchScript reads it when it compiles: it compiles the first branch only
        if torch.jit.is_scripting():
            log_pad, pos, gate = self._attention_terms(height, width, x.device, dtype)
        else:
            log_pad, pos, gate = self._kept_attention_terms(height, width, x.device, dtype)
        content = self._content_attention(scores, log_pad, height, width)  # softmax over the keys
        attn = _lerp(content, pos, gate, exporting)  # eq. 7, both attentions in one matrix, query-major
        out = self._value_product(attn, v, scripted, exporting)  # sum_h A_h V W_out^h + bias (eqs. 5-6)
        out = out.view(b, h_out, w_out, self.out_chs).permute(0, 3, 1, 2)  # NCHW, channels_last in memory
        return _like_input_format(out, given)

    def output_size(self, height: int, width: int) -> Tuple[int, int]:
        """Spatial size of the output for an input of ``height x width`` (the conv's formula)."""
        return output_size(height, width, self.geometry)

    def _project(self, x: torch.Tensor,
                 out_size: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``(B, N_h, N_q, d)`` at the ``out_size`` output positions, keys ``(B, N_h, d, N_k)`` and values
        ``X W_val`` ``(B, N_k, C_in)`` of input ``x`` (``tcnn.layers.projections.project``)."""
        return project(x, self.q_weight, self.k_weight, self.v_weight, self.geometry, qk_dim=self.qk_dim,
                       in_chs=self.in_chs, out_size=out_size)

    def _attention_terms(self, height: int, width: int, device: torch.device,
                         dtype: torch.dtype) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
        """The attention's terms that do not depend on the input's values, in ``dtype``: the logit ``log(n_pad)`` of
        the padded keys (``padded_keys_logit``) and ``_positional_and_gate``, computed on every call."""
        pos, gate = self._positional_and_gate(height, width, dtype, self._offsets(height, width, device))
        return padded_keys_logit(height, width, self.geometry, device, dtype), pos, gate

    def _offsets(self, height: int, width: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, bool]:
        """``positional.axis_offsets`` of this layer, in the dtype of its positional computation."""
        return axis_offsets(height, width, self.geometry, device=device, dtype=attention_dtype(self.pos_locality.dtype))

    def _positional_and_gate(self, height: int, width: int, dtype: torch.dtype,
                             offsets: Tuple[torch.Tensor, torch.Tensor, bool]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The positional attention query-major, ``(N_q, N_h, keys_h, keys_w)`` (T-CNN eq. 4; real keys only with
        zero padding, whose padded values are zero), and the gate ``sigmoid(lambda)`` ``(N_h, 1, 1)``, both in
        ``dtype``: what T-CNN eq. 7 mixes into the content attention."""
        geometry = self.geometry
        py, px = positional_factors(self.locality_strength(), at_least_float32(self.pos_centers).t(), offsets,
                                    geometry, height=height, width=width, real_keys=geometry.padding_mode == 'zeros')
        pos = outer(py, px).to(dtype).transpose(0, 1)
        return pos, self.gate().to(dtype)[:, None, None]

    def _content_attention(self, scores: torch.Tensor, log_pad: Optional[torch.Tensor], height: int,
                           width: int) -> torch.Tensor:
        """The content softmax of ``content_scores`` (T-CNN eq. 1), query-major ``(B, N_q, N_h, keys_h, keys_w)``,
        normalised over the padded grid of keys. With zero padding the padded tokens have zero values, so only the
        real keys are returned (the padded ones normalise through ``log_pad``: ``real_key_content_attention``)."""
        if self.geometry.padding_mode == 'zeros':
            return real_key_content_attention(scores, log_pad, height, width)
        return content_attention(scores, self.geometry, height, width).transpose(1, 2)

    def _value_product(self, attn: torch.Tensor, v: torch.Tensor, scripted: bool, exporting: bool) -> torch.Tensor:
        """``sum_h A_h V W_out^h + bias`` (T-CNN eqs. 5-6): the mixed attention ``(B, N_q, N_h, keys_h, keys_w)``
        and the values ``(B, N_k, C_in)`` -> ``(B, N_q, C_out)``.

        Dense and grouped layers attend first, ``(B, N_q * N_h, C_in)`` (per query, the ``N_h`` attended value
        vectors side by side: one im2col row of ``X W_val``), then project in one GEMM (``output_projection``).
        Depthwise layers (diagonal taps) take one of three forms of the same product, by ``_forward_path``: eager
        mode the faster order for the shape (``attend_depthwise``); TorchScript, which cannot call that autograd
        function, attends first (``attend_heads_first``); exporters and tracers get plain ops without the order and
        chunks chosen from the sizes (``attend_traceable``)."""
        b, n_q, n_k = attn.shape[0], attn.shape[1], attn.shape[-2] * attn.shape[-1]
        if self.geometry.groups != self.in_chs:
            heads = torch.bmm(attn.reshape(b, n_q * self.geometry.num_heads, n_k).to(v.dtype), v)
            return output_projection(heads, self.proj_weight, self.proj_bias, self.geometry, in_chs=self.in_chs,
                                     out_chs=self.out_chs, b=b, n_q=n_q)
        attn = attn.reshape(b, n_q, self.geometry.num_heads * n_k)
        taps = self.proj_weight.view(self.out_chs, self.geometry.num_heads).t()  # (N_h, C_out), a view
        if exporting:
            out = attend_traceable(attn, v, taps)
        elif scripted:
            out = attend_heads_first(attn, v, taps)
        else:
            out = self._attend_depthwise(attn, v, taps)
        return add_bias(out, self.proj_bias)

    @torch.jit.unused
    def _attend_depthwise(self, attn: torch.Tensor, v: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        return attend_depthwise(attn, v, taps)  # an autograd function: eager mode only

    # ------------------------------------------------------------------ introspection

    def attention(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Attention maps for input ``x``: dict of ``content`` ``(B, N_h, N_q, N_k)``, ``positional``
        ``(N_h, N_q, N_k)`` and ``mixed`` ``(B, N_h, N_q, N_k)``, plus the grid sizes as 0-d tensors.

        Keys index the padded grid ``(H + 2 p_h) x (W + 2 p_w)``, queries the ``H_out x W_out`` output grid. An
        unbatched ``(C_in, H, W)`` input counts as a batch of one.
        """
        x = _batched_input(x, self.in_chs)
        height, width = x.shape[-2], x.shape[-1]
        h_out, w_out = self.output_size(height, width)
        q, k, _ = self._project(x, (h_out, w_out))
        content = content_attention(content_scores(q, k, self.scale), self.geometry, height, width).flatten(-2)
        pos = self.positional_attention(height, width, x.device)
        mixed = torch.lerp(content, pos, self.gate()[:, None, None])
        ph, pw = self.geometry.padding
        key_size = [height + 2 * ph, width + 2 * pw]
        return {
            'content': content, 'positional': pos, 'mixed': mixed,
            'out_size': torch.tensor([h_out, w_out]), 'key_size': torch.tensor(key_size),
        }

    def positional_attention(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """Positional attention for an input of ``height x width``: ``(N_h, N_q, N_k)`` in float32 (float64 for a
        float64 layer).

        Shared by the whole batch. Keys are the padded grid (row-major), queries the conv's output positions.
        """
        py, px = positional_factors(self.locality_strength(), at_least_float32(self.pos_centers).t(),
                                    self._offsets(height, width, device), self.geometry, height=height, width=width,
                                    real_keys=False)
        return outer(py, px).flatten(-2)

    def gate(self) -> torch.Tensor:
        """Per-head weight of the positional attention, sigmoid(lambda), ``(N_h,)``."""
        return torch.sigmoid(at_least_float32(self.gating))

    def locality_strength(self) -> torch.Tensor:
        """Per-head locality strength alpha, ``(N_h,)``."""
        raw = at_least_float32(self.pos_locality)
        if not torch.jit.is_scripting():
            if not is_exporting() and not torch.compiler.is_compiling():
                return F.softplus(raw, beta=SOFTPLUS_BETA)  # eager: one kernel
        return softplus_beta_5(raw)

    def span(self) -> torch.Tensor:
        """Per-head attention span 1 / alpha, ``(N_h,)`` (T-CNN Fig. 4)."""
        return 1.0 / self.locality_strength()

    def kernel_centers(self) -> torch.Tensor:
        """Attention centres of the kernel taps, ``(N_h, 2)`` as (row, col) offsets from the query, row-major."""
        return kernel_centers(self.geometry)

    def conv_filter(self) -> torch.Tensor:
        """The output projection as a conv filter ``(C_out, C_in // groups, kh, kw)`` (``nn.Conv2d``'s layout for
        ``groups``): the conv the layer was made from, or what fine-tuning made of it (a copy)."""
        kh, kw = self.geometry.kernel_size
        return self.proj_weight.transpose(1, 2).reshape(self.out_chs, self.in_chs // self.geometry.groups, kh, kw)

    def conv_parameters(self) -> int:
        """Parameter count of the conv this layer stands for (filter and bias), to count the source CNN's."""
        kh, kw = self.geometry.kernel_size
        bias = self.out_chs if self.proj_bias is not None else 0
        return self.out_chs * (self.in_chs // self.conv_groups) * kh * kw + bias

    @property
    def in_channels(self) -> int:
        """``nn.Conv2d``'s name for ``in_chs``: timm blocks read it from the layer that replaced their conv (e.g.
        ``ConvNormAct.in_channels``, also under TorchScript)."""
        return self.in_chs

    @in_channels.setter
    def in_channels(self, value: int) -> None:
        # Torch-Pruning's tp.load_state_dict sets every public attribute that tp.state_dict read, after restoring the
        # layer's __dict__ (its weights and in_chs): the same value is accepted, another one (which would not resize
        # the weights) refused
        if value != self.in_chs:
            raise ValueError(f'in_channels of a GPSA layer follows its weights ({self.in_chs}); got {value}')

    @property
    def out_channels(self) -> int:
        """``nn.Conv2d``'s name for ``out_chs``."""
        return self.out_chs

    @out_channels.setter
    def out_channels(self, value: int) -> None:
        # as in_channels' setter
        if value != self.out_chs:
            raise ValueError(f'out_channels of a GPSA layer follows its weights ({self.out_chs}); got {value}')

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Names of the parameters that take no weight decay (timm's ``no_weight_decay()`` contract; reasons at
        ``no_weight_decay_params``): the positional and gating parameters, the bias, and a per-channel ``W_val``."""
        names = {n for n in self.no_weight_decay_params if getattr(self, n) is not None}
        if self.in_chs // self.geometry.groups == 1:
            names.add('v_weight')
        return names

    def extra_repr(self) -> str:
        g = self.geometry
        s = (f'{self.in_chs}, {self.out_chs}, kernel_size={g.kernel_size}, stride={g.stride}, padding={g.padding}, '
             f'dilation={g.dilation}, heads={g.num_heads}, qk_dim={self.qk_dim}')
        if g.padding_mode != 'zeros':
            s += f', padding_mode={g.padding_mode}'
        if g.groups > 1:
            s += f', groups={g.groups}'
        elif self.conv_groups > 1:
            s += f', conv_groups={self.conv_groups} (stored dense)'
        if self.proj_bias is None:
            s += ', bias=False'
        return s

    # ------------------------------------------------------------------ per-head settings

    @torch.no_grad()
    def set_locality_strength(self, alpha: Union[float, torch.Tensor]) -> None:
        """Set alpha (> 0) of every head (a float, or a ``(N_h,)`` tensor)."""
        check_unsharded(self, 'set_locality_strength')
        _check_per_head(alpha, 'locality_strength', self.geometry.num_heads)
        if isinstance(alpha, torch.Tensor):
            raw = torch.tensor([locality_to_raw(float(a)) for a in alpha.flatten()])
            self.pos_locality.copy_(raw.to(self.pos_locality))
        else:
            self.pos_locality.fill_(locality_to_raw(float(alpha)))

    @torch.no_grad()
    def set_gating(self, gating: Union[float, torch.Tensor]) -> None:
        """Set lambda of every head (a float, or a ``(N_h,)`` tensor)."""
        check_unsharded(self, 'set_gating')
        _check_per_head(gating, 'gating', self.geometry.num_heads)
        if isinstance(gating, torch.Tensor):
            self.gating.copy_(gating.to(self.gating).reshape(self.gating.shape))
        else:
            self.gating.fill_(float(gating))

    # ------------------------------------------------------------------ values kept from call to call

    @torch.jit.unused
    def _kept_attention_terms(self, height: int, width: int, device: torch.device,
                              dtype: torch.dtype) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
        """``_attention_terms`` in eager mode, kept from call to call where ``may_keep`` allows
        (``tcnn.layers.kept_values``): the offsets and ``log(n_pad)`` are made once per input size, device and
        dtype; the positional attention and the gate are kept in eval mode where no gradient flows to the positional
        and gating parameters (inference): then they depend on the input's size and on those parameters only. A kept
        value is used only while the three parameters are the same tensors at the same version and address (any
        in-place change, an optimizer step, ``load_state_dict``, ``set_gating`` included, bumps the version), and
        ``train()`` / ``eval()`` drop it; with gradients (training) they are recomputed, which autograd needs anyway,
        and the kept ones dropped (a fused optimizer's step bumps no version)."""
        if not may_keep(height):
            return self._attention_terms(height, width, device, dtype)
        offsets = keep(self, ('offsets', height, width, device, attention_dtype(self.pos_locality.dtype)), (),
                       lambda: self._offsets(height, width, device))
        log_pad = keep(self, ('log_pad', height, width, device, dtype), (),
                       lambda: padded_keys_logit(height, width, self.geometry, device, dtype))
        params = (self.pos_locality, self.pos_centers, self.gating)
        if self.training or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            # a step may follow that bumps no version (a fused optimizer): what was kept is no longer trusted
            forget(self, 'positional_and_gate')
            pos, gate = self._positional_and_gate(height, width, dtype, offsets)
        else:
            pos, gate = keep(self, ('positional_and_gate', height, width, device, dtype), params,
                             lambda: self._positional_and_gate(height, width, dtype, offsets))
        return log_pad, pos, gate

    def train(self, mode: bool = True) -> 'GPSA':
        """``nn.Module.train``; also drops the values kept for inference (a mode switch is where training ends)."""
        forget(self)
        return super().train(mode)

    # ------------------------------------------------------------------ loading

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        # tcnn <= 0.1.0 stored the filter as (C_out, C_in * N_h), index c * N_h + h (conv.weight.reshape): reorder.
        # (``args``: the rest of nn.Module's arguments, passed on as they are.)
        key = prefix + 'proj_weight'
        if isinstance(state_dict.get(key), torch.Tensor):
            state_dict[key] = upgrade_proj_weight(state_dict[key], self.proj_weight.shape)
        super()._load_from_state_dict(state_dict, prefix, *args)


# ------------------------------------------------------------------ the construction's helpers

def _pair(v: _PairInt, name: str, ge: int) -> Tuple[int, int]:
    """An int or a pair of ints as a pair, each ``>= ge``; raises naming ``name`` otherwise."""
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return int(check_number(v[0], name, ge=ge, integer=True)), int(check_number(v[1], name, ge=ge, integer=True))
    if isinstance(v, (tuple, list)):
        raise InvalidTypeError(f'{name} must be an int or a pair of ints, got {v!r}')
    v = int(check_number(v, name, ge=ge, integer=True))
    return v, v


def _string_padding(conv: nn.Conv2d) -> Tuple[int, int]:
    """The symmetric padding of a conv whose padding is ``'valid'`` or ``'same'``."""
    if conv.padding == 'valid':
        return 0, 0
    # 'same' (stride 1 only, as nn.Conv2d enforces): total padding d * (k - 1) per axis, symmetric when even.
    pads = []
    for k, d in zip(conv.kernel_size, conv.dilation):
        total = d * (k - 1)
        if total % 2:
            raise ValueError('padding="same" with an even effective kernel pads asymmetrically; not supported')
        pads.append(total // 2)
    return pads[0], pads[1]


# ------------------------------------------------------------------ the forward's helpers

def _batched_input(x: torch.Tensor, in_chs: int) -> torch.Tensor:
    """``x`` as ``(B, C_in, H, W)``: an unbatched ``(C_in, H, W)`` input as a batch of one, like ``nn.Conv2d``;
    another rank or number of channels is refused with the conv's message (not a GEMM's shape error)."""
    if x.dim() != 3 and x.dim() != 4:
        raise RuntimeError(f'Expected 3D (unbatched) or 4D (batched) input to GPSA, but got input of size: '
                           f'{list(x.shape)}')
    if x.shape[-3] != in_chs:
        raise RuntimeError(f'GPSA expected input{list(x.shape)} to have {in_chs} channels, but got {x.shape[-3]} '
                           f'channels instead')
    return x.unsqueeze(0) if x.dim() == 3 else x


def _forward_path() -> Tuple[bool, bool]:
    """Which of the forward's three paths runs, as ``(scripted, exporting)``. All three compute the same outputs
    (``_lerp``'s plain form up to float rounding); each exists for what the others cannot do:

    * eager mode (neither): values kept from call to call (``tcnn.layers.kept_values``), and the depthwise product in
      the faster of its two orders for the shape (``attend_depthwise``, an autograd function with its own backward);
    * ``scripted``: TorchScript compiles neither a Python dict of kept values nor an autograd function, so it
      computes every term on every call and attends first (``attend_heads_first``);
    * ``exporting``: an exporter or tracer records the forward (``is_exporting``). Nothing is kept (a kept tensor
      would become a constant of the graph) and ``lerp`` and the depthwise product are written in plain ops that
      every exporter and runtime reads and that hold for any batch size (``_lerp``, ``attend_traceable``).

    ``torch.jit.is_scripting()`` is known when TorchScript compiles this function, which therefore never compiles
    the eager branch (``is_exporting`` is Python only); ``forward`` tests it in place of ``scripted`` where the eager
    branch calls what TorchScript cannot compile at all (the kept values), so that the scripted graph holds the
    computed terms only.
    """
    if torch.jit.is_scripting():
        scripted, exporting = True, False
    else:
        scripted, exporting = False, is_exporting()
    return scripted, exporting


def _lerp(start: torch.Tensor, end: torch.Tensor, weight: torch.Tensor, exporting: bool) -> torch.Tensor:
    """``torch.lerp``; while an exporter records the forward (``exporting``), its formula
    ``start + weight * (end - start)`` in plain ops instead: the core-ATen decomposition of ``lerp`` writes its result
    with ``prims.copy_strided``, which ExecuTorch has no kernel for (its edge lowering fails with "Missing out
    variants"). The two differ by float rounding (eager ``lerp`` switches to ``end - (1 - weight) * (end - start)``
    for weights >= 0.5)."""
    if exporting:
        return start + weight * (end - start)
    return torch.lerp(start, end, weight)


def _like_input_format(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out`` (channels_last in memory) in the shape and memory format of the input ``x``: free for channels_last
    models, one copy for NCHW ones, whose next layers would otherwise switch format; an unbatched input's output
    without its batch of one, contiguous as the conv's."""
    if x.dim() == 3:
        return out.squeeze(0).contiguous()
    if x.is_contiguous(memory_format=torch.channels_last):
        return out
    return out.contiguous()


torch.fx.wrap('_batched_input')  # a leaf for FX: the checks and the batch of one depend on the input's shape
torch.fx.wrap('_like_input_format')  # a leaf for FX: the branch depends on the input tensor
torch.fx.wrap('at_least_float32')  # a leaf for FX: the dtype is known at run time only (tcnn.layers.content)
torch.fx.wrap('attention_dtype')  # a leaf for FX, likewise
torch.fx.wrap('attend_depthwise')  # a leaf for FX: an autograd function, its chunking and dtype set at run time


# ------------------------------------------------------------------ the per-head settings' helpers

def _check_per_head(value: Union[float, torch.Tensor], name: str, num_heads: int) -> None:
    if isinstance(value, torch.Tensor):
        if value.numel() != num_heads:
            raise InvalidArgumentError(f'{name} must be a number or {num_heads} values (one per head), got '
                                       f'a tensor of shape {tuple(value.shape)}')
        if not bool(torch.isfinite(value).all()):
            raise InvalidArgumentError(f'{name} must be finite, got {value.tolist()}')
    else:
        check_number(value, name)


def locality_to_raw(alpha: float) -> float:
    """Inverse of ``softplus(raw, beta=5)``: the raw parameter value that gives locality strength ``alpha``."""
    check_number(alpha, 'locality_strength', gt=0)
    return alpha + math.log(-math.expm1(-SOFTPLUS_BETA * alpha)) / SOFTPLUS_BETA


def check_unsharded(layer: nn.Module, what: str, name: str = '') -> None:
    """Raise a one-line ``TcnnError`` when the positional or gating parameters of GPSA ``layer`` (``name`` in its
    model) are DTensors: FSDP2's ``fully_shard`` (or tensor parallelism) split them over the ranks. Training steps run
    on them as on plain tensors, but what reads or sets the per-head values (``what``: ``gpsa_summary``,
    ``set_gating``, ``exact_configuration``, ``check_equivalence``) would see or write one rank's shard: it is refused
    before it changes anything, with the fix."""
    if any(compat.is_dtensor(getattr(layer, n)) for n in GPSA.positional_params + GPSA.gating_params):
        where = f' ({name})' if name else ''
        raise TcnnError(f'{what} does not take FSDP2-sharded (DTensor) parameters, as the GPSA layer{where} has: call '
                        f'it on the unsharded model (before fully_shard, or on a copy that loaded the full state dict '
                        f'of torch.distributed.checkpoint.state_dict.get_model_state_dict(model, '
                        f'options=StateDictOptions(full_state_dict=True)))')


# ------------------------------------------------------------------ introspection's helpers

def softplus_beta_5(raw: torch.Tensor) -> torch.Tensor:
    """``softplus(raw, beta=5)`` written without softplus's ``beta``, for graphs that other tools read: OpenVINO's
    TorchScript front end drops ``beta`` (it computed ``softplus(raw)``: every locality strength wrong). The terms of
    torch's own kernel, ``raw`` where ``5 * raw > 20`` (its threshold) and ``log1p(exp(5 * raw)) / 5`` below: outputs
    bitwise equal to ``F.softplus(raw, beta=5)``, gradients within 3 ulp (the 1/5 and the 5 apply in two steps).
    Eager mode keeps ``F.softplus`` (one kernel instead of five)."""
    # 5.0 is SOFTPLUS_BETA written as a literal: TorchScript compiles no global float (tests/test_gpsa.py holds the two
    # to each other)
    scaled = raw * 5.0
    return torch.where(scaled > 20.0, raw, F.softplus(scaled) / 5.0)
