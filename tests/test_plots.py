"""tcnn.evaluation.plots: the figures draw what their captions say (T-CNN, arXiv:2106.05795, Figs. 3 and 4).

Each figure is caught on its way to the file (``save_figure``) and read back artist by artist: the points of every
line and bar against values computed here from the records, and the styles the captions and docs/analysis.md name
(thin heads, thick layer means, the span's log axis and its width axis, the gate's 0-1 axis, the late
reparameterisation's marker). ``tests/test_analysis.py`` checks the command and the files.
"""
import math

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from tcnn.evaluation import plots


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plots module saves, in order (each also written to its file), drawn under a matplotlib style
    of other sizes than the defaults: the sizes the figures state are theirs, whatever style the user has."""
    figures = []
    save = plots.save_figure

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)
    monkeypatch.setattr(plots, 'save_figure', keep)
    with matplotlib.rc_context({'font.size': 13.0, 'errorbar.capsize': 5.0, 'lines.linewidth': 1.7,
                                'lines.markersize': 5.5}):
        yield figures


def _record(epoch, **values):
    return {'epoch': epoch, **values}


def _heads(epoch: int, layer: int, heads: int = 4):
    """A layer's per-head gates and spans at an epoch: distinct per head, layer and epoch."""
    gate = [1 / (1 + math.exp(-(2 - 0.4 * epoch * (h + 1) / heads - 0.1 * layer))) for h in range(heads)]
    span = [1 + 0.5 * epoch * (h + 1) + 3 * layer for h in range(heads)]
    return {'gate': gate, 'span': span}


def _lines(ax):
    """(x, y, style) of each line of ``ax``, in drawing order."""
    return [(list(line.get_xdata()), list(line.get_ydata()),
             {'label': line.get_label(), 'ls': line.get_linestyle(), 'marker': line.get_marker(),
              'ms': line.get_markersize(), 'lw': line.get_linewidth(), 'alpha': line.get_alpha(),
              'color': to_rgba(line.get_color())})
            for line in ax.get_lines()]


def _panels(fig):
    """The figure's main panels (secondary axes are children of their panel, not figure axes)."""
    return fig.axes


def test_accuracy_panel_plots_each_finite_accuracy_at_its_one_based_epoch(drawn, tmp_path):
    records = [_record(0, train_top1=10.0, val_top1=12.5, ema_val_top1=float('nan')),
               _record(1, train_top1=20, val_top1=float('inf'), ema_val_top1=11.0),
               _record(2, train_top1=None, val_top1=30.0, ema_val_top1='n/a'),
               _record(3, train_top1=40.0, val_top1=41.0)]
    plots.plot_training_curves(records, str(tmp_path / 'a.png'))
    (fig,) = drawn
    (ax,) = _panels(fig)  # no GPSA layer logged: accuracy only
    assert tuple(fig.get_size_inches()) == pytest.approx((4.6, 3.6))
    lines = _lines(ax)
    assert [(x, y) for x, y, _ in lines] == [([1, 2, 4], [10.0, 20.0, 40.0]), ([1, 3, 4], [12.5, 30.0, 41.0]),
                                            ([2], [11.0])]
    assert all(isinstance(v, float) for _, y, _ in lines for v in y)
    styles = [(s['label'], s['ls'], s['marker'], s['ms']) for _, _, s in lines]
    assert styles == [('train', '--', 'o', 3), ('val', '-', 'o', 3), ('val (EMA)', ':', 'o', 3)]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ('epoch', 'top-1 (%)', 'A: accuracy')
    assert ax.title.get_fontsize() == 10
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ['train', 'val', 'val (EMA)']
    assert legend.get_texts()[0].get_fontsize() == 8
    assert ax.xaxis.get_major_locator()._integer  # epochs are whole numbers
    assert fig._suptitle is None and not ax.texts


