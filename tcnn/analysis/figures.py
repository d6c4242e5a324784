"""Figures of what the GPSA heads learned (T-CNN, arXiv:2106.05795, Figs. 3 and 5): gate/span charts and
attention-map grids, and the figure file helpers every tcnn figure uses.

Figures are drawn on matplotlib's Agg canvas directly (``matplotlib.figure.Figure``, no pyplot), so importing this
module never changes the user's matplotlib backend and works on headless machines. Files are written atomically.
"""
import math
import os
from io import BytesIO
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from ..atomic import atomic_open
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_number
from ..paths import check_output_file
from .heads import ATTENTION_PARTS, AttentionMaps

__all__ = ['plot_summary', 'plot_attention', 'attention_figure', 'save_figure', 'figure_pixels', 'check_figure_path',
           'short_layer_name']

PART_TITLES = {'mixed': 'gated mix', 'content': 'content', 'positional': 'positional'}
# Layers with more heads than this (5x5 and 7x7 depthwise convs: 25, 49) get compact figures: heat charts stacked,
# without numbers in the cells; attention maps laid out as the kernel, each head at the tap it started from.
MANY_HEADS = 16


def check_figure_path(path: str, name: str = 'path') -> str:
    """``path`` if a figure can be written there in a format matplotlib knows (from the extension; none: PNG).
    The plot functions call it before drawing, so a bad path costs no work."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'{name} must be a file path, got {type(path).__name__}')
    path = os.fspath(path)
    suffixes = tuple('.' + ext for ext in sorted(FigureCanvasAgg.get_supported_filetypes()))
    if os.path.splitext(path)[1]:
        check_output_file(path, name, suffixes)
    else:
        check_output_file(path, name)
    return path


def save_figure(fig: Figure, path: str, dpi: int = 110) -> str:
    """Write ``fig`` to ``path`` (format from the extension) atomically; returns ``path``."""
    check_figure_path(path)
    FigureCanvasAgg(fig)
    fmt = os.path.splitext(path)[1].lstrip('.').lower() or 'png'
    with atomic_open(path, 'wb') as f:
        fig.savefig(f, format=fmt, dpi=dpi, bbox_inches='tight')
    return path


def figure_pixels(fig: Figure, dpi: int = 80) -> np.ndarray:
    """``fig`` as an ``(H, W, 3)`` uint8 RGB array, drawn as ``save_figure`` draws a file (for a dashboard)."""
    FigureCanvasAgg(fig)
    buffer = BytesIO()
    fig.savefig(buffer, format='png', dpi=dpi, bbox_inches='tight')
    buffer.seek(0)
    with Image.open(buffer) as img:
        return np.asarray(img.convert('RGB'))


def short_layer_name(name: str) -> str:
    """A layer's name as the figures label it (``layer4.0.conv2``: ``layer4.0.c2``)."""
    return name.replace('.conv', '.c')


# ---------------------------------------------------------------------- per-layer gates / spans / nonlocality


def _heat(ax, values: np.ndarray, rows: Sequence[str], title: str, fmt: str, cmap: str, vmin=None, vmax=None,
          log: bool = False, annotate: bool = True) -> None:
    masked = np.ma.masked_invalid(values)
    finite = values[np.isfinite(values)]
    norm = None
    # log scale only when the values spread over more than a decade (spans do once heads leave locality)
    if log and finite.size and finite.min() > 0 and finite.max() / finite.min() > 10:
        norm = LogNorm(vmin=finite.min(), vmax=finite.max())
        vmin = vmax = None
    elif vmin is None and finite.size and np.ptp(finite) <= 1e-3 * np.abs(finite).max():
        # (nearly) equal values, e.g. spans at init: a colour scale over float noise would invent differences
        centre = float(finite.mean())
        vmin, vmax = centre - 0.5 * max(abs(centre), 1.0), centre + 0.5 * max(abs(centre), 1.0)
    im = ax.imshow(masked, cmap=cmap, vmin=vmin, vmax=vmax, norm=norm, aspect='auto')
    n_cols = values.shape[1]
    labels = [f'h{h}' for h in range(n_cols - 1)] + ['mean']
    ax.set_xticks(range(n_cols), labels, fontsize=8 if annotate else 6, rotation=0 if annotate else 90)
    ax.set_yticks(range(len(rows)), [short_layer_name(r) for r in rows], fontsize=8)
    ax.axvline(n_cols - 1.5, color='white', lw=2)
    ax.set_title(title, fontsize=10)
    for (r, c), v in np.ndenumerate(values):
        if annotate and np.isfinite(v):
            ax.text(c, r, format(v, fmt), ha='center', va='center', fontsize=7, color='white',
                    path_effects=_outline())
    ax.figure.colorbar(im, ax=ax, fraction=0.025, pad=0.01)


