"""The distribution of the demo's headline numbers over many seeds (``benchmarks/demo_distribution.py`` pools the
``results.json`` of demos into it; docs/demo.md quotes it). A demo's report does not compare itself with it: it
judges the paper's claim from its own seeds (``tcnn.demo.judgement``).
"""
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from ..errors import InvalidArgumentError
from .results import seed_stats

__all__ = ['REFERENCE_FORMAT', 'HEADLINE', 'HEADLINE_TITLES', 'headline_values', 'build_reference']


REFERENCE_FORMAT = 'tcnn-demo-reference'
# The headline numbers, per seed: (key, what it is). Keys are ARM/QUANTITY; gains are of the T-CNN arm over the
# no-SA run of the same seed, in points; gate, span and nonlocality are the fine-tuned T-CNN's layer means.
HEADLINE: Tuple[Tuple[str, str], ...] = (
    ('cnn/clean_top1', 'CNN (start point), clean top-1 %'),
    ('cnn/corrupted_top1', 'CNN (start point), corrupted top-1 %'),
    ('no-sa/clean_top1', 'no-SA, clean top-1 %'),
    ('no-sa/corrupted_top1', 'no-SA, corrupted top-1 %'),
    ('t-cnn/clean_top1', 'T-CNN, clean top-1 %'),
    ('t-cnn/corrupted_top1', 'T-CNN, corrupted top-1 %'),
    ('t-cnn/gain_clean', 'T-CNN gain over no-SA, clean (points)'),
    ('t-cnn/gain_corrupted', 'T-CNN gain over no-SA, corrupted (points)'),
    ('t-cnn-late/clean_top1', 'late T-CNN, clean top-1 %'),
    ('t-cnn-late/corrupted_top1', 'late T-CNN, corrupted top-1 %'),
    ('t-cnn-late/gain_clean', 'late T-CNN gain over no-SA, clean (points)'),
    ('t-cnn-late/gain_corrupted', 'late T-CNN gain over no-SA, corrupted (points)'),
    ('t-cnn/gate_mean', 'T-CNN gate sigma(lambda) after fine-tuning'),
    ('t-cnn/span_mean', 'T-CNN span 1/alpha after fine-tuning'),
    ('t-cnn/nonlocality_mean', 'T-CNN nonlocality after fine-tuning (tokens)'),
)
HEADLINE_TITLES = dict(HEADLINE)
def headline_values(results: Mapping[str, Any]) -> Dict[str, List[float]]:
    """Every headline number of a demo's results, one value per seed (in seed order); numbers of an arm the plan
    does not have are left out."""
    out: Dict[str, List[float]] = {}
    for key, _ in HEADLINE:
        arm, quantity = key.split('/')
        if quantity.startswith('gain_'):
            stats = results['summary'].get(arm, {}).get(quantity)
            values = list(stats['values']) if stats else []
        else:
            values = [r[quantity] for r in sorted(results['runs'], key=lambda r: r['seed'])
                      if r['arm'] == arm and r.get(quantity) is not None]
        if values:
            out[key] = [float(v) for v in values]
    return out


def _reference_plan(plan: Mapping[str, Any]) -> Dict[str, Any]:
    """The plan without what a distribution may vary (the number of seeds) or only names (the plan's name)."""
    return {k: v for k, v in plan.items() if k not in ('name', 'seeds')}


def build_reference(runs: Sequence[Mapping[str, Any]], measured: str = '') -> Dict[str, Any]:
    """The distribution over seeds from the ``results.json`` of demos run with several
    seeds, one per environment (torch build, threads): every environment's per-seed values and the statistics over
    all of them pooled, since another machine's number may come from any of them.

    Args:
        runs: ``results.json`` contents, all of one plan (seeds aside) and demo version.
        measured: When (a date), for the record.
    """
    if not runs:
        raise InvalidArgumentError('build_reference needs the results of at least one demo')
    plan = _reference_plan(runs[0]['plan'])
    for r in runs:
        if _reference_plan(r['plan']) != plan or r['version'] != runs[0]['version']:
            raise InvalidArgumentError('the results come from different plans or demo versions; a distribution '
                                       'pools runs of one plan only')
    environments = []
    pooled: Dict[str, List[float]] = {}
    for r in runs:
        values = headline_values(r)
        for key, v in values.items():
            pooled.setdefault(key, []).extend(v)
        environments.append(dict(r['environment'], seeds=r['plan']['seeds'], wall_s=r.get('wall_s'),
                                 values=values))
    return {'format': REFERENCE_FORMAT, 'demo_version': runs[0]['version'], 'plan': plan, 'measured': measured,
            'environments': environments,
            'stats': {key: dict(seed_stats(v), n=len(v)) for key, v in pooled.items()}}
