"""Look inside a T-CNN: per-head gates, spans and centres, attention maps for a query pixel, nonlocality.

This is the analysis of T-CNN (arXiv:2106.05795) section 4 as a Python API (``tcnn inspect`` is a thin layer over it):

* ``summarize(model, images)``: per GPSA layer and head, the gate sigmoid(lambda_h) (T-CNN eq. 7), the locality
  strength alpha_h and the span 1 / alpha_h (Fig. 4), the attention centre Delta_h, and with images the nonlocality of
  ConViT (arXiv:2103.10697) eq. 8.
* ``attention_maps(model, x, query)``: content, positional and gated (mixed) attention of every head of every GPSA
  layer for one query pixel (Fig. 5), from ``GPSA.attention`` on the layer's actual input.
* ``nonlocality(model, images)``: ``D^h = (1 / L) sum_q sum_k A^h_qk |delta_qk|`` averaged over images (ConViT
  eq. 8), where ``delta`` is the key - query offset in tokens of the layer's input grid (padded coordinates, the
  same ones as the attention centres, so the exact configuration gives ``D^h = |Delta_h|``).
"""
import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .convert import eval_mode, gpsa_layers, gpsa_summary
from .errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number
from .gpsa import GPSA

__all__ = ['AttentionMaps', 'ATTENTION_PARTS', 'capture_gpsa_inputs', 'attention_maps', 'query_cell',
           'nonlocality', 'summarize']

ATTENTION_PARTS = ('mixed', 'content', 'positional')

Images = Union[torch.Tensor, Iterable[Any]]


@dataclasses.dataclass
class AttentionMaps:
    """Attention of one query of one GPSA layer over its padded key grid, for every head.

    Attributes:
        layer: Module name of the GPSA layer.
        content: ``(B, N_h, H_k, W_k)`` content attention softmax(Q K^T / sqrt(d)).
        positional: ``(N_h, H_k, W_k)`` positional attention (the same for every image).
        mixed: ``(B, N_h, H_k, W_k)`` gated mix, what the layer actually uses (T-CNN eq. 7).
        gate: ``(N_h,)`` sigmoid(lambda_h), the weight of the positional part.
        centers: ``(N_h, 2)`` attention centres Delta_h (row, col offsets from the query).
        query: The query's cell ``(i, j)`` in the layer's output grid.
        query_key: The query's position ``(row, col)`` in the padded key grid (``stride * i + anchor``).
        out_size: Output grid ``(H_out, W_out)``.
        key_size: Padded key grid ``(H_k, W_k)``.
        padding: Padding ``(p_h, p_w)``: key ``(r, c)`` is input token ``(r - p_h, c - p_w)``.
        kernel_size: The source conv's kernel ``(k_h, k_w)``: head ``h`` started at tap ``(h // k_w, h % k_w)``.
    """
    layer: str
    content: torch.Tensor
    positional: torch.Tensor
    mixed: torch.Tensor
    gate: torch.Tensor
    centers: torch.Tensor
    query: Tuple[int, int]
    query_key: Tuple[int, int]
    out_size: Tuple[int, int]
    key_size: Tuple[int, int]
    padding: Tuple[int, int]
    kernel_size: Tuple[int, int]

    def part(self, name: str, index: int = 0) -> torch.Tensor:
        """``(N_h, H_k, W_k)`` maps of one part (``'mixed'``, ``'content'`` or ``'positional'``) for image ``index``."""
        if name not in ATTENTION_PARTS:
            raise ValueError(f'unknown attention part {name!r}; expected one of {ATTENTION_PARTS}')
        maps = getattr(self, name)
        return maps if name == 'positional' else maps[index]

    def unpadded(self, maps: torch.Tensor) -> torch.Tensor:
        """Crop ``(..., H_k, W_k)`` maps to the layer's input grid (drop the zero-padding tokens)."""
        ph, pw = self.padding
        return maps[..., ph:maps.shape[-2] - ph, pw:maps.shape[-1] - pw]


def _require_gpsa(model: nn.Module) -> List[Tuple[str, GPSA]]:
    layers = gpsa_layers(model)  # raises on a non-module
    if not layers:
        raise TcnnError('the model has no GPSA layer (a plain CNN, e.g. the no-SA baseline): nothing to inspect; '
                        'convert it first with `tcnn convert`')
    return layers


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device('cpu')


