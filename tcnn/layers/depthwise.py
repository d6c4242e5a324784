"""The depthwise GPSA layer's attention, values and per-channel filter as one channel-chunked autograd function.

A depthwise conv's GPSA layer has one head per tap and a diagonal output projection per head (T-CNN,
arXiv:2106.05795, eqs. 5-6 with ``W_out^h = diag(w[:, h])``):

    out[b, q, c] = sum_h w[c, h] sum_k A[b, q, h, k] V[b, k, c]

``N_h * N_k`` multiply-adds per output, 49 x 49 for a 7x7 conv on a 7x7 grid: ``N_k`` times the conv's work, which is
the price of attention that every head shares across the channels. How it is evaluated decides its speed.
Attending first (``heads = A V``, then a per-channel weighted sum over the heads) writes a ``(B, N_q * N_h, C)``
tensor (30 MB per layer at batch 4, 768 channels) and reads it back, forward and twice in backward, which is
memory-bound on a CPU. Here the filter is folded into the values instead, ``U[b, (h, k), c] = w[c, h] V[b, k, c]``,
so the whole sum is one GEMM per image with a long reduction, ``out[b] = A[b] U[b]`` with ``A[b]``
``(N_q, N_h * N_k)``, over chunks of channels (and of images, at large batch) small enough for ``U`` to stay in the
CPU's cache. Backward recomputes ``U`` per chunk instead of saving it, so a training step keeps nothing larger than
the attention. Where the attention's rows are short and the batch small (a 3x3 kernel at batch 4), attending first
still wins, everything fitting in cache with fewer, larger operations: ``attend_depthwise`` picks the order per shape.
"""
import contextlib
import math
from typing import Any, ContextManager, Dict, List, Optional, Tuple

import torch

__all__ = ['attend_depthwise', 'attend_folded', 'attend_heads_first', 'attend_traceable', 'folding_pays',
           'CPU_CHUNK_ELEMENTS']

# Elements of one chunk's U (B * N_h * N_k * chunk) on a CPU: 2^17 float32 = 512 KiB, a quarter of a core's L2, the
# fastest budget for forward + backward over the depthwise shapes measured (docs/benchmarks.md); never fewer than
# MIN_CHUNK channels, as a thinner GEMM loses more than the cache gains, and at least MIN_GEMM_COLUMNS output columns
# for the heads-chunked GEMM of the attention's gradient.
CPU_CHUNK_ELEMENTS = 1 << 17
# On a GPU, bandwidth is not the limit and fewer, larger kernels are better: chunks only bound the transient memory
# (2^26 elements, 128 MiB in bf16; a 7x7 ConvNeXt layer at batch 256 then runs in 8 channel chunks).
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26
MIN_CHUNK = 32
MIN_GEMM_COLUMNS = 256
# folding_pays: attention rows of at least this many terms, or attended values of at least this many elements (16 MiB
# in float32); measured crossovers in docs/benchmarks.md
FOLD_MIN_ROW = 1024
FOLD_MIN_HEADS_ELEMENTS = 1 << 22


