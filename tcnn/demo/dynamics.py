"""What the demo's runs did over their epochs, from their ``metrics.jsonl``: whether each CNN reached its plateau
before fine-tuning started from it, and the T-CNN's fine-tuning in the terms of the paper's Fig. 4 (T-CNN,
arXiv:2106.05795, section 4): A the dip of accuracy during the learning-rate warm-up, B the attention span
1/alpha_h and C the gate sigmoid(lambda_h) of every GPSA layer, from the fine-tuning init to the end.
"""
import math
from statistics import fmean
from typing import Any, Dict, List, Mapping, Optional, Sequence

__all__ = ['PLATEAU_POINTS', 'CONTENT_GATE', 'INIT_GATE', 'plateau', 'warmup_dip', 'layer_trajectories', 'lr_sum',
           'summarize_training']

# A CNN is at its plateau when its mean val top-1 over the last tenth of its epochs (at least 2) is at most this many
# points above the mean over the tenth before (means, not single epochs: one epoch's val top-1 on 1000 images moves
# by about 1.5 points from sampling alone). A tenth, not a fifth: under the cosine schedule the learning rate of the
# fifth before the last is still up to 40% of its peak, so a run whose training has ended still shows the climb of
# that fifth (docs/demo.md, "The converged CNNs").
PLATEAU_POINTS = 1.0
# A head whose gate ends below this attends by content almost only (the paper's Fig. 5: "sigma(lambda_h) = 0").
CONTENT_GATE = 0.1
# The gate of every head at the fine-tuning init: sigmoid(lambda = 1) (T-CNN section 2).
INIT_GATE = 1.0 / (1.0 + math.exp(-1.0))


