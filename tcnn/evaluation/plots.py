"""Figures of training runs and scores (T-CNN, arXiv:2106.05795, Figs. 3 and 4): training curves from a run's
``metrics.jsonl`` and accuracy by corruption from the demo's results. The figures of the heads themselves (gates,
spans, attention maps) are ``tcnn.analysis.figures``'.

Figures are drawn on matplotlib's Agg canvas directly (``matplotlib.figure.Figure``, no pyplot), so importing this
module never changes the user's matplotlib backend and works on headless machines. Files are written atomically.
"""
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, ScalarFormatter

from ..analysis.figures import check_figure_path, save_figure, short_layer_name
from ..errors import InvalidTypeError, TcnnError
from ..files.run_folder import METRICS_FILE, read_metrics

__all__ = ['plot_training_curves', 'load_metrics', 'plot_demo_robustness']


# ---------------------------------------------------------------------- training curves (Fig. 4)


def load_metrics(path: str) -> List[Dict[str, Any]]:
    """Read ``metrics.jsonl`` (a file, or the run directory holding it): one record per epoch, sorted by epoch.

    A resumed run may log an epoch twice: the last record wins. A truncated last line (a run still writing) is
    skipped; any other malformed line is an error.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'path must be a run folder or metrics file path, got {type(path).__name__}')
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    elif path.endswith(('.pt', '.pth', '.safetensors')):
        raise TcnnError(f'{path} is a model or checkpoint file; tcnn plot takes the run folder that holds it '
                        f'({os.path.dirname(os.path.abspath(path))}) or its {METRICS_FILE}')
    if not os.path.isfile(path):
        raise TcnnError(f'no metrics file at {path} (tcnn train writes RUN_DIR/{METRICS_FILE})')
    records = read_metrics(path)
    if not records:
        raise TcnnError(f'{path} holds no epoch yet')
    return records


def _series(records: Sequence[Mapping[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for rec in records:
        v = rec.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(rec['epoch'] + 1)
            ys.append(float(v))
    return np.asarray(xs), np.asarray(ys)


def _head_series(records: Sequence[Mapping[str, Any]], layer: str, key: str) -> Tuple[np.ndarray, np.ndarray]:
    """Epochs ``(E,)`` and per-head values ``(E, N_h)`` of one layer (epochs without the layer are skipped)."""
    xs, ys = [], []
    for rec in records:
        entry = (rec.get('gpsa') or {}).get(layer)
        if entry and entry.get(key):
            xs.append(rec['epoch'] + 1)
            ys.append(entry[key])
    return np.asarray(xs), np.asarray(ys, dtype=float)


def plot_training_curves(records: Sequence[Mapping[str, Any]], path: str, title: Optional[str] = None) -> str:
    """T-CNN Fig. 4 from per-epoch metrics: A train/val top-1 (%), B span 1/alpha_h (tokens^2; the right axis reads
    it as the Gaussian width sigma = sqrt(span / 2) in tokens), C gate sigmoid(lambda_h) (0-1).

    In B and C thin lines are heads and thick lines the layer means, one colour per GPSA layer. A run without GPSA
    layers (the no-SA baseline) gets panel A only.

    Args:
        records: ``load_metrics`` output (``epoch``, ``train_top1``, ``val_top1``, ``gpsa`` per record).
        path: Output image path.
        title: Put before the figure's caption (e.g. the image's name).
    """
    check_figure_path(path)
    if not records:
        raise TcnnError('no epochs to plot')
    layers: List[str] = []
    for rec in records:
        for name in rec.get('gpsa') or {}:
            if name not in layers:
                layers.append(name)
    n_panels = 3 if layers else 1
    fig = Figure(figsize=(4.6 * n_panels, 3.6))
    axes = fig.subplots(1, n_panels, squeeze=False, sharex=True)[0]

    ax = axes[0]
    for key, label, style in (('train_top1', 'train', '--'), ('val_top1', 'val', '-'),
                              ('ema_val_top1', 'val (EMA)', ':')):
        xs, ys = _series(records, key)
        if len(xs):
            ax.plot(xs, ys, style, marker='o' if len(xs) < 20 else None, ms=3, label=label)
    first = next((r['epoch'] for r in records if r.get('gpsa')), None)
    if first is not None and first > records[0]['epoch']:  # late reparameterisation (T-CNN Table 3)
        for panel in axes:
            panel.axvline(first + 0.5, color='grey', lw=0.8, ls='--')
        ax.annotate('reparameterised', (first + 0.5, 0.02), xycoords=('data', 'axes fraction'), fontsize=7,
                    color='grey', rotation=90, ha='right', va='bottom')
    ax.set_xlabel('epoch')
    ax.set_ylabel('top-1 (%)')
    ax.set_title('A: accuracy', fontsize=10)
    if ax.lines:
        ax.legend(fontsize=8)

    colors = [f'C{i % 10}' for i in range(len(layers))]
    head_panels = [(axes[1], 'span', r'B: span $1/\alpha_h$ (tokens$^2$)', True),
                   (axes[2], 'gate', r'C: gate $\sigma(\lambda_h)$ (0-1, 1 = positional)', False)] if layers else []
    for ax, key, label, log in head_panels:
        for name, color in zip(layers, colors):
            xs, ys = _head_series(records, name, key)
            if not len(xs):
                continue
            ax.plot(xs, ys, color=color, lw=0.6, alpha=0.45)
            ax.plot(xs, ys.mean(axis=1), color=color, lw=2.4, label=short_layer_name(name))
        ax.set_xlabel('epoch')
        ax.set_title(label, fontsize=10)
        if log:
            ax.set_yscale('log')
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
            lo, hi = ax.get_ylim()
            if hi / lo < 4:  # spans that barely move: show at least a factor 4, not float noise
                mid = math.sqrt(lo * hi)
                ax.set_ylim(mid / 2, mid * 2)
            # the span is no distance; the Gaussian's width sigma = sqrt(span / 2) is, in tokens
            sigma_axis = ax.secondary_yaxis('right', functions=(_span_to_sigma, _sigma_to_span))
            sigma_axis.set_ylabel(r'width $\sigma = \sqrt{\mathrm{span}/2}$ (tokens)', fontsize=8)
        else:
            ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=7)
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def _span_to_sigma(span: np.ndarray) -> np.ndarray:
    return np.sqrt(np.clip(span, 1e-12, None) / 2.0)


def _sigma_to_span(sigma: np.ndarray) -> np.ndarray:
    return 2.0 * np.square(sigma)


def plot_demo_robustness(results: Mapping[str, Any], path: str, titles: Optional[Mapping[str, str]] = None) -> str:
    """T-CNN Fig. 3 in miniature, from ``tcnn demo``'s results: A top-1 per corruption (mean over severities),
    B top-1 per severity (mean over corruptions), one colour per model; bars and points are seed means, error bars
    the spread (standard deviation) over seeds.

    Args:
        results: ``results.json`` of ``tcnn demo`` (``runs``, each with its ``arm``, ``corruptions`` and
            ``corrupted_by_severity``; the CNN trained from scratch is arm ``cnn``).
        path: Output image path.
        titles: Legend name per arm (default: the arm names).
    """
    check_figure_path(path)
    groups: Dict[str, List[Mapping[str, Any]]] = {}
    for run in results['runs']:
        groups.setdefault((titles or {}).get(run['arm'], run['arm']), []).append(run)
    corruptions = list(results['runs'][0]['corruptions'])
    labels = ['clean'] + corruptions
    fig = Figure(figsize=(11, 3.8))
    ax_c, ax_s = fig.subplots(1, 2, gridspec_kw={'width_ratios': [3, 1.2]})
    width = 0.8 / len(groups)
    for g, (name, runs) in enumerate(groups.items()):
        per = np.array([[r['clean_top1']] + [r['corruptions'][c]['top1'] for c in corruptions] for r in runs])
        x = np.arange(len(labels)) + (g - (len(groups) - 1) / 2) * width
        ax_c.bar(x, per.mean(0), width, yerr=per.std(0, ddof=1) if len(runs) > 1 else None, label=name,
                 color=f'C{g}', capsize=2)
        sev = sorted(runs[0]['corrupted_by_severity'], key=int)
        values = np.array([[r['corrupted_by_severity'][s] for s in sev] for r in runs])
        ax_s.errorbar([int(s) for s in sev], values.mean(0), yerr=values.std(0, ddof=1) if len(runs) > 1 else None,
                      marker='o', ms=3, color=f'C{g}', label=name, capsize=2)
    ax_c.set_xticks(np.arange(len(labels)))
    ax_c.set_xticklabels([lbl.replace('_', ' ') for lbl in labels], rotation=25, ha='right', fontsize=8)
    ax_c.set_ylabel('top-1 (%)')
    ax_c.set_title('A: accuracy by corruption (mean over severities)', fontsize=10)
    ax_c.legend(fontsize=7, ncol=len(groups))
    ax_s.set_xlabel('severity')
    ax_s.set_title('B: by severity', fontsize=10)
    ax_s.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return save_figure(fig, path)
