"""The demo's judgement of the paper's claim: the paired gain of the T-CNN over the same CNN fine-tuned without
self-attention, with its 95% interval over seeds, and a check that the T-CNN learned to use attention at all.

The claim under test (T-CNN, arXiv:2106.05795, Table 1 "Without SA" vs "With SA", and Table 2): fine-tuning a
converged CNN with self-attention gives a better model than the same fine-tuning without it, on clean images
(+0.3 to +0.6 top-1 on ImageNet) and on corrupted ones. Per seed both arms start from the same CNN and see the same
data, so the gain is paired (T-CNN minus no-SA, seed by seed) and its interval is Student's t over the seeds.

A gain says nothing about the method if the T-CNN's heads never left their init: with its gates frozen, or trained
at the base learning rate instead of the paper's 0.1, a T-CNN cannot move its attention far from where the
conversion put it, and any difference from the no-SA arm is the reparameterisation's optimisation, not learned
attention. So the judgement first checks that the gates moved further than the base learning rate could have
moved them (``moved_beyond_base``), and only then reads the intervals.
"""
import math
from statistics import fmean
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .dynamics import INIT_GATE

__all__ = ['SIGMOID_SLOPE', 'PAPER_GAIN', 'T_975', 't_quantile_975', 'interval', 'gate_change', 'base_rate_bound',
           'judge', 'judgement_lines']

# The mechanism check. AdamW moves a parameter by about its learning rate per update at most (|m / sqrt(v)| <= 1 but
# for rare transients), and sigmoid' <= 1/4, so over a run a gate sigmoid(lambda_h) trained at the base learning rate
# moves by at most SIGMOID_SLOPE x (the sum of the base rate over the run's updates). The T-CNN passes when the mean
# over seeds of its mean |gate change| (over heads and GPSA layers) is larger than that bound: frozen gates move 0,
# gates at the base rate stay below it, gates at the paper's 1000x rate can move far past it.
SIGMOID_SLOPE = 0.25
# The paper's own numbers beside the demo's (T-CNN Table 1: top-1 of the fine-tuning with SA minus without SA).
PAPER_GAIN = 'ImageNet, T-CNN Table 1: +0.3 to +0.6 top-1 from self-attention over the same fine-tuning without it'

# Student's t 0.975 quantiles for 1..30 degrees of freedom (two-sided 95% intervals).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, then the Cornish-Fisher expansion around
    the normal's 1.95996 (within 1e-3 of the exact value beyond 30)."""
    if df < 1:
        raise ValueError(f'a t interval needs at least 1 degree of freedom, got {df}')
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def interval(values: Sequence[float]) -> Dict[str, Any]:
    """Mean and two-sided 95% Student's t interval of ``values`` (one value: no interval, ``lo`` = ``hi`` = None).

    Returns:
        ``n``, ``mean``, ``std`` (sample), ``half`` (half-width), ``lo``, ``hi`` and ``sign``: ``positive`` (the
        interval lies above 0), ``negative`` (below), ``zero inside`` or ``one seed``.
    """
    n = len(values)
    mean = fmean(values)
    if n < 2:
        return {'n': n, 'mean': mean, 'std': 0.0, 'half': None, 'lo': None, 'hi': None, 'sign': 'one seed'}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    lo, hi = mean - half, mean + half
    sign = 'positive' if lo > 0 else 'negative' if hi < 0 else 'zero inside'
    return {'n': n, 'mean': mean, 'std': std, 'half': half, 'lo': lo, 'hi': hi, 'sign': sign}


def gate_change(layers: Mapping[str, Mapping[str, Any]]) -> Optional[float]:
    """Mean over every head of every GPSA layer of |gate at the end - gate at the init| (``layer_trajectories``'
    output of one run); None without GPSA layers."""
    changes = [abs(g - INIT_GATE) for e in layers.values() for g in e['gate']['heads_final']]
    return fmean(changes) if changes else None


def base_rate_bound(lr_sum: Optional[float]) -> Optional[float]:
    """The most a gate can move over a run trained at the base learning rate (``lr_sum``: the rate summed over the
    run's updates, ``tcnn.demo.dynamics.lr_sum``)."""
    return None if lr_sum is None else SIGMOID_SLOPE * lr_sum