def attend_depthwise(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """``out[b, q, c] = sum_h taps[h, c] sum_k attn[b, q, h, k] values[b, k, c // m]`` for a depthwise GPSA layer,
    folded and chunked where that is faster (``folding_pays``), else attending first.

    Args:
        attn: Mixed attention ``(B, N_q, N_h * N_k)``, keys innermost.
        values: Values ``(B, N_k, C_in)``.
        taps: Filter taps ``(N_h, C_out)``, ``C_out = m * C_in`` (output channel ``c`` reads input channel ``c // m``,
            ``nn.Conv2d``'s channel multiplier).

    Returns:
        ``(B, N_q, C_out)`` in the autocast dtype where autocast is on for the device, else in ``values``' dtype.
    """
    b, n_q = attn.shape[0], attn.shape[1]
    num_heads, channels = taps.shape
    if folding_pays(b, n_q, num_heads, attn.shape[2] // num_heads, channels):
        return attend_folded(attn, values, taps)
    return attend_heads_first(attn, values, taps)


def attend_folded(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The product with the taps folded into the values, in chunks (the module docstring); ``attend_depthwise``'s
    arguments and result."""
    dtype = values.dtype
    if _has_autocast(values) and torch.is_autocast_enabled(values.device.type):
        dtype = torch.get_autocast_dtype(values.device.type)
    multiplier = taps.shape[1] // values.shape[-1]
    if multiplier > 1:
        values = values.repeat_interleave(multiplier, dim=-1)
    # contiguous taps: the chunks' broadcast products read them along the channels
    return _AttendDepthwise.apply(attn.to(dtype), values.to(dtype), taps.to(dtype).contiguous())


def folding_pays(batch: int, n_q: int, num_heads: int, n_k: int, channels: int) -> bool:
    """Whether the folded, chunked product beats attending first: when a row of the attention is long (its GEMM
    contracts ``N_h * N_k`` terms; 5x5 and 7x7 kernels on a 7x7 grid) or the attended values would be large
    (written to memory and read back). Below both, e.g. a 3x3 kernel at batch 4, attending first keeps everything in
    cache with fewer, larger operations (docs/benchmarks.md)."""
    return num_heads * n_k >= FOLD_MIN_ROW or batch * n_q * num_heads * channels >= FOLD_MIN_HEADS_ELEMENTS


def attend_heads_first(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The same product attending first: ``heads = A V`` ``(B, N_q * N_h, C_in)`` in one batched GEMM, then per output
    channel a weighted sum over the heads (nothing for a GEMM to contract; ``vecdot`` scales and sums). Plain
    autograd; TorchScript compiles it."""
    b, n_q = attn.shape[0], attn.shape[1]
    num_heads, c_out = taps.shape
    c_in = values.shape[-1]
    heads = torch.bmm(attn.reshape(b, n_q * num_heads, attn.shape[2] // num_heads).to(values.dtype), values)
    per_input = taps.reshape(num_heads, c_in, c_out // c_in, 1).to(heads.dtype)  # output channel c * m + j reads c
    out = torch.linalg.vecdot(heads.view(b * n_q, num_heads, c_in, 1, 1), per_input.contiguous(), dim=1)
    return out.view(b, n_q, c_out)


def attend_traceable(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """The product in plain tensor ops for exporters and tracers (``torch.export``, both ONNX exporters,
    ``torch.jit.trace``), attending first like ``attend_heads_first``: ``heads = A V`` in one batched GEMM, then the
    per-channel sum over the heads as a broadcast product and a sum. ``attend_depthwise``'s arguments and result,
    without its autocast handling (an exported graph runs in the dtype it was traced in).

    Why not ``attend_depthwise`` itself: it picks its order from the batch size (``folding_pays``) and loops over a
    chunk plan of images and channels, Python decisions on sizes that ``torch.export`` must turn into guards, which
    fix the batch (or fail to export with a dynamic one), and its autograd function is opaque to exporters. Why not
    ``attend_heads_first``: ``linalg.vecdot`` has no ONNX form in the TorchScript exporter. Why attending first rather
    than the folded order in plain ops (``U = taps * V``, then one GEMM): both write one ``B N_h N C`` tensor and run
    about as fast in onnxruntime (``docs/benchmarks.md``, "onnxruntime CPU"), and the attended values are the smaller
    of the two for a strided layer (``N_q < N_k``)."""
    b, n_q = attn.shape[0], attn.shape[1]
    num_heads, c_out = taps.shape
    c_in = values.shape[-1]
    heads = torch.bmm(attn.reshape(b, n_q * num_heads, attn.shape[2] // num_heads).to(values.dtype), values)
    # output channel c * m + j reads input channel c (nn.Conv2d's channel multiplier m): a broadcast, no copy
    per_input = taps.reshape(num_heads, c_in, c_out // c_in).to(heads.dtype)
    out = (heads.reshape(b, n_q, num_heads, c_in, 1) * per_input).sum(2)
    return out.reshape(b, n_q, c_out)


def _has_autocast(t: torch.Tensor) -> bool:
    return torch.amp.is_autocast_available(t.device.type)  # not on 'meta' (shape inference)


def _autocast_off(t: torch.Tensor) -> ContextManager:
    return torch.autocast(t.device.type, enabled=False) if _has_autocast(t) else contextlib.nullcontext()


def _budget(device: torch.device) -> int:
    return CPU_CHUNK_ELEMENTS if device.type == 'cpu' else ACCELERATOR_CHUNK_ELEMENTS


def _plan(batch: int, row: int, channels: int, device: torch.device) -> Tuple[int, int]:
    """Images and channels per chunk for attention rows of ``row = N_h * N_k``: chunks of about the device's budget,
    channels first (at least ``MIN_CHUNK``), then the batch in equal parts once even that is too large."""
    budget = _budget(device)
    chunk = min(channels, max(MIN_CHUNK, budget // max(1, batch * row)))
    images = max(1, 2 * budget // (row * chunk))
    parts = max(1, -(-batch // images))
    return max(1, -(-batch // parts)), chunk  # at least 1: the loops step by it, also over an empty batch


def _heads_per_chunk(images: int, n_k: int, channels: int, num_heads: int, device: torch.device) -> int:
    """Heads per GEMM of the attention's gradient: about the device's budget of ``U``, but at least
    ``MIN_GEMM_COLUMNS`` output columns."""
    return min(num_heads, max(-(-MIN_GEMM_COLUMNS // n_k), _budget(device) // max(1, images * n_k * channels)))


class _Workspace:
    """Scratch tensors reused by every chunk of one call: a fresh chunk-sized tensor per chunk pays page faults on a
    CPU, since glibc serves blocks over its mmap threshold (128 KiB to 32 MiB) with pages it returns on free."""

    def __init__(self, like: torch.Tensor) -> None:
        self.like = like
        self.buffers: Dict[str, torch.Tensor] = {}

    def take(self, name: str, *shape: int) -> torch.Tensor:
        """A contiguous ``shape`` tensor: the prefix of this name's buffer, allocated on first use (the first chunk
        is the largest)."""
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[name] = self.like.new_empty(numel)
        return buf[:numel].view(shape)


def _folded_values(values: torch.Tensor, taps: torch.Tensor, work: _Workspace) -> torch.Tensor:
    """``U[b, (h, k), c] = taps[h, c] values[b, k, c]``: ``(B, N_h * N_k, C)`` from ``(B, N_k, C)`` and ``(N_h, C)``,
    written into the workspace (contiguous: left to itself, the broadcast product may pick a permuted layout that the
    GEMM would copy again)."""
    b, n_k, c = values.shape
    u = work.take('u', b, taps.shape[0], n_k, c)
    torch.mul(taps[None, :, None, :], values[:, None, :, :], out=u)
    return u.view(b, taps.shape[0] * n_k, c)


class _AttendDepthwise(torch.autograd.Function):
    """``attn @ U`` per chunk of images and channels; see the module docstring. Inputs share one dtype; autocast is
    off inside, so forward and backward run in that dtype.

    Written for ``torch.func`` as well as for autograd: ``forward`` and ``setup_context`` are separate, the backward
    is itself an autograd function (``_AttendDepthwiseBackward``, with the same chunked GEMMs), and both have vmap
    rules, so ``vmap(grad(...))`` (per-sample gradients) works. Twice differentiable (and more): the product is
    linear in each of its three inputs, so every derivative of it is one of these two functions again (see
    ``_AttendDepthwiseBackward.backward``).
    """

    @staticmethod
    def forward(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        b, n_q, channels = attn.shape[0], attn.shape[1], taps.shape[1]
        images, chunk = _plan(b, attn.shape[2], channels, values.device)
        out = values.new_empty(b, n_q, channels)
        work = _Workspace(values)
        with _autocast_off(values):
            for b0 in range(0, b, images):
                a, v = attn[b0:b0 + images], values[b0:b0 + images]
                for c0 in range(0, channels, chunk):
                    c1 = min(c0 + chunk, channels)
                    u = _folded_values(v[:, :, c0:c1], taps[:, c0:c1], work)
                    # through a contiguous buffer: torch.compile refuses a strided out= (a slice of `out`)
                    out[b0:b0 + images, :, c0:c1] = torch.bmm(a, u, out=work.take('out', a.shape[0], n_q, c1 - c0))
        return out

    @staticmethod
    def setup_context(ctx, inputs: Tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        attn, values, taps = ctx.saved_tensors
        need_attn, need_values, need_taps = ctx.needs_input_grad
        grad_attn, grad_values, grad_taps = _AttendDepthwiseBackward.apply(
            grad_out, attn, values, taps, need_attn, need_values or need_taps)
        return grad_attn, grad_values if need_values else None, grad_taps if need_taps else None

    @staticmethod
    def vmap(info, in_dims: Tuple[Optional[int], ...], attn: torch.Tensor, values: torch.Tensor,
             taps: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """Under ``torch.vmap``: with shared taps (a layer's filter) the vmapped dimension joins the images, one call
        over all of them; per-sample taps, one call per sample."""
        if in_dims[2] is None:
            n = info.batch_size
            attn, values = _batch_first(attn, in_dims[0], n), _batch_first(values, in_dims[1], n)
            out = _AttendDepthwise.apply(attn.flatten(0, 1), values.flatten(0, 1), taps)
            return out.view(n, attn.shape[1], *out.shape[1:]), 0
        return torch.stack([_AttendDepthwise.apply(*sample)
                            for sample in _samples(info.batch_size, in_dims, (attn, values, taps))]), 0


class _AttendDepthwiseBackward(torch.autograd.Function):
    """The gradients of ``_AttendDepthwise`` for ``grad_out``: ``(dL/dattn, dL/dvalues, dL/dtaps)``, each None where
    not asked for (``need_attn``; ``need_values_taps`` for the last two, computed together), with the chunked GEMMs of
    ``_grad_attn`` and ``_grad_values_taps``. An autograd function itself, so that the product is twice
    differentiable."""

    @staticmethod
    def forward(grad_out: torch.Tensor, attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor,
                need_attn: bool, need_values_taps: bool) -> Tuple[Optional[torch.Tensor], ...]:
        images, chunk = _plan(attn.shape[0], attn.shape[2], taps.shape[1], values.device)
        grad_attn = torch.empty_like(attn) if need_attn else None
        grad_values = torch.empty_like(values) if need_values_taps else None
        grad_taps = torch.zeros_like(taps) if need_values_taps else None
        work = _Workspace(values)
        with _autocast_off(values):
            for b0 in range(0, attn.shape[0], images):
                part = slice(b0, b0 + images)
                if grad_attn is not None:
                    _grad_attn(grad_out[part], values[part], taps, grad_attn[part], work)
                if grad_values is not None:
                    _grad_values_taps(grad_out[part], attn[part], values[part], taps, chunk=chunk,
                                      grad_values=grad_values[part], grad_taps=grad_taps, work=work)
        return grad_attn, grad_values, grad_taps

    @staticmethod
    def setup_context(ctx, inputs: Tuple, output: Tuple) -> None:
        ctx.save_for_backward(*inputs[:4])

    @staticmethod
    def backward(ctx, gg_attn: Optional[torch.Tensor], gg_values: Optional[torch.Tensor],
                 gg_taps: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
        """The first-order gradients are contractions of one 4-linear form ``T(G, A, V, w) = sum G A w V`` (the
        product's output against ``G``): ``dL/dA = dT/dA`` and so on. What reaches them back, ``<gg_A, dT/dA> +
        <gg_V, dT/dV> + <gg_w, dT/dw>``, is ``T`` with one argument replaced by its ``gg``; its derivative in ``G``
        is the product of the other three (``_AttendDepthwise``), in ``A``, ``V`` or ``w`` a first-order gradient of
        it (this function)."""
        grad_out, attn, values, taps = ctx.saved_tensors
        need = ctx.needs_input_grad[:4]
        parts: Tuple[list, list, list, list] = ([], [], [], [])  # contributions to the grads of G, A, V, w
        for i, gg in ((1, gg_attn), (2, gg_values), (3, gg_taps)):
            if gg is None:
                continue
            args = [attn, values, taps]
            args[i - 1] = gg  # T(G, ..., gg in place of input i, ...)
            if need[0]:
                parts[0].append(_AttendDepthwise.apply(*args))
            others = [j for j in (1, 2, 3) if j != i and need[j]]
            if others:
                grads = _AttendDepthwiseBackward.apply(grad_out, *args, 1 in others, 2 in others or 3 in others)
                for j in others:
                    parts[j].append(grads[j - 1])
        total = [sum(p[1:], p[0]) if p else None for p in parts]
        return total[0], total[1], total[2], total[3], None, None

    @staticmethod
    def vmap(info, in_dims: Tuple[Optional[int], ...],
             *inputs: Any) -> Tuple[Tuple[Optional[torch.Tensor], ...], Tuple[Optional[int], ...]]:
        """Under ``torch.vmap`` (``vmap(grad(...))``): one call per sample, since the taps' gradient sums over the
        images, which the vmapped dimension must not join. ``inputs`` are ``forward``'s, as torch passes them."""
        grad_out, attn, values, taps, need_attn, need_values_taps = inputs
        per_sample = [_AttendDepthwiseBackward.apply(*sample, need_attn, need_values_taps)
                      for sample in _samples(info.batch_size, in_dims[:4], (grad_out, attn, values, taps))]
        grads = tuple(torch.stack([g[k] for g in per_sample]) if need else None
                      for k, need in enumerate((need_attn, need_values_taps, need_values_taps)))
        return grads, tuple(0 if g is not None else None for g in grads)


def _batch_first(t: torch.Tensor, dim: Optional[int], n: int) -> torch.Tensor:
    """A vmapped input with its vmapped dimension first (expanded to ``n`` where it has none)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(n, *t.shape)


def _samples(n: int, in_dims: Tuple[Optional[int], ...], args: Tuple[torch.Tensor, ...]) -> List[List[torch.Tensor]]:
    """The arguments of each of the ``n`` samples of vmapped ``args`` (unbatched ones shared)."""
    return [[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)] for i in range(n)]


def _grad_attn(grad_out: torch.Tensor, values: torch.Tensor, taps: torch.Tensor, grad_attn: torch.Tensor,
               work: _Workspace) -> None:
    """``dL/dA[b] = G[b] U[b]^T`` into ``grad_attn`` ``(B, N_q, N_h * N_k)``, a few heads at a time: each GEMM
    contracts all channels and writes its heads' columns once (in channel chunks, every chunk would add into the
    whole gradient again)."""
    b, n_q = grad_out.shape[0], grad_out.shape[1]
    (num_heads, channels), n_k = taps.shape, values.shape[1]
    per_chunk = _heads_per_chunk(b, n_k, channels, num_heads, values.device)
    for h0 in range(0, num_heads, per_chunk):
        h1 = min(h0 + per_chunk, num_heads)
        u = _folded_values(values, taps[h0:h1], work)  # (B, heads * N_k, C)
        grad_attn[:, :, h0 * n_k:h1 * n_k] = torch.bmm(grad_out, u.transpose(1, 2),
                                                       out=work.take('grad', b, n_q, (h1 - h0) * n_k))


def _grad_values_taps(grad_out: torch.Tensor, attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor, *,
                      chunk: int, grad_values: torch.Tensor, grad_taps: torch.Tensor, work: _Workspace) -> None:
    """``dL/dU[b] = A[b]^T G[b]`` per channel chunk, then through ``U = w * V`` to both factors: written into
    ``grad_values``, added to ``grad_taps``."""
    b, (num_heads, channels), n_k = attn.shape[0], taps.shape, values.shape[1]
    attn_t = attn.transpose(1, 2)  # (B, N_h * N_k, N_q)
    for c0 in range(0, channels, chunk):
        c1 = min(c0 + chunk, channels)
        w, v = taps[None, :, None, c0:c1], values[:, None, :, c0:c1]
        grad_u = torch.bmm(attn_t, grad_out[:, :, c0:c1], out=work.take('grad_u', b, num_heads * n_k, c1 - c0))
        grad_u = grad_u.view(b, num_heads, n_k, c1 - c0)
        product = work.take('product', b, num_heads, n_k, c1 - c0)
        grad_values[:, :, c0:c1] = torch.mul(grad_u, w, out=product).sum(1)
        grad_taps[:, c0:c1] += torch.mul(grad_u, v, out=product).sum((0, 2))