def test_long_runs_draw_lines_without_markers_and_empty_series_draw_nothing(drawn, tmp_path):
    plots.plot_training_curves([_record(e, train_top1=float(e)) for e in range(20)], str(tmp_path / 'a.png'))
    plots.plot_training_curves([_record(e, train_top1=float(e)) for e in range(19)], str(tmp_path / 'b.png'))
    plots.plot_training_curves([_record(0, lr=0.1)], str(tmp_path / 'c.png'))
    long, short, empty = (_lines(fig.axes[0]) for fig in drawn)
    assert [s['marker'] for _, _, s in long] == ['None'] and [s['marker'] for _, _, s in short] == ['o']
    assert empty == [] and drawn[2].axes[0].get_legend() is None


def test_head_panels_draw_every_head_thin_and_each_layer_mean_thick(drawn, tmp_path):
    layers = ['layer4.0.conv2', 'layer4.1.conv2']
    records = [_record(e, train_top1=1.0 * e, gpsa={name: _heads(e, k) for k, name in enumerate(layers)})
               for e in range(3)]
    records[1]['gpsa'][layers[1]] = {'gate': [], 'span': []}  # an epoch without the values: skipped
    plots.plot_training_curves(records, str(tmp_path / 'c.png'), title='run 7')
    (fig,) = drawn
    assert tuple(fig.get_size_inches()) == pytest.approx((3 * 4.6, 3.6))
    assert fig._suptitle.get_text() == 'run 7' and fig._suptitle.get_fontsize() == 11
    a, b, c = _panels(fig)
    assert (b.get_title(), c.get_title()) == (r'B: span $1/\alpha_h$ (tokens$^2$)',
                                              r'C: gate $\sigma(\lambda_h)$ (0-1, 1 = positional)')
    for ax, key in ((b, 'span'), (c, 'gate')):
        assert ax.get_xlabel() == 'epoch' and ax.title.get_fontsize() == 10
        lines = _lines(ax)
        expected = []
        for k, name in enumerate(layers):
            epochs = [e for e in range(3) if records[e]['gpsa'][name][key]]
            values = np.array([records[e]['gpsa'][name][key] for e in epochs])
            color = to_rgba(f'C{k}')
            expected += [([e + 1 for e in epochs], list(values[:, h]), (None, 0.6, 0.45, color)) for h in range(4)]
            expected.append(([e + 1 for e in epochs], list(values.mean(axis=1)),
                             (name.replace('.conv', '.c'), 2.4, None, color)))
        assert len(lines) == len(expected)
        for (x, y, style), (ex, ey, (label, lw, alpha, color)) in zip(lines, expected):
            assert x == ex and y == pytest.approx(ey, rel=1e-12)
            assert (style['lw'], style['alpha'], style['color']) == (lw, alpha, color)
            if label is not None:
                assert style['label'] == label
            else:
                assert style['label'].startswith('_')  # heads stay out of the legend
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ['layer4.0.c2', 'layer4.1.c2']
        assert legend.get_texts()[0].get_fontsize() == 7
    assert c.get_yscale() == 'linear' and c.get_ylim() == pytest.approx((-0.03, 1.03))
    assert a.get_lines()[0].get_xdata().tolist() == [1, 2, 3]