def _gain(summary: Mapping[str, Any], key: str) -> Optional[Dict[str, Any]]:
    stats = summary.get('t-cnn', {}).get(key)
    return interval(stats['values']) if stats else None


def judge(results: Mapping[str, Any]) -> Dict[str, Any]:
    """The verdict on the paper's claim from a demo's ``results``.

    Returns:
        ``gain_clean``, ``gain_corrupted`` (``interval`` of the paired gains, points), ``gate_change`` and
        ``base_bound`` (per seed: the T-CNN's mean |gate change| and ``base_rate_bound``), ``attention_learned``
        (the mean over seeds of the gate changes exceeds the mean of the bounds) and ``verdict``:
        ``method failed`` (the gates did not move: the T-CNN did not learn attention, its numbers do not test the
        claim), ``supports`` (a gain interval above 0 and none below), ``contradicts`` (a gain interval below 0),
        ``no difference shown`` (both intervals hold 0) or ``one seed`` (no interval).
    """
    summary = results['summary']
    gains = {key: _gain(summary, key) for key in ('gain_clean', 'gain_corrupted')}
    runs = [r for r in (results.get('training') or {}).get('runs', {}).values() if r['arm'] == 't-cnn']
    changes = {str(r['seed']): gate_change(r['layers']) for r in runs}
    bounds = {str(r['seed']): base_rate_bound(r.get('lr_sum')) for r in runs}
    measured = [(changes[s], bounds[s]) for s in changes if changes[s] is not None and bounds[s] is not None]
    learned = bool(measured) and fmean(c for c, _ in measured) > fmean(b for _, b in measured)
    signs = [g['sign'] for g in gains.values() if g]
    if not learned:
        verdict = 'method failed'
    elif not signs or 'one seed' in signs:
        verdict = 'one seed'
    elif 'negative' in signs:
        verdict = 'contradicts'
    elif 'positive' in signs:
        verdict = 'supports'
    else:
        verdict = 'no difference shown'
    return {'gain_clean': gains['gain_clean'], 'gain_corrupted': gains['gain_corrupted'], 'gate_change': changes,
            'base_bound': bounds, 'attention_learned': learned, 'verdict': verdict, 'paper': PAPER_GAIN}


def _ci(g: Mapping[str, Any]) -> str:
    if g['lo'] is None:
        return f'{g["mean"]:+.1f} points (one seed, no interval)'
    return f'{g["mean"]:+.1f} points, 95% CI {g["lo"]:+.1f} to {g["hi"]:+.1f} ({g["n"]} seeds)'


def judgement_lines(judgement: Mapping[str, Any]) -> List[str]:
    """The judgement in plain words (the headline first)."""
    clean, corrupted = judgement['gain_clean'], judgement['gain_corrupted']
    lines = []
    if clean and corrupted:
        lines.append(f'Headline: T-CNN minus the same CNN fine-tuned without self-attention, paired by seed: clean '
                     f'{_ci(clean)}; corrupted {_ci(corrupted)}.')
    changes = [c for c in judgement['gate_change'].values() if c is not None]
    bounds = [b for b in judgement['base_bound'].values() if b is not None]
    moved = (f'mean |gate change| {fmean(changes):.3f} over seeds ({min(changes):.3f} to {max(changes):.3f}), against '
             f'at most {fmean(bounds):.3f} at the base learning rate' if changes and bounds else
             'no GPSA layer measured')
    verdict = judgement['verdict']
    if verdict == 'method failed':
        lines.append(f'Verdict: the method failed its check: the T-CNN\'s gates moved no further than the base '
                     f'learning rate allows ({moved}). It did not learn its attention, so its accuracy does not test '
                     'the paper\'s claim.')
    else:
        lines.append(f'The T-CNN learned its attention: its gates moved further than the base learning rate allows '
                     f'({moved}).')
        lines.append({
            'supports': 'Verdict: supports the paper\'s claim: a gain interval lies above 0 and none below.',
            'contradicts': 'Verdict: contradicts the paper\'s claim: a gain interval lies below 0.',
            'no difference shown': 'Verdict: no difference shown: both 95% intervals hold 0 (a null result at '
                                   'this number of seeds).',
            'one seed': 'Verdict: none with one seed (run more seeds for an interval).'}[verdict])
    lines.append(f'The paper\'s own number: {judgement["paper"]}.')
    return lines
