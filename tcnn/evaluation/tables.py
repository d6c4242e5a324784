"""Tables: plain-text and markdown rendering of any table (``tcnn eval``, the demo's report and Hub model cards use
them), and ``tcnn eval``'s report as a table of metrics, its notes and its files (T-CNN, arXiv:2106.05795, Table 2
turned sideways: one column per model).
"""
import json
import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..atomic import atomic_write_text
from ..errors import InvalidArgumentError
from ..paths import check_output_file
from .suites import BENCHMARK_CORRUPTIONS, CORRUPTION_CATEGORIES, EXTRA_CORRUPTIONS, SEVERITIES, SUITE_TITLES

__all__ = ['format_table', 'format_markdown', 'results_table', 'results_notes', 'write_results']


# ---------------------------------------------------------------------- plain-text and markdown tables


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table with aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ['  '.join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def format_markdown(header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> str:
    """GitHub markdown table (metric names left-aligned, numbers right-aligned), then ``notes`` as a list."""
    def esc(s: str) -> str:
        s = str(s).replace('|', '\\|')
        return s.replace('  ', '&nbsp;&nbsp;') if s.startswith('  ') else s
    lines = ['| ' + ' | '.join(esc(h) for h in header) + ' |',
             '|' + '|'.join([':---'] + ['---:'] * (len(header) - 1)) + '|']
    lines += ['| ' + ' | '.join(esc(c) for c in r) + ' |' for r in rows]
    if notes:
        lines += [''] + [f'- {note}' for note in notes]
    return '\n'.join(lines) + '\n'


# ---------------------------------------------------------------------- tcnn eval's report


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    return '-' if v is None or (isinstance(v, float) and math.isnan(v)) else f'{v:.2f}'


def _size_text(result: Mapping[str, Any]) -> str:
    size = result['img_size']
    return f'{size} px' if isinstance(size, int) else f'{size[0]}x{size[1]} px'


def _input_cell(result: Mapping[str, Any]) -> str:
    crop = f'{result["crop_pct"]:g}'
    return f'{_size_text(result)}, crop {crop if "." in crop else crop + ".0"}'


def _marker(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The partial-run marker of a suite (the same data for every model), with a leading space, or ''."""
    marks = [r.get('partial') for r in results.values() if r.get('partial')]
    return f' {marks[0]}' if marks else ''


def results_table(report: Mapping[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Rows of metrics, one column per model (T-CNN Table 2 turned sideways): ``(header, rows)``.

    Every row's label says what it holds: the input size and crop each model ran at, then top-1 accuracy in % (higher
    is better) or corruption error CE / mCE in % of AlexNet's (lower is better). Rows indented under a section
    title (its own values empty) are in its unit. Means over a partial ImageNet-C folder carry a ``(k/15
    corruptions)`` marker; the 4 extra corruptions (and any other folder) are in a section of their own, in no mean.

    Args:
        report: ``{'models': {name: ...}, 'suites': {suite: {'results': {name: result}}}}`` (``tcnn eval``'s JSON).
    """
    if not (isinstance(report, Mapping) and isinstance(report.get('models'), Mapping)
            and isinstance(report.get('suites'), Mapping)):
        raise InvalidArgumentError('report must be a tcnn eval report: a dict with "models" and "suites" entries')
    names = list(report['models'])
    header = ['metric'] + names
    rows: List[List[str]] = []

    def add(label: str, results: Mapping[str, Any], getter=None) -> None:
        values = []
        for name in names:
            try:
                values.append('' if getter is None else _fmt(getter(results[name])))
            except (KeyError, TypeError):  # a model without this entry (e.g. no mCE on a partial ImageNet-C)
                values.append('-')
        rows.append([label] + values)

    for suite, block in report['suites'].items():
        res = block['results']
        title = SUITE_TITLES.get(suite, suite)
        mark = _marker(res)
        add(f'{title} input: size, centre-crop fraction', res, _input_cell)
        if suite != 'imagenet-c':
            add(f'{title} top-1 %{mark} (higher is better)', res, lambda r: r['top1'])
            add(f'{title} top-5 %{mark} (higher is better)', res, lambda r: r['top5'])
            continue
        add(f'{title} top-1 %, mean over corruptions x severities{mark} (higher is better)', res, lambda r: r['top1'])
        add(f'{title} mCE %, AlexNet = 100{mark} (lower is better)', res, lambda r: r['mce'])
        categories = [c for c in list(CORRUPTION_CATEGORIES) + ['other']
                      if any(c in res[n].get('categories', {}) for n in names)]
        if categories:
            add(f'{title} top-1 % by category{mark} (higher is better)', res)
            for category in categories:
                add(f'  {category}', res, lambda r, c=category: r['categories'][c])
        sevs = [s for s in SEVERITIES if any(s in res[n].get('severities', {}) for n in names)]
        if sevs:
            add(f'{title} top-1 % by severity, mean over corruptions{mark} (higher is better)', res)
            for s in sevs:
                add(f'  severity {s}', res, lambda r, s=s: r['severities'][s])
        found: List[str] = []
        for n in names:
            found += [c for c in res[n].get('corruptions', {}) if c not in found]
        benchmark = [c for c in BENCHMARK_CORRUPTIONS if c in found]
        if benchmark:
            add(f'{title} CE % by corruption, AlexNet = 100 (lower is better)', res)
            for c in benchmark:
                add(f'  {c}', res, lambda r, c=c: r['corruptions'][c]['ce'])
            add(f'{title} top-1 % by corruption, mean over severities (higher is better)', res)
            for c in benchmark:
                add(f'  {c}', res, lambda r, c=c: r['corruptions'][c]['top1'])
        others = [c for c in found if c not in BENCHMARK_CORRUPTIONS]
        if others:
            what = 'not in any mean' if benchmark else 'the only corruptions found: in the means above'
            add(f'{title} top-1 % of the extra corruptions, {what} (higher is better)', res)
            for c in others:
                kind = 'extra' if c in EXTRA_CORRUPTIONS else 'other'
                add(f'  {c} ({kind})', res, lambda r, c=c: r['corruptions'][c]['top1'])
    return header, rows


def results_notes(report: Mapping[str, Any]) -> List[str]:
    """What a reader of the table must know, one line each: models run at different sizes or crops, partial
    suites and why there is no mCE. ``tcnn eval`` prints them under the table and writes them under the markdown."""
    notes = []
    for suite, block in report['suites'].items():
        res = block['results']
        sizes = {name: _size_text(r) for name, r in res.items()}
        crops = {name: r['crop_pct'] for name, r in res.items()}
        if len(set(sizes.values())) > 1:
            notes.append(f'{suite}: the models ran at different input sizes ('
                         + ', '.join(f'{n} {v}' for n, v in sizes.items())
                         + '): a difference between them is partly one of resolution; give one size to compare them')
        elif len(set(crops.values())) > 1:
            notes.append(f'{suite}: the models ran with different centre crops ('
                         + ', '.join(f'{n} {v:g}' for n, v in crops.items()) + ')')
        first = next(iter(res.values()))
        if suite == 'imagenet-c' and not first.get('complete', True):
            absent = [c for c in BENCHMARK_CORRUPTIONS if c not in first['corruptions']]
            short = [c for c in first.get('mce_missing') or [] if c not in absent]
            why = [f'{len(absent)} of the 15 corruptions missing (e.g. {absent[0]})'] if absent else []
            why += [f'{len(short)} without all 5 severities ({", ".join(short[:3])})'] if short else []
            uneven = {g: v for g, v in first['image_counts']['mismatched'].items()
                      if g.split('/')[0] in BENCHMARK_CORRUPTIONS}
            why += ['image counts differ: ' + ', '.join(f'{g} {v["images"]} images (others {v["expected"]})'
                                                        for g, v in list(uneven.items())[:3])] if uneven else []
            notes.append(f'imagenet-c: no mCE {first["partial"]}: {"; ".join(why)}; the means cover the corruptions '
                         'found')
        elif first.get('partial'):
            notes.append(f'{suite}: {first["partial"][1:-1]}: a subset of the release')
    return notes


def write_results(report: Mapping[str, Any], json_path: Optional[str], markdown_path: Optional[str] = None) -> None:
    """Write the report as JSON and/or its table and notes as markdown, atomically (both paths are checked first)."""
    for path, name, suffixes in ((json_path, 'json_path', ('.json',)), (markdown_path, 'markdown_path', ('.md',))):
        if path:
            check_output_file(path, name, suffixes)
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=2) + '\n')
    if markdown_path:
        header, rows = results_table(report)
        atomic_write_text(markdown_path, format_markdown(header, rows, results_notes(report)))