def test_span_axis_is_logarithmic_with_the_gaussian_width_on_the_right(drawn, tmp_path):
    records = [_record(e, gpsa={'layer4.0.conv2': {'span': [1.0 + 40 * e, 2.0 + 60 * e], 'gate': [0.5, 0.6]}})
               for e in range(3)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    b = drawn[0].axes[1]
    assert b.get_yscale() == 'log'
    major = b.yaxis.get_major_locator()
    assert isinstance(major, LogLocator) and major._base == 10 and list(major._subs) == [1.0, 2.0, 5.0]
    assert isinstance(b.yaxis.get_major_formatter(), ScalarFormatter)
    assert isinstance(b.yaxis.get_minor_formatter(), NullFormatter)
    lo, hi = b.get_ylim()
    assert lo <= 1.0 and hi >= 122.0 and hi / lo < 1000  # spans that move keep matplotlib's own limits
    (right,) = b.child_axes
    assert right.get_ylabel() == r'width $\sigma = \sqrt{\mathrm{span}/2}$ (tokens)'
    assert right.yaxis.label.get_fontsize() == 8
    # the right axis reads a span as sigma = sqrt(span / 2) (tokens), and back
    span = np.array([0.0, -3.0, 2.0, 8.0, 50.0])
    assert plots._span_to_sigma(span) == pytest.approx([math.sqrt(1e-12 / 2)] * 2 + [1.0, 2.0, 5.0], rel=1e-12)
    assert plots._sigma_to_span(np.array([1.0, 2.0, 5.0])) == pytest.approx([2.0, 8.0, 50.0], rel=1e-12)
    forward, inverse = right._functions
    assert forward(np.array([8.0])) == pytest.approx([2.0]) and inverse(np.array([2.0])) == pytest.approx([8.0])


def _own_log_limits(ax):
    """The y limits matplotlib itself gives the lines of ``ax`` on a log axis (a fresh axes, nothing set)."""
    reference = Figure().subplots()
    for line in ax.get_lines():
        reference.plot(line.get_xdata(), line.get_ydata())
    reference.set_yscale('log')
    return reference.get_ylim()


def test_spans_that_barely_move_are_shown_over_a_factor_of_four(drawn, tmp_path):
    records = [_record(e, gpsa={'l.conv2': {'span': [3.0 + 0.01 * e, 3.1], 'gate': [0.5, 0.5]}}) for e in range(3)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    # matplotlib's own limits of the same lines, centred geometrically and widened to a factor 4
    auto_lo, auto_hi = _own_log_limits(drawn[0].axes[1])
    assert auto_hi / auto_lo < 4
    mid = math.sqrt(auto_lo * auto_hi)
    assert drawn[0].axes[1].get_ylim() == pytest.approx((mid / 2, mid * 2), rel=1e-9)


def test_a_late_reparameterisation_is_marked_on_every_panel(drawn, tmp_path):
    records = [_record(e, train_top1=1.0, **({'gpsa': {'l.conv2': _heads(e, 0)}} if e >= 2 else {}))
               for e in range(5)]
    plots.plot_training_curves(records, str(tmp_path / 'late.png'))
    plots.plot_training_curves(records[2:], str(tmp_path / 'from_start.png'))
    late, from_start = drawn
    for ax in late.axes:
        marks = [line for line in ax.get_lines() if list(line.get_xdata()) == [2.5, 2.5]]
        assert len(marks) == 1, ax.get_title()
        mark = marks[0]
        assert (to_rgba(mark.get_color()), mark.get_linewidth(), mark.get_linestyle()) == (to_rgba('grey'), 0.8, '--')
    (note,) = late.axes[0].texts
    assert note.get_text() == 'reparameterised' and tuple(note.xy) == (2.5, 0.02)
    assert (note.get_fontsize(), note.get_rotation(), note.get_ha(), note.get_va()) == (7, 90, 'right', 'bottom')
    assert to_rgba(note.get_color()) == to_rgba('grey')
    assert note.xycoords == ('data', 'axes fraction')  # at the foot of the panel, whatever its accuracy range
    for ax in from_start.axes:  # GPSA layers from the first epoch: no marker
        assert not [line for line in ax.get_lines() if len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2]
    assert not from_start.axes[0].texts


def _demo_runs():
    corruptions = {'gaussian_noise': [30.0, 34.0, 29.0], 'fog': [50.0, 55.5, 52.0]}
    runs = []
    for arm, shift in (('no-sa', 0.0), ('t-cnn', 5.0)):
        for seed in range(3):
            runs.append({'arm': arm, 'clean_top1': 70.0 + shift + seed * 1.5,
                         'corruptions': {c: {'top1': v[seed] + shift} for c, v in corruptions.items()},
                         'corrupted_by_severity': {'1': 60.0 + seed + shift, '3': 40.0 - seed + shift,
                                                   '2': 50.0 + 2 * seed + shift}})
    return {'runs': runs}


def _errorbar_spans(container):
    """(low, high) of each error bar of an errorbar container."""
    (segments,) = [c for c in container.lines[2] if isinstance(c, LineCollection)]
    return np.array([(seg[0][1], seg[1][1]) for seg in segments.get_segments()])


def test_robustness_figure_bars_are_seed_means_with_the_seed_spread(drawn, tmp_path):
    results = _demo_runs()
    plots.plot_demo_robustness(results, str(tmp_path / 'fig3.png'), titles={'t-cnn': 'T-CNN'})
    (fig,) = drawn
    ax_c, ax_s = fig.axes
    assert tuple(fig.get_size_inches()) == pytest.approx((11, 3.8))
    assert [t.get_text() for t in ax_c.get_xticklabels()] == ['clean', 'gaussian noise', 'fog']
    assert list(ax_c.get_xticks()) == [0, 1, 2]
    assert all((t.get_rotation(), t.get_fontsize(), t.get_ha()) == (25, 8, 'right') for t in ax_c.get_xticklabels())
    bars = [c for c in ax_c.containers if hasattr(c, 'patches')]
    assert [b.get_label() for b in bars] == ['no-sa', 'T-CNN']
    for g, (container, arm) in enumerate(zip(bars, ('no-sa', 't-cnn'))):
        runs = [r for r in results['runs'] if r['arm'] == arm]
        per = np.array([[r['clean_top1']] + [r['corruptions'][c]['top1'] for c in ('gaussian_noise', 'fog')]
                        for r in runs])
        mean, std = per.mean(0), per.std(0, ddof=1)
        heights = [p.get_height() for p in container.patches]
        centres = [p.get_x() + p.get_width() / 2 for p in container.patches]
        assert heights == pytest.approx(mean, rel=1e-12)
        assert centres == pytest.approx(np.arange(3) + (g - 0.5) * 0.4)
        assert [p.get_width() for p in container.patches] == pytest.approx([0.4] * 3)
        assert to_rgba(container.patches[0].get_facecolor()) == to_rgba(f'C{g}')
        assert np.allclose(_errorbar_spans(container.errorbar), np.stack([mean - std, mean + std], 1), rtol=1e-12)
        # caps on the error bars: capsize 2 points, drawn as markers twice as wide
        assert [cap.get_markersize() for cap in container.errorbar.lines[1]] == [4.0, 4.0]
    # the corruption panel is 3 : 1.2 as wide as the severity panel
    FigureCanvasAgg(fig)
    assert ax_c.get_position().width / ax_s.get_position().width == pytest.approx(3 / 1.2, rel=1e-6)
    assert ax_c.get_ylabel() == 'top-1 (%)'
    assert ax_c.get_title() == 'A: accuracy by corruption (mean over severities)' and ax_c.title.get_fontsize() == 10
    legend = ax_c.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ['no-sa', 'T-CNN'] and legend._ncols == 2
    assert legend.get_texts()[0].get_fontsize() == 7
    # B: per severity, in numeric order, mean and spread over seeds
    points = [c for c in ax_s.containers if not hasattr(c, 'patches')]
    assert [p.get_label() for p in points] == ['no-sa', 'T-CNN']
    for g, (container, arm) in enumerate(zip(points, ('no-sa', 't-cnn'))):
        runs = [r for r in results['runs'] if r['arm'] == arm]
        values = np.array([[r['corrupted_by_severity'][s] for s in ('1', '2', '3')] for r in runs])
        line = container.lines[0]
        assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == pytest.approx(values.mean(0))
        assert (line.get_marker(), line.get_markersize(), to_rgba(line.get_color())) == ('o', 3, to_rgba(f'C{g}'))
        mean, std = values.mean(0), values.std(0, ddof=1)
        assert np.allclose(_errorbar_spans(container), np.stack([mean - std, mean + std], 1), rtol=1e-12)
        assert [cap.get_markersize() for cap in container.lines[1]] == [4.0, 4.0]
    assert (ax_s.get_xlabel(), ax_s.get_title()) == ('severity', 'B: by severity')
    assert ax_s.title.get_fontsize() == 10 and ax_s.xaxis.get_major_locator()._integer


def test_robustness_figure_of_one_seed_has_no_error_bars(drawn, tmp_path):
    results = {'runs': [r for r in _demo_runs()['runs'] if r['clean_top1'] in (70.0, 75.0)]}
    plots.plot_demo_robustness(results, str(tmp_path / 'fig3.png'))
    ax_c, ax_s = drawn[0].axes
    bars = [c for c in ax_c.containers if hasattr(c, 'patches')]
    assert [b.get_label() for b in bars] == ['no-sa', 't-cnn']  # arm names without titles
    assert all(b.errorbar is None for b in bars)
    assert all(not c.has_yerr for c in ax_s.containers)


def test_robustness_figure_of_a_single_run_labels_its_corruptions_in_their_order(drawn, tmp_path):
    run = _demo_runs()['runs'][0]
    run['corruptions'] = {'fog': {'top1': 50.0}, 'gaussian_noise': {'top1': 30.0}}
    plots.plot_demo_robustness({'runs': [run]}, str(tmp_path / 'fig3.png'))
    ax_c, _ = drawn[0].axes
    assert [t.get_text() for t in ax_c.get_xticklabels()] == ['clean', 'fog', 'gaussian noise']
    (bars,) = [c for c in ax_c.containers if hasattr(c, 'patches')]
    assert [p.get_height() for p in bars.patches] == [70.0, 50.0, 30.0]


def test_robustness_figure_of_two_seeds_shows_their_spread_with_severities_in_numeric_order(drawn, tmp_path):
    runs = [r for r in _demo_runs()['runs'] if r['clean_top1'] in (70.0, 71.5)]  # no-SA, seeds 0 and 1
    for r in runs:
        r['corrupted_by_severity'] = {'10': r['corrupted_by_severity']['3'], '2': r['corrupted_by_severity']['2']}
    plots.plot_demo_robustness({'runs': runs}, str(tmp_path / 'fig3.png'))
    ax_c, ax_s = drawn[0].axes
    (bars,) = [c for c in ax_c.containers if hasattr(c, 'patches')]
    assert np.allclose(_errorbar_spans(bars.errorbar)[0], [70.75 - 1.5 / math.sqrt(2), 70.75 + 1.5 / math.sqrt(2)])
    (points,) = ax_s.containers
    assert list(points.lines[0].get_xdata()) == [2, 10]
    assert list(points.lines[0].get_ydata()) == [51.0, 39.5] and points.has_yerr


def test_metrics_are_read_from_a_run_folder_and_a_checkpoint_or_an_empty_file_is_refused_naming_the_fix(tmp_path):
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'metrics.jsonl').write_text('{"epoch": 1, "val_top1": 2.0}\n{"epoch": 0, "val_top1": 1.0}\n')
    assert plots.load_metrics(run) == plots.load_metrics(str(run / 'metrics.jsonl')) == [
        {'epoch': 0, 'val_top1': 1.0}, {'epoch': 1, 'val_top1': 2.0}]
    for name in ('last.pt', 'best.pth', 'model.safetensors'):
        (run / name).write_bytes(b'not metrics')
        with pytest.raises(plots.TcnnError) as info:
            plots.load_metrics(str(run / name))
        assert str(info.value) == (f'{run / name} is a model or checkpoint file; tcnn plot takes the run folder that '
                                   f'holds it ({run}) or its metrics.jsonl')
    with pytest.raises(plots.TcnnError) as info:
        plots.load_metrics(str(tmp_path / 'nowhere'))
    assert str(info.value) == f'no metrics file at {tmp_path / "nowhere"} (tcnn train writes RUN_DIR/metrics.jsonl)'
    (run / 'metrics.jsonl').write_text('')
    with pytest.raises(plots.TcnnError) as info:
        plots.load_metrics(str(run))
    assert str(info.value) == f'{run / "metrics.jsonl"} holds no epoch yet'
    with pytest.raises(TypeError) as info:
        plots.load_metrics(3)
    assert str(info.value) == 'path must be a run folder or metrics file path, got int'


def test_the_panels_share_their_epoch_axis_and_a_gap_in_a_heads_values_is_a_gap_in_its_line(drawn, tmp_path):
    records = [_record(e, train_top1=float(e), gpsa={'l.conv2': {'gate': [0.5, None if e == 1 else 0.6],
                                                                 'span': [2, 3 + e]}}) for e in range(3)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    a, b, c = drawn[0].axes
    assert a.get_shared_x_axes().joined(a, b) and a.get_shared_x_axes().joined(a, c)
    second_head = c.get_lines()[1].get_ydata()
    assert second_head[0] == 0.6 and math.isnan(second_head[1])  # a value a strict-JSON writer logged as null
    assert b.get_lines()[2].get_ydata().tolist() == [2.5, 3.0, 3.5]  # integer spans: their float mean
    with pytest.raises(plots.TcnnError) as info:
        plots.plot_training_curves([], str(tmp_path / 'd.png'))
    assert str(info.value) == 'no epochs to plot'


def test_a_reparameterisation_after_the_first_epoch_is_marked_too(drawn, tmp_path):
    records = [_record(e, train_top1=1.0, **({'gpsa': {'l.conv2': _heads(e, 0)}} if e >= 1 else {}))
               for e in range(3)]
    plots.plot_training_curves(records, str(tmp_path / 'late.png'))
    assert list(drawn[0].axes[0].get_lines()[-1].get_xdata()) == [1.5, 1.5]
    assert drawn[0].axes[0].texts[0].xy == (1.5, 0.02)


def test_a_layer_without_head_values_is_skipped_and_the_layers_after_it_are_drawn(drawn, tmp_path):
    records = [_record(e, gpsa={'a.conv2': {'gate': [], 'span': []}, 'b.conv2': _heads(e, 1)}) for e in range(2)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    b = drawn[0].axes[1]
    assert [line.get_label() for line in b.get_lines() if not line.get_label().startswith('_')] == ['b.c2']
    assert to_rgba(b.get_lines()[-1].get_color()) == to_rgba('C1')  # the second layer keeps the second colour


def test_eleven_layers_reuse_the_colour_cycle_from_the_first_colour(drawn, tmp_path):
    layers = [f'layer{k}.conv2' for k in range(11)]
    records = [_record(e, gpsa={name: _heads(e, k) for k, name in enumerate(layers)}) for e in range(2)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    means = [line for line in drawn[0].axes[2].get_lines() if not line.get_label().startswith('_')]
    assert [line.get_color() for line in means] == [f'C{i % 10}' for i in range(11)]


@pytest.mark.parametrize('spread, widened', [(3.3, True), (3.9, False)])
def test_spans_are_widened_to_a_factor_four_exactly_when_their_own_range_is_narrower(drawn, tmp_path, spread,
                                                                                   widened):
    records = [_record(e, gpsa={'l.conv2': {'span': [1.0, 1.0 + (spread - 1.0) * e], 'gate': [0.5, 0.5]}})
               for e in range(2)]
    plots.plot_training_curves(records, str(tmp_path / 'c.png'))
    lo, hi = _own_log_limits(drawn[0].axes[1])
    assert (hi / lo < 4) == widened  # 3.9: matplotlib's own limits span a factor between 4 and 5
    if widened:
        mid = math.sqrt(lo * hi)
        assert drawn[0].axes[1].get_ylim() == pytest.approx((mid / 2, mid * 2), rel=1e-9)
    else:
        assert drawn[0].axes[1].get_ylim() == pytest.approx((lo, hi), rel=1e-9)
