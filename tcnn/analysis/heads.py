"""Look inside a T-CNN: per-head gates, spans and centres, attention maps for a query pixel, nonlocality.

This is the analysis of T-CNN (arXiv:2106.05795) section 4 as a Python API (``tcnn inspect`` is a thin layer over it):

* ``summarize(model, images)``: per GPSA layer and head, the gate sigmoid(lambda_h) (T-CNN eq. 7), the locality
  strength alpha_h, the span 1 / alpha_h (Fig. 4) and the width sigma_h = 1 / sqrt(2 alpha_h) of the positional
  Gaussian, the attention centre Delta_h, and with images the nonlocality of ConViT (arXiv:2103.10697) eq. 8 and
  the share of attention on padded keys.
* ``attention_maps(model, x, query)``: content, positional and gated (mixed) attention of every head of every GPSA
  layer for one query pixel (Fig. 5), from ``GPSA.attention`` on the layer's actual input.
* ``nonlocality(model, images)``: ``D^h = (1 / L) sum_q sum_k A^h_qk |delta_qk|`` averaged over images (ConViT
  eq. 8), where ``delta`` is the key - query offset in tokens of the layer's input grid (padded coordinates, the
  same ones as the attention centres, so the exact configuration gives ``D^h = |Delta_h|``).

Padding. The keys of a GPSA layer include the conv's zero-padding tokens (needed for exactness: the layer computes
the conv), and attention lands there: on a resnet18d T-CNN at 224 px, paper init, about a quarter of the stride-1
layers' gated attention. ConViT has no padding and averages over real patches only. Both are reported: the
nonlocality over all keys (``D^h`` above), over the real keys only with each query's attention renormalised over them,
and the share of attention on padded keys.

Units (``UNITS``). Distances are in tokens of each layer's own input grid (for a 224 px ResNet: 14 x 14 tokens of
16 px before the stride-2 layer, 7 x 7 of 32 px after), so layers side by side are not on one scale; they are also
given in pixels of the model input (offsets scaled by the token size, image size / grid size) and as a fraction of the
input image's diagonal. alpha multiplies a squared distance in the positional logits ``-alpha |delta - Delta|^2``:
alpha is in 1/tokens^2, the span 1/alpha in tokens^2 (not a distance), and the positional attention is a Gaussian of
standard deviation sigma = 1 / sqrt(2 alpha) tokens along each axis.
"""
import dataclasses
import math
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..convert.settings import gpsa_layers, gpsa_summary
from ..convert.verify import eval_mode
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number
from ..layers.gpsa import GPSA

__all__ = ['AttentionMaps', 'ATTENTION_PARTS', 'UNITS', 'capture_gpsa_inputs', 'attention_maps', 'query_cell',
           'nonlocality', 'summarize']

ATTENTION_PARTS = ('mixed', 'content', 'positional')
# The unit of every quantity of summarize() / summary.json (the keys of a layer entry, by prefix).
UNITS = {
    'gate': 'sigmoid(lambda_h), 0-1 (1: positional attention only, 0: content only)',
    'alpha': '1/tokens^2 (multiplies the squared offset in the positional logits)',
    'span': 'tokens^2 (1/alpha; not a distance)',
    'sigma': 'tokens (1/sqrt(2 alpha), standard deviation of the positional Gaussian along each axis)',
    'center': 'tokens (row, col offset of the attention centre from the query)',
    'nonlocality': "tokens of the layer's input grid (ConViT eq. 8, over all keys, padded ones included)",
    'nonlocality_real': "tokens of the layer's input grid (over the real keys, each query's attention renormalised)",
    'padding_share': 'fraction of attention on padded keys, 0-1',
    'px': 'pixels of the model input image (token offsets times the token size, image size / grid size)',
    'image_fraction': "fraction of the model input image's diagonal",
    'grid': "the layer's input grid (rows, cols), tokens",
    'token_px': 'input-image pixels per token (rows, cols)',
}

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
    try:  # the hooks and the modes are undone on every exit path
        for name, layer in layers:
            def hook(_module, args, _name=name):
                inputs[_name] = args[0].detach()
            handles.append(layer.register_forward_pre_hook(hook))
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