def plateau(records: Sequence[Mapping[str, Any]], key: str = 'val_top1') -> Optional[Dict[str, Any]]:
    """Whether a run's ``key`` stopped rising: its mean over the last tenth of the epochs (at least 2) against the
    mean over the tenth before. None for a run too short to tell (fewer than 4 epochs).

    Returns:
        ``window`` (epochs per tenth), ``last_mean``, ``before_mean``, ``gain`` (points, last minus before),
        ``final`` (the last epoch's value), ``best`` and ``at_plateau`` (``gain <= PLATEAU_POINTS``).
    """
    values = [float(r[key]) for r in records if r.get(key) is not None]
    if len(values) < 4:
        return None
    window = max(2, round(len(values) / 10))
    window = min(window, len(values) // 2)
    last, before = values[-window:], values[-2 * window:-window]
    gain = fmean(last) - fmean(before)
    return {'epochs': len(values), 'window': window, 'last_mean': fmean(last), 'before_mean': fmean(before),
            'gain': gain, 'final': values[-1], 'best': max(values), 'at_plateau': gain <= PLATEAU_POINTS}


def warmup_dip(records: Sequence[Mapping[str, Any]], start: float, warmup: int,
               key: str = 'val_top1') -> Optional[Dict[str, Any]]:
    """Fig. 4A: how far a fine-tuning run's ``key`` fell below its start point during the warm-up, and where it
    ended. None for a run without epochs.

    Args:
        records: The run's per-epoch metrics.
        start: The value before fine-tuning (the CNN's last val top-1: in its exact configuration the T-CNN is the
            CNN).
        warmup: Warm-up epochs (at least the first epoch is looked at).
    """
    values = [float(r[key]) for r in records if r.get(key) is not None]
    if not values:
        return None
    during = values[:max(1, warmup)]
    low = min(during)
    return {'start': start, 'warmup_epochs': warmup, 'warmup_min': low, 'dip': max(0.0, start - low),
            'final': values[-1], 'recovered': values[-1] >= start}


def _heads(record: Mapping[str, Any], layer: str, key: str) -> Optional[List[float]]:
    entry = (record.get('gpsa') or {}).get(layer)
    return None if entry is None or entry.get(key) is None else [float(v) for v in entry[key]]


def layer_trajectories(records: Sequence[Mapping[str, Any]], warmup: int) -> Dict[str, Dict[str, Any]]:
    """Fig. 4B and C per GPSA layer: the head mean of the gate and of the span at the fine-tuning init, at the end
    of the warm-up and at the end, and the heads whose gate ended below ``CONTENT_GATE``.

    The init values are the paper's (gate sigmoid(1), span 1, every head alike). For a run reparameterised late,
    "end of warm-up" is its first epoch with GPSA layers if that comes after the warm-up.
    """
    with_gpsa = [r for r in records if r.get('gpsa')]
    if not with_gpsa:
        return {}
    first = next((r for r in with_gpsa if r['epoch'] >= warmup - 1), with_gpsa[-1])
    last = with_gpsa[-1]
    out = {}
    for layer in last['gpsa']:
        gates, spans = _heads(last, layer, 'gate'), _heads(last, layer, 'span')
        warm_gates, warm_spans = _heads(first, layer, 'gate'), _heads(first, layer, 'span')
        if not gates or not spans:
            continue
        out[layer] = {
            'heads': len(gates),
            'gate': {'init': INIT_GATE, 'warmup': fmean(warm_gates) if warm_gates else None, 'final': fmean(gates),
                     'heads_final': gates},
            'span': {'init': 1.0, 'warmup': fmean(warm_spans) if warm_spans else None, 'final': fmean(spans),
                     'heads_final': spans, 'wider': sum(s > 1.05 for s in spans),
                     'narrower': sum(s < 1 / 1.05 for s in spans)},
            'content_heads': sum(g < CONTENT_GATE for g in gates),
            'warmup_epoch': int(first['epoch']), 'final_epoch': int(last['epoch']),
        }
    return out


def lr_sum(records: Sequence[Mapping[str, Any]], batch_size: int, key: str = 'lr') -> Optional[float]:
    """An upper bound of the sum of ``key`` (a learning rate) over every update of a run: per epoch its updates
    (``train_images // batch_size``) times the larger of the rate at the epoch's start (the last epoch's end, 0 before
    the first: the warm-up starts near 0) and at its end; the schedule is monotone within an epoch (a linear warm-up,
    then cosine decay). None without the rates."""
    total, before = 0.0, 0.0
    for r in records:
        if r.get(key) is None or not r.get('train_images'):
            return None
        total += (int(r['train_images']) // batch_size) * max(before, float(r[key]))
        before = float(r[key])
    return total if records else None


def _last(records: Sequence[Mapping[str, Any]], key: str = 'val_top1') -> Optional[float]:
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return values[-1] if values else None


def summarize_training(runs: Sequence[Mapping[str, Any]], metrics: Mapping[str, Sequence[Mapping[str, Any]]],
                       warmup: int, cnn_arm: str = 'cnn', batch_size: Optional[int] = None) -> Dict[str, Any]:
    """Every seed's CNN plateau, every fine-tuning run's warm-up dip and every T-CNN's layer trajectories.

    Args:
        runs: The demo's runs (``seed``, ``arm``, ``name``).
        metrics: Per run name, its per-epoch metrics.
        warmup: Warm-up epochs of the fine-tuning runs.
        cnn_arm: The arm name of the CNNs trained from scratch (a seed's fine-tuning runs start from its CNN).
        batch_size: Images per update of the fine-tuning runs (for ``lr_sum``; None: not computed).

    Returns:
        ``cnn`` (per seed: ``plateau``'s dict or None), ``cnns_at_plateau`` (of ``cnns``; None where no CNN ran long
        enough to tell) and ``runs`` (per fine-tuning run name: ``dip``, ``layers``).
    """
    cnns = {r['seed']: metrics[r['name']] for r in runs if r['arm'] == cnn_arm}
    cnn = {seed: plateau(records) for seed, records in cnns.items()}
    finetuned = {}
    for r in runs:
        if r['arm'] == cnn_arm:
            continue
        start = _last(cnns.get(r['seed'], []))
        finetuned[r['name']] = {
            'seed': r['seed'], 'arm': r['arm'],
            'dip': warmup_dip(metrics[r['name']], start, warmup) if start is not None else None,
            'layers': layer_trajectories(metrics[r['name']], warmup),
            'lr_sum': lr_sum(metrics[r['name']], batch_size) if batch_size else None}
    told = [p for p in cnn.values() if p is not None]
    return {'plateau_points': PLATEAU_POINTS, 'content_gate': CONTENT_GATE, 'warmup_epochs': warmup,
            'cnn': {str(seed): p for seed, p in sorted(cnn.items())}, 'cnns': len(cnn),
            'cnns_at_plateau': sum(p['at_plateau'] for p in told) if told else None, 'runs': finetuned}
