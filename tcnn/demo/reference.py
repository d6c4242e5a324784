"""The documented distribution of the demo's headline numbers (``tcnn/demo/reference.json``, measured over many
full-pipeline seeds by ``benchmarks/demo_distribution.py``) and where a run's numbers lie in it.
"""
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import InvalidArgumentError
from .plan import DEMO_VERSION
from .results import seed_stats

__all__ = ['REFERENCE_FILE', 'REFERENCE_FORMAT', 'HEADLINE', 'HEADLINE_TITLES', 'BAND_SD', 'BAND_TEXT',
           'headline_values', 'build_reference', 'load_reference', 'compare_with_reference', 'reference_lines',
           'where_it_lies']


REFERENCE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'reference.json')
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
# A number is judged against the documented band: the documented range (min to max over the documented seeds)
# widened by BAND_SD documented standard deviations on each side. The documented seeds are a sample of a
# distribution, and another machine's floating-point rounding turns every seed into a new draw of it (docs/demo.md):
# a new draw leaves the bare range of n = 12 seeds with probability 2 / (n + 1), 15% per number (more for the
# default seeds 0 and 1, themselves among the range's ends), so a fresh install flagged numbers 0.1 past it; for a
# normal distribution it leaves the band with probability about 0.6% per value (simulated, n = 12), while a broken
# pipeline (a T-CNN that does not learn, a wrong conversion) lies many sd away. The band's margin is wider than the
# rounding of the printed numbers (3 significant digits) for every headline number, and a value printed equal to a
# range end counts as inside the range, so what the report prints never contradicts what it says.
BAND_SD = 2.0


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
    """The documented distribution (``tcnn/demo/reference.json``) from the ``results.json`` of demos run with several
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


def load_reference(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The documented distribution shipped with tcnn (or the one at ``path``); None if there is none."""
    path = path or REFERENCE_FILE
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8') as f:
        reference = json.load(f)
    return reference if reference.get('format') == REFERENCE_FORMAT else None


def compare_with_reference(results: Mapping[str, Any], reference: Optional[Mapping[str, Any]] = None,
                           ) -> Dict[str, Any]:
    """Where each headline number of ``results`` lies in the documented distribution of its plan.

    A number is ``inside`` when every seed's value lies within the documented band (``band``: the documented range,
    min to max over the documented seeds, widened by ``BAND_SD`` documented standard deviations each side), and
    ``in_range`` when every value, printed with 3 significant digits, lies within the printed range itself; ``sd``
    is how far the seed furthest from the documented mean lies from it, in documented standard deviations (signed),
    and ``past_range`` how far the seed furthest outside the range lies past its nearer end (0 inside it). Without a
    documented distribution for the plan, ``available`` is False and ``why`` says why.
    """
    reference = load_reference() if reference is None else reference
    if reference is None:
        return {'available': False, 'why': 'no documented distribution is installed'}
    if (_reference_plan(results['plan']) != reference['plan']
            or results.get('version', DEMO_VERSION) != reference['demo_version']):
        return {'available': False, 'why': f'the documented distribution is of the default plan (this run: plan '
                                           f'{results["plan"]["name"]!r})'}
    numbers = {}
    for key, values in headline_values(results).items():
        ref = reference['stats'].get(key)
        if ref is None:
            continue
        sds = [(v - ref['mean']) / ref['std'] if ref['std'] > 0 else (0.0 if v == ref['mean'] else math.inf)
               for v in values]
        furthest = max(range(len(values)), key=lambda i: abs(sds[i]))
        lo, hi = ref['min'] - BAND_SD * ref['std'], ref['max'] + BAND_SD * ref['std']
        past = [_past_range(v, ref) for v in values]
        beyond = max(range(len(values)), key=lambda i: abs(past[i]))
        numbers[key] = {'values': values, 'mean': sum(values) / len(values),
                        'inside': all(_within(v, lo, hi) for v in values), 'in_range': all(p == 0 for p in past),
                        'band': [lo, hi], 'sd': sds[furthest], 'furthest_seed': furthest,
                        'past_range': past[beyond], 'past_range_seed': beyond,
                        'reference': {k: ref[k] for k in ('mean', 'std', 'min', 'max', 'n')}}
    return {'available': True, 'seeds': max(s['n'] for s in reference['stats'].values()),
            'environments': [{k: e.get(k) for k in ('torch', 'timm', 'pillow', 'threads', 'jobs', 'device', 'seeds')}
                             for e in reference['environments']],
            'measured': reference.get('measured', ''), 'numbers': numbers,
            'outside': [k for k, n in numbers.items() if not n['inside']]}


def _printed(value: float) -> float:
    """``value`` as the report prints it (3 significant digits)."""
    return float(f'{value:.3g}')


def _within(value: float, lo: float, hi: float) -> bool:
    """``lo <= value <= hi``, or so as printed: a value printed equal to a printed end is within."""
    return lo <= value <= hi or _printed(lo) <= _printed(value) <= _printed(hi)


def _past_range(value: float, ref: Mapping[str, Any]) -> float:
    """How far ``value`` lies past the documented range, in documented sd (signed: below its min < 0 < above its
    max); 0 within it (``_within``)."""
    if _within(value, ref['min'], ref['max']):
        return 0.0
    end = ref['max'] if value > ref['max'] else ref['min']
    return (value - end) / ref['std'] if ref['std'] > 0 else math.copysign(math.inf, value - end)


BAND_TEXT = f'the documented range ± {BAND_SD:g} sd'


def where_it_lies(number: Mapping[str, Any]) -> str:
    if number.get('in_range', number['inside']):
        return 'inside the documented range'
    if number['inside']:
        past = number['past_range']
        return (f'inside the band ({BAND_TEXT}): seed {number["past_range_seed"]} lies {abs(past):.1f} sd '
                f'{"above the documented maximum" if past > 0 else "below the documented minimum"}')
    sd = number['sd']
    band = ' to '.join(f'{v:.3g}' for v in number['band'])
    return (f'outside the band ({BAND_TEXT}: {band}): seed {number["furthest_seed"]} lies {abs(sd):.1f} sd '
            f'{"above" if sd > 0 else "below"} the documented mean')


def reference_lines(results: Mapping[str, Any]) -> List[str]:
    """How far the run's numbers lie from the documented distribution, in plain words (the log's last lines)."""
    ref = results.get('reference') or {}
    if not ref.get('available'):
        return [f'No comparison with the documented distribution: {ref.get("why", "none")}.']
    numbers, outside = ref['numbers'], ref['outside']
    in_range = sum(n.get('in_range', n['inside']) for n in numbers.values())
    head = f'Against the documented distribution ({ref["seeds"]} full-pipeline seeds, docs/demo.md): '
    if not outside:
        head += (f'all {len(numbers)} headline numbers lie inside the documented band ({BAND_TEXT}), '
                 f'{in_range} of them inside the range itself.')
    else:
        head += (f'{len(numbers) - len(outside)} of {len(numbers)} headline numbers lie inside the documented band '
                 f'({BAND_TEXT}); outside: {"; ".join(HEADLINE_TITLES[key] for key in outside)}.')
    lines = [head]
    for key in ref['outside']:
        n = numbers[key]
        lines.append(f'  {HEADLINE_TITLES[key]}: {", ".join(f"{v:.3g}" for v in n["values"])} vs documented '
                     f'{n["reference"]["mean"]:.3g} ± {n["reference"]["std"]:.2g} ({n["reference"]["min"]:.3g} to '
                     f'{n["reference"]["max"]:.3g}): {where_it_lies(n)}')
    return lines