def _offsets(layer: GPSA, out_size: Sequence[int], key_size: Sequence[int],
             device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column offsets key - query in tokens of the layer's (padded) input grid, broadcastable to
    ``(H_out, W_out, H_k, W_k)``: ``(H_out, 1, H_k, 1)`` and ``(1, W_out, 1, W_k)``."""
    qy = torch.arange(out_size[0], device=device, dtype=torch.float32) * layer.stride[0] + layer.anchor[0]
    qx = torch.arange(out_size[1], device=device, dtype=torch.float32) * layer.stride[1] + layer.anchor[1]
    ky = torch.arange(key_size[0], device=device, dtype=torch.float32)
    kx = torch.arange(key_size[1], device=device, dtype=torch.float32)
    return ky[None, None, :, None] - qy[:, None, None, None], kx[None, None, None, :] - qx[None, :, None, None]


def _distances(dy: torch.Tensor, dx: torch.Tensor, scale: Sequence[float] = (1.0, 1.0)) -> torch.Tensor:
    """``|(dy * scale_y, dx * scale_x)|`` as an ``(N_q, N_k)`` matrix."""
    d = torch.sqrt((dy * scale[0]) ** 2 + (dx * scale[1]) ** 2)
    return d.reshape(d.shape[0] * d.shape[1], d.shape[2] * d.shape[3])


def _real_keys(layer: GPSA, key_size: Sequence[int], device: torch.device) -> torch.Tensor:
    """``(N_k,)`` float mask of the keys on the layer's real input (1) rather than its padding (0)."""
    (ph, pw), (hk, wk) = layer.padding, key_size
    mask = torch.zeros(hk, wk, device=device)
    mask[ph:hk - ph, pw:wk - pw] = 1.0
    return mask.flatten()


def _batches(images: Images) -> Iterator[torch.Tensor]:
    if isinstance(images, torch.Tensor):
        yield images if images.ndim == 4 else images[None]
        return
    for item in images:  # a DataLoader of (x, y[, ...]) or of x
        x = item[0] if isinstance(item, (tuple, list)) else item
        yield x if x.ndim == 4 else x[None]


class _Sums:
    """Per-head sums over images of per-image means over queries, and the count of images."""

    def __init__(self):
        self.values: Dict[str, torch.Tensor] = {}

    def add(self, key: str, per_query: torch.Tensor) -> None:
        """``per_query``: ``(B, N_h, N_q)``."""
        v = per_query.mean(-1).sum(0)
        self.values[key] = self.values[key] + v if key in self.values else v

    def mean(self, key: str, count: int) -> List[float]:
        return (self.values[key] / count).cpu().tolist()


@torch.no_grad()
def nonlocality(model: nn.Module, images: Images) -> Dict[str, Dict[str, Any]]:
    """Nonlocality of ConViT eq. 8 and the share of attention on padded keys, per GPSA layer and head, averaged over
    images.

    ``D^h = (1 / L) sum_q sum_k A^h_qk |delta_qk|`` over the ``L`` queries of the layer, with ``delta`` in tokens of
    the layer's input grid, over all keys including the padding (the layer's keys). Over the real keys only, each
    query's attention is renormalised first: ``sum_{k real} A_qk |delta_qk| / sum_{k real} A_qk`` (ConViT has no
    padding: its sum runs over the image's patches). The padding share is ``(1 / L) sum_q sum_{k padded} A_qk``.
    Each is computed for the mixed attention (what the layer uses) and for its content and positional parts; layer
    values are means over heads. The mixed attention's nonlocality is also given in pixels of the model input and as
    a fraction of the image diagonal (offsets scaled by the token size, image size / grid size, per axis).

    Args:
        model: A T-CNN.
        images: Normalised images ``(B, 3, H, W)``, or an iterable of such batches (or of ``(x, y)`` pairs, as a
            DataLoader yields).

    Returns:
        Per layer, per-head lists (see ``UNITS``): ``'mixed'``, ``'content'``, ``'positional'`` (tokens, all keys)
        and their layer value ``'mean'`` (mixed); ``'real'`` and ``'padding_share'``, each ``{part: per head}``,
        with ``'real_mean'`` and ``'padding_share_mean'`` (mixed); ``'px'``, ``'real_px'``, ``'image_fraction'``,
        ``'real_image_fraction'`` (mixed) with their ``*_mean``; the geometry ``'grid'`` (the layer's input grid),
        ``'keys'`` (padded), ``'queries'``, ``'image'`` (pixels) and ``'token_px'`` (None if the batches differ in
        size); ``'num_images'``.
    """
    layers = dict(_require_gpsa(model))
    if images is None or isinstance(images, (str, bytes)):
        raise InvalidTypeError(f'images must be a tensor of images or an iterable of batches, got '
                               f'{type(images).__name__}')
    sums: Dict[str, _Sums] = {}
    geometry: Dict[str, Dict[str, Any]] = {}
    count = 0
    for x in _batches(images):
        image = x.shape[-2:]
        for name, feats in capture_gpsa_inputs(model, x).items():
            layer = layers[name]
            att = layer.attention(feats)
            grid = feats.shape[-2:]
            out_size, key_size = att['out_size'].tolist(), att['key_size'].tolist()
            token_px = (image[0] / grid[0], image[1] / grid[1])
            geo = {'grid': list(grid), 'keys': key_size, 'queries': out_size, 'image': list(image),
                   'token_px': list(token_px)}
            known = geometry.setdefault(name, geo)
            for key, value in geo.items():  # batches of other sizes: no single geometry to report
                if known[key] is not None and known[key] != value:
                    known[key] = None
            dy, dx = _offsets(layer, out_size, key_size, feats.device)
            dist, dist_px = _distances(dy, dx), _distances(dy, dx, token_px)
            real = _real_keys(layer, key_size, feats.device)
            diagonal = math.hypot(image[0], image[1])
            acc = sums.setdefault(name, _Sums())
            for part in ATTENTION_PARTS:
                a = att[part].float()
                a = a if a.ndim == 4 else a[None].expand(feats.shape[0], -1, -1, -1)
                a_real = a * real
                mass = a_real.sum(-1).clamp_min(torch.finfo(torch.float32).tiny)
                acc.add(part, (a * dist).sum(-1))
                acc.add(f'real_{part}', (a_real * dist).sum(-1) / mass)
                acc.add(f'padding_{part}', (a - a_real).sum(-1))
                if part == 'mixed':
                    px, real_px = (a * dist_px).sum(-1), (a_real * dist_px).sum(-1) / mass
                    acc.add('px', px)
                    acc.add('real_px', real_px)
                    acc.add('image_fraction', px / diagonal)
                    acc.add('real_image_fraction', real_px / diagonal)
        count += x.shape[0]
    if count == 0:
        raise TcnnError('no images to measure the nonlocality on')
    out = {}
    for name, acc in sums.items():
        entry: Dict[str, Any] = {part: acc.mean(part, count) for part in ATTENTION_PARTS}
        entry['real'] = {part: acc.mean(f'real_{part}', count) for part in ATTENTION_PARTS}
        entry['padding_share'] = {part: acc.mean(f'padding_{part}', count) for part in ATTENTION_PARTS}
        for key in ('px', 'real_px', 'image_fraction', 'real_image_fraction'):
            entry[key] = acc.mean(key, count)
            entry[f'{key}_mean'] = _mean(entry[key])
        entry['mean'] = _mean(entry['mixed'])
        entry['real_mean'] = _mean(entry['real']['mixed'])
        entry['padding_share_mean'] = _mean(entry['padding_share']['mixed'])
        entry.update(geometry[name])
        entry['num_images'] = count
        out[name] = entry
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def summarize(model: nn.Module, images: Optional[Images] = None) -> Dict[str, Any]:
    """Everything ``tcnn inspect`` writes to ``summary.json``, as plain Python values.

    Args:
        model: A T-CNN.
        images: Optional images (see ``nonlocality``); without them the image-dependent entries are ``None``.

    Returns:
        ``{'config': model.tcnn_config or None, 'num_images': n, 'units': UNITS, 'layers': {name: {...}}}``; per
        layer, per-head lists and their layer means (``*_mean``): ``gate``, ``alpha``, ``span``, ``sigma``,
        ``center``; with images ``nonlocality`` (mixed attention, all keys; ``nonlocality_content``,
        ``nonlocality_positional``), ``nonlocality_real`` (real keys renormalised; ``nonlocality_real_content``,
        ``nonlocality_real_positional``), ``padding_share`` (``padding_share_content``, ``padding_share_positional``),
        ``nonlocality_px``, ``nonlocality_real_px``, ``nonlocality_image_fraction``,
        ``nonlocality_real_image_fraction``, and the geometry ``grid``, ``token_px``, ``image``.
    """
    _require_gpsa(model)
    layers = gpsa_summary(model)
    nl = nonlocality(model, images) if images is not None else {}
    for name, entry in layers.items():
        entry.update(_image_entries(nl.get(name)))
    config = getattr(model, 'tcnn_config', None)
    return {
        'config': dict(config) if config else None,
        'num_images': next(iter(nl.values()))['num_images'] if nl else 0,
        'units': dict(UNITS),
        'layers': layers,
    }


# summarize()'s image-dependent entries of a layer: where each is in a nonlocality() layer entry.
_IMAGE_ENTRIES = {
    'nonlocality': ('mixed',), 'nonlocality_mean': ('mean',),
    'nonlocality_content': ('content',), 'nonlocality_positional': ('positional',),
    'nonlocality_real': ('real', 'mixed'), 'nonlocality_real_mean': ('real_mean',),
    'nonlocality_real_content': ('real', 'content'), 'nonlocality_real_positional': ('real', 'positional'),
    'padding_share': ('padding_share', 'mixed'), 'padding_share_mean': ('padding_share_mean',),
    'padding_share_content': ('padding_share', 'content'), 'padding_share_positional': ('padding_share', 'positional'),
    **{f'nonlocality_{k}{m}': (f'{k}{m}',) for k in ('px', 'real_px', 'image_fraction', 'real_image_fraction')
       for m in ('', '_mean')},
    'grid': ('grid',), 'token_px': ('token_px',), 'image': ('image',),
}


def _image_entries(values: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """A layer's image-dependent entries of ``summarize`` (all None without images)."""
    out = {}
    for name, path in _IMAGE_ENTRIES.items():
        v = values
        for key in path if values else ():
            v = v[key]
        out[name] = v
    return out