@torch.no_grad()
def capture_gpsa_inputs(model: nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Run ``model`` on ``x`` in eval mode and return the input of every GPSA layer, by layer name."""
    layers = _require_gpsa(model)
    _check_images(x, 'x')
    inputs: Dict[str, torch.Tensor] = {}
    handles = []
    for name, layer in layers:
        def hook(_module, args, _name=name):
            inputs[_name] = args[0].detach()
        handles.append(layer.register_forward_pre_hook(hook))
    try:
        with eval_mode(model):
            model(x.to(_model_device(model)))
    finally:
        for h in handles:
            h.remove()
    return inputs


def _check_images(x: Any, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise InvalidTypeError(f'{name} must be a tensor of images (B, C, H, W), got {type(x).__name__}')
    if x.ndim != 4 or not x.is_floating_point():
        raise InvalidArgumentError(f'{name} must be a float tensor of images (B, C, H, W), got shape '
                                   f'{tuple(x.shape)} and dtype {x.dtype}')


def query_cell(query: Optional[Sequence[float]], image_size: Sequence[int], out_size: Sequence[int]) -> Tuple[int, int]:
    """Output-grid cell of a query pixel: the cell covering pixel ``(y, x)`` of an ``H x W`` input image.

    Args:
        query: ``(y, x)`` in pixels of the model input; ``None`` for the centre of the image.
        image_size: ``(H, W)`` of the model input.
        out_size: ``(H_out, W_out)`` of the layer.
    """
    height, width = int(image_size[0]), int(image_size[1])
    if query is not None and (isinstance(query, (str, bytes)) or not isinstance(query, Sequence) or len(query) != 2):
        raise InvalidTypeError(f'query must be a (y, x) pixel, got {query!r}')
    y, x = ((height / 2.0, width / 2.0) if query is None else
            (float(check_number(query[0], 'query')), float(check_number(query[1], 'query'))))
    if not (0 <= y < height and 0 <= x < width):
        raise InvalidArgumentError(f'query pixel ({y:g}, {x:g}) is outside the {height}x{width} input image')
    i = min(int(y * out_size[0] / height), out_size[0] - 1)
    j = min(int(x * out_size[1] / width), out_size[1] - 1)
    return i, j


@torch.no_grad()
def attention_maps(
        model: nn.Module,
        x: torch.Tensor,
        query: Optional[Sequence[float]] = None,
) -> Dict[str, AttentionMaps]:
    """Attention maps of every head of every GPSA layer for one query pixel (T-CNN Fig. 5).

    Args:
        model: A T-CNN (any module holding GPSA layers).
        x: Normalised input images ``(B, 3, H, W)``.
        query: ``(y, x)`` pixel of the input image; each layer uses the output cell that covers it. Default: the
            centre of the image.

    Returns:
        Per layer name, an ``AttentionMaps`` (all tensors on the CPU, float32).
    """
    layers = dict(_require_gpsa(model))
    inputs = capture_gpsa_inputs(model, x)
    result = {}
    for name, feats in inputs.items():
        layer = layers[name]
        att = layer.attention(feats)
        (h_out, w_out), (h_k, w_k) = att['out_size'].tolist(), att['key_size'].tolist()
        i, j = query_cell(query, x.shape[-2:], (h_out, w_out))
        q = i * w_out + j
        b = feats.shape[0]
        result[name] = AttentionMaps(
            layer=name,
            content=att['content'][:, :, q].reshape(b, -1, h_k, w_k).float().cpu(),
            positional=att['positional'][:, q].reshape(-1, h_k, w_k).float().cpu(),
            mixed=att['mixed'][:, :, q].reshape(b, -1, h_k, w_k).float().cpu(),
            gate=layer.gate().detach().cpu(),
            centers=layer.pos_centers.detach().float().cpu(),
            query=(i, j),
            query_key=(i * layer.stride[0] + layer.anchor[0], j * layer.stride[1] + layer.anchor[1]),
            out_size=(h_out, w_out),
            key_size=(h_k, w_k),
            padding=tuple(layer.padding),
            kernel_size=tuple(layer.kernel_size),
        )
    return result


def _offset_norms(layer: GPSA, out_size: Sequence[int], key_size: Sequence[int], device: torch.device) -> torch.Tensor:
    """``|key - query|`` in tokens of the layer's (padded) input grid, ``(N_q, N_k)``."""
    qy = torch.arange(out_size[0], device=device, dtype=torch.float32) * layer.stride[0] + layer.anchor[0]
    qx = torch.arange(out_size[1], device=device, dtype=torch.float32) * layer.stride[1] + layer.anchor[1]
    ky = torch.arange(key_size[0], device=device, dtype=torch.float32)
    kx = torch.arange(key_size[1], device=device, dtype=torch.float32)
    dy = ky[None, None, :, None] - qy[:, None, None, None]  # (H_out, 1, H_k, 1)
    dx = kx[None, None, None, :] - qx[None, :, None, None]  # (1, W_out, 1, W_k)
    return torch.sqrt(dy ** 2 + dx ** 2).reshape(len(qy) * len(qx), len(ky) * len(kx))


def _batches(images: Images) -> Iterator[torch.Tensor]:
    if isinstance(images, torch.Tensor):
        yield images if images.ndim == 4 else images[None]
        return
    for item in images:  # a DataLoader of (x, y[, ...]) or of x
        x = item[0] if isinstance(item, (tuple, list)) else item
        yield x if x.ndim == 4 else x[None]


@torch.no_grad()
def nonlocality(model: nn.Module, images: Images) -> Dict[str, Dict[str, Any]]:
    """Nonlocality of ConViT eq. 8 per GPSA layer and head, averaged over images.

    ``D^h = (1 / L) sum_q sum_k A^h_qk |delta_qk|`` over the ``L`` queries of the layer, with ``delta`` in tokens of
    the layer's input grid; the layer value is the mean over heads. Computed for the mixed attention (what the
    layer uses) and for its content and positional parts.

    Args:
        model: A T-CNN.
        images: Normalised images ``(B, 3, H, W)``, or an iterable of such batches (or of ``(x, y)`` pairs, as a
            DataLoader yields).

    Returns:
        Per layer: ``{'mixed': [per head], 'content': [...], 'positional': [...], 'mean': layer value of the mixed
        attention, 'num_images': n}``.
    """
    layers = dict(_require_gpsa(model))
    if images is None or isinstance(images, (str, bytes)):
        raise InvalidTypeError(f'images must be a tensor of images or an iterable of batches, got '
                               f'{type(images).__name__}')
    sums: Dict[str, Dict[str, torch.Tensor]] = {}
    count = 0
    for x in _batches(images):
        for name, feats in capture_gpsa_inputs(model, x).items():
            att = layers[name].attention(feats)
            dist = _offset_norms(layers[name], att['out_size'].tolist(), att['key_size'].tolist(), feats.device)
            acc = sums.setdefault(name, {})
            for part in ATTENTION_PARTS:
                a = att[part].float()
                a = a if a.ndim == 4 else a[None].expand(feats.shape[0], -1, -1, -1)
                d = (a * dist).sum(-1).mean(-1).sum(0)  # sum over images of the per-head mean over queries
                acc[part] = acc[part] + d if part in acc else d
        count += x.shape[0]
    if count == 0:
        raise TcnnError('no images to measure the nonlocality on')
    out = {}
    for name, acc in sums.items():
        per_head = {part: (acc[part] / count).cpu() for part in ATTENTION_PARTS}
        out[name] = {part: v.tolist() for part, v in per_head.items()}
        out[name]['mean'] = per_head['mixed'].mean().item()
        out[name]['num_images'] = count
    return out


def summarize(model: nn.Module, images: Optional[Images] = None) -> Dict[str, Any]:
    """Everything ``tcnn inspect`` writes to ``summary.json``, as plain Python values.

    Args:
        model: A T-CNN.
        images: Optional images (see ``nonlocality``); without them the nonlocality is ``None``.

    Returns:
        ``{'config': model.tcnn_config or None, 'num_images': n, 'layers': {name: {'gate', 'alpha', 'span', 'center'
        (per head), 'gate_mean', 'span_mean', 'nonlocality': per-head list of the mixed attention or None,
        'nonlocality_mean', 'nonlocality_content', 'nonlocality_positional'}}}``.
    """
    _require_gpsa(model)
    layers = gpsa_summary(model)
    nl = nonlocality(model, images) if images is not None else {}
    for name, entry in layers.items():
        values = nl.get(name)
        entry['nonlocality'] = values['mixed'] if values else None
        entry['nonlocality_mean'] = values['mean'] if values else None
        entry['nonlocality_content'] = values['content'] if values else None
        entry['nonlocality_positional'] = values['positional'] if values else None
    config = getattr(model, 'tcnn_config', None)
    return {
        'config': dict(config) if config else None,
        'num_images': next(iter(nl.values()))['num_images'] if nl else 0,
        'layers': layers,
    }