def _outline():
    return [patheffects.withStroke(linewidth=1.5, foreground='black')]


def _matrix(layers: Mapping[str, Mapping[str, Any]], key: str, mean_key: Optional[str] = None,
            scale: float = 1.0) -> np.ndarray:
    """``(layers, max_heads + 1)`` matrix of a per-head value with the layer mean in the last column (NaN pads)."""
    width = max(len(v[key]) for v in layers.values())
    out = np.full((len(layers), width + 1), np.nan)
    for r, entry in enumerate(layers.values()):
        vals = np.asarray(entry[key], dtype=float)
        out[r, :len(vals)] = vals
        out[r, -1] = entry[mean_key] if mean_key and entry.get(mean_key) is not None else vals.mean()
    return out * scale


def _summary_panels(layers: Mapping[str, Mapping[str, Any]], num_images: Any) -> List[Tuple]:
    """``(key, title, format, colour map, vmin, vmax, log scale, scale)`` of each heat chart, units in the titles."""
    panels = [('gate', r'gate $\sigma(\lambda_h)$ (0-1, 1 = positional)', '.2f', 'viridis', 0.0, 1.0, False, 1.0),
              ('span', r'span $1/\alpha_h$ (tokens$^2$)', '.2g', 'magma', None, None, True, 1.0)]
    if all(entry.get('sigma') for entry in layers.values()):
        panels.append(('sigma', r'width $\sigma_h = 1/\sqrt{2\alpha_h}$ (tokens)', '.2g', 'magma', None, None, True,
                       1.0))
    if all(entry.get('nonlocality') for entry in layers.values()):
        panels.append(('nonlocality', f'nonlocality, all keys (tokens; {num_images} images)', '.2f', 'cividis',
                       None, None, False, 1.0))
        if all(entry.get('nonlocality_real') for entry in layers.values()):
            panels += [('nonlocality_real', 'nonlocality, real keys renormalised (tokens)', '.2f', 'cividis', None,
                        None, False, 1.0),
                       ('padding_share', 'attention on padded keys (%)', '.0f', 'Reds', 0.0, None, False, 100.0)]
    return panels


def plot_summary(summary: Mapping[str, Any], path: str) -> str:
    """Heat charts (layer x head) of the gates sigmoid(lambda_h), spans 1/alpha_h (tokens^2), widths sigma_h
    (tokens) and, when measured, the nonlocality over all keys and over the real keys (tokens of each layer's input
    grid) and the share of attention on padded keys (%).

    Args:
        summary: ``tcnn.analysis.heads.summarize`` output (or a ``tcnn.gpsa_summary`` dict of layers).
        path: Output image path (``.png``, ``.pdf``, ``.svg``).
    """
    check_figure_path(path)
    layers = summary.get('layers', summary)
    if not layers:
        raise TcnnError('no GPSA layer in the summary: nothing to plot')
    panels = _summary_panels(layers, summary.get('num_images', '?'))
    n_heads = max(len(v['gate']) for v in layers.values())
    annotate = n_heads <= MANY_HEADS
    if not annotate:  # narrow cells without numbers, one chart under the other
        n_rows, n_cols = len(panels), 1
        fig = Figure(figsize=(2.2 + 0.2 * (n_heads + 1), n_rows * (0.9 + 0.3 * len(layers))), layout='constrained')
    else:  # up to three charts side by side, the layer names on the first of each row
        n_cols = min(3, len(panels))
        n_rows = math.ceil(len(panels) / n_cols)
        fig = Figure(figsize=(1.0 + 0.62 * (n_heads + 1) * n_cols, n_rows * (1.1 + 0.45 * len(layers))),
                     layout='constrained')
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    rows = list(layers)
    for i, (key, title, fmt, cmap, vmin, vmax, log, scale) in enumerate(panels):
        ax = axes[i // n_cols, i % n_cols]
        _heat(ax, _matrix(layers, key, f'{key}_mean', scale), rows, title, fmt, cmap, vmin, vmax, log=log,
              annotate=annotate)
        if annotate and i % n_cols:
            ax.set_yticks([])
    for ax in axes.flat[len(panels):]:
        ax.axis('off')
    fig.suptitle('GPSA heads per layer (distances in tokens of each layer\'s own input grid)', fontsize=11)
    return save_figure(fig, path)


# ---------------------------------------------------------------------- attention maps (Fig. 5)


def plot_attention(
        maps: Mapping[str, AttentionMaps],
        image: torch.Tensor,
        path: str,
        index: int = 0,
        parts: Sequence[str] = ATTENTION_PARTS,
        title: Optional[str] = None,
) -> str:
    """Write ``attention_figure(maps, image, index, parts, title)`` to ``path``; returns ``path``."""
    check_figure_path(path)
    return save_figure(attention_figure(maps, image, index, parts, title), path)


def attention_figure(
        maps: Mapping[str, AttentionMaps],
        image: torch.Tensor,
        index: int = 0,
        parts: Sequence[str] = ATTENTION_PARTS,
        title: Optional[str] = None,
) -> Figure:
    """Attention maps of every head of every GPSA layer for one query, laid out like T-CNN Fig. 5.

    One row per (part, layer), one column per head, the input image with the query pixel on the left. Each panel
    shows the head's attention over the layer's input grid (padding tokens cropped) with the query cell boxed, and
    the gate sigmoid(lambda_h) in red. With more than ``MANY_HEADS`` heads in a layer (5x5 and 7x7 depthwise convs),
    each (layer, part) is instead a block shaped like the conv's kernel, every head at the tap it started from, one
    block row per layer and one block column per part (gates: ``plot_summary``).

    Args:
        maps: ``tcnn.analysis.heads.attention_maps`` output.
        image: ``(3, H, W)`` image in [0, 1] (see ``tcnn.data.images.denormalize``).
        index: Which image of the batch the maps belong to.
        parts: Attention parts to show, rows in this order.
        title: Put before the figure's caption (e.g. the image's name).
    """
    if not maps:
        raise TcnnError('no attention maps to plot')
    bad = [p for p in parts if p not in ATTENTION_PARTS] if not isinstance(parts, str) else [parts]
    if bad or not parts:
        raise InvalidArgumentError(f'parts must be a list of {", ".join(ATTENTION_PARTS)}, got {parts!r}')
    layers = list(maps.values())
    batch = next(iter(maps.values())).mixed.shape[0]
    check_number(index, 'index', ge=0, integer=True)
    if index >= batch:
        raise InvalidArgumentError(f'index {index} is out of range: the maps hold {batch} images')
    n_heads = max(m.gate.numel() for m in layers)
    if n_heads > MANY_HEADS:
        return _attention_by_tap(layers, image, index, parts, title)
    rows = [(part, m) for part in parts for m in layers]
    # square panels of `cell` inches: size the figure from the grid so that no space is left over
    cell, wspace, hspace, top = 1.1, 0.06, 0.12, 0.5
    width = cell * (n_heads + 1.6) * (1 + wspace)
    height = cell * len(rows) * (1 + hspace) + top
    fig = Figure(figsize=(width, height))
    grid = fig.add_gridspec(len(rows), n_heads + 1, width_ratios=[1.6] + [1] * n_heads, wspace=wspace,
                            hspace=hspace, left=0.0, right=1.0, bottom=0.0, top=1 - top / height)

    _query_image(fig.add_subplot(grid[0:min(2, len(rows)), 0]), image, layers[0])
    for r, (part, m) in enumerate(rows):
        data = m.unpadded(m.part(part, index)).numpy()
        qy, qx = m.query_key[0] - m.padding[0], m.query_key[1] - m.padding[1]
        for h in range(n_heads):
            ax = fig.add_subplot(grid[r, h + 1])
            if h >= data.shape[0]:
                ax.axis('off')
                continue
            _map_panel(ax, data[h], qy, qx, lw=1)
            ax.text(0.03, 0.97, f'{m.gate[h].item():.2f}', transform=ax.transAxes, ha='left', va='top',
                    color='red', fontsize=7, fontweight='bold', path_effects=_outline_white())
            if any(m.padding):  # the panel shows the real keys: what it lacks of 1 went to the padding
                ax.text(0.03, 0.03, f'pad {max(0.0, 1.0 - float(data[h].sum())):.0%}', transform=ax.transAxes,
                        ha='left', va='bottom', color='white', fontsize=6, path_effects=_outline())
            if r == 0:
                ax.set_title(f'head {h}', fontsize=8)
            if h == n_heads - 1:  # row label on the right: the left column holds the input image
                ax.yaxis.set_label_position('right')
                ax.set_ylabel(f'{short_layer_name(m.layer)}\n{PART_TITLES[part]}', fontsize=7, rotation=270,
                              labelpad=18)
    caption = (r'attention weights of the query pixel on the real keys (red: gate $\sigma(\lambda_h)$; pad: share on '
               r'the padded keys, not drawn)')
    fig.suptitle(_titled(title, caption), fontsize=10, y=1 - 0.15 / height)
    return fig


def _query_image(ax, image: torch.Tensor, first: AttentionMaps) -> None:
    """The input image with the query cell of the first layer boxed."""
    ax.set_anchor('N')
    img = image.detach().float().cpu().permute(1, 2, 0).numpy()
    ax.imshow(img)
    h_img, w_img = img.shape[:2]
    cy, cx = h_img / first.out_size[0], w_img / first.out_size[1]  # one query cell, in image pixels
    ax.add_patch(Rectangle((first.query[1] * cx, first.query[0] * cy), cx, cy, fill=False, ec='red', lw=1.5))
    ax.set_title('query', fontsize=8)
    ax.axis('off')


def _attention_by_tap(layers: Sequence[AttentionMaps], image: torch.Tensor, index: int, parts: Sequence[str],
                      title: Optional[str]) -> Figure:
    """``plot_attention`` for many heads: per (layer, part) a block of panels shaped like the kernel."""
    kh = max(m.kernel_size[0] for m in layers)
    kw = max(m.kernel_size[1] for m in layers)
    cell, top = 0.42, 0.6  # inches per panel (of the largest kernel), title band
    block_w, block_h = cell * kw * 1.08, cell * kh * 1.08 + 0.3  # + the block's title
    width, height = block_w * (len(parts) + 0.7), block_h * len(layers) + top
    fig = Figure(figsize=(width, height))
    outer = fig.add_gridspec(len(layers), len(parts) + 1, width_ratios=[0.7] + [1] * len(parts), wspace=0.08,
                             hspace=0.3 / block_h, left=0.0, right=1.0, bottom=0.0, top=1 - top / height)
    _query_image(fig.add_subplot(outer[0, 0]), image, layers[0])
    for r, m in enumerate(layers):
        qy, qx = m.query_key[0] - m.padding[0], m.query_key[1] - m.padding[1]
        for c, part in enumerate(parts):
            data = m.unpadded(m.part(part, index)).numpy()
            label = fig.add_subplot(outer[r, c + 1])
            label.axis('off')
            label.set_title(f'{short_layer_name(m.layer)}: {PART_TITLES[part]}', fontsize=8)
            taps = outer[r, c + 1].subgridspec(m.kernel_size[0], m.kernel_size[1], wspace=0.08, hspace=0.08)
            for h in range(data.shape[0]):
                _map_panel(fig.add_subplot(taps[h // m.kernel_size[1], h % m.kernel_size[1]]), data[h], qy, qx, lw=0.6)
    fig.suptitle(_titled(title, 'attention weights of the query pixel on the real keys, each head at the kernel tap it '
                                'started from'),
                 fontsize=10, y=1 - 0.15 / height)
    return fig


def _map_panel(ax, data: np.ndarray, qy: int, qx: int, lw: float) -> None:
    """One head's attention map with the query cell boxed in red, no ticks."""
    ax.imshow(data, cmap='viridis', interpolation='nearest')
    ax.add_patch(Rectangle((qx - 0.5, qy - 0.5), 1, 1, fill=False, ec='red', lw=lw))
    ax.set_xticks([])
    ax.set_yticks([])


def _titled(title: Optional[str], caption: str) -> str:
    return f'{title}: {caption}' if title else caption


def _outline_white():
    return [patheffects.withStroke(linewidth=1.5, foreground='white')]
