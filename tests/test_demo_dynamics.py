"""``tcnn.demo.dynamics``: the CNN's plateau, the warm-up dip and the GPSA layers' gate and span trajectories (the
paper's Fig. 4 in numbers) from per-epoch metrics, and how the demo's report words them."""
import math

import pytest

from tcnn.demo.dynamics import (CONTENT_GATE, INIT_GATE, PLATEAU_POINTS, layer_trajectories, lr_sum, plateau,
                                summarize_training, warmup_dip)
from tcnn.demo.report import training_verdict


def _rows(values, key='val_top1'):
    return [{'epoch': i, key: v} for i, v in enumerate(values)]


def test_a_curve_still_rising_is_not_at_its_plateau():
    p = plateau(_rows([10, 20, 30, 40, 50, 60, 70, 80, 90, 95]))
    # 10 epochs: windows of 2, the last two (90, 95) against the two before (70, 80)
    assert p['window'] == 2 and p['before_mean'] == 75 and p['last_mean'] == 92.5
    assert p['gain'] == pytest.approx(17.5) and not p['at_plateau']
    assert p['final'] == 95 and p['best'] == 95 and p['epochs'] == 10


def test_a_flat_noisy_curve_is_at_its_plateau():
    values = [20, 50, 70, 80, 85, 88, 89, 90, 89.5, 90.5, 89, 90, 90.5, 89.5, 90, 91, 89.5, 90, 90.5, 89.5]
    p = plateau(_rows(values))
    assert p['window'] == 2
    # the last 2 (90.5, 89.5) against the 2 before (89.5, 90): noise, a rise of a quarter point
    assert p['gain'] == pytest.approx(90 - 89.75)
    assert p['at_plateau'] and p['best'] == 91
    # 50 epochs: windows of 5; a climb that ends before the last tenth is a plateau, one into it is not
    flat = [min(70.0, 20 + 1.5 * i) for i in range(50)]
    assert plateau(_rows(flat))['window'] == 5 and plateau(_rows(flat))['at_plateau']
    assert not plateau(_rows([20 + 1.2 * i for i in range(50)]))['at_plateau']


def test_plateau_is_told_at_its_edge_and_not_for_too_short_runs():
    # exactly PLATEAU_POINTS above counts as the plateau, a hair more does not
    top = 50 + PLATEAU_POINTS
    assert plateau(_rows([0, 0, 50, 50, top, top]))['at_plateau']
    assert not plateau(_rows([0, 0, 50, 50, top + 0.01, top + 0.01]))['at_plateau']
    assert plateau(_rows([1, 2, 3])) is None  # 3 epochs cannot tell
    assert plateau(_rows([1, None, 3, 4, 5])) is not None  # an epoch without the value is left out, 4 remain
    assert plateau(_rows([1, None, 3, 4])) is None


def test_warmup_dip_measures_the_fall_below_the_start_and_the_end():
    d = warmup_dip(_rows([60, 52, 55, 70, 80]), start=75.0, warmup=3)
    assert d['warmup_min'] == 52 and d['dip'] == pytest.approx(23) and d['final'] == 80 and d['recovered']
    # the low after the warm-up is not the warm-up's dip
    d = warmup_dip(_rows([76, 77, 40, 74]), start=75.0, warmup=2)
    assert d['dip'] == 0.0 and d['warmup_min'] == 76 and not d['recovered']
    # a run without warm-up still looks at its first epoch
    assert warmup_dip(_rows([70, 90]), start=75.0, warmup=0)['dip'] == pytest.approx(5)
    assert warmup_dip([], start=75.0, warmup=5) is None


def _gpsa_row(epoch, gates, spans, layer='layer4.0.conv2'):
    return {'epoch': epoch, 'val_top1': 50.0, 'gpsa': {layer: {'gate': gates, 'span': spans}}}


def test_layer_trajectories_read_init_warmup_and_end():
    rows = [_gpsa_row(0, [0.7, 0.7, 0.7], [1.0, 1.0, 1.0]),
            _gpsa_row(1, [0.6, 0.5, 0.4], [1.0, 1.1, 0.9]),
            _gpsa_row(2, [0.9, 0.05, 0.01], [0.5, 2.0, 1.02])]
    t = layer_trajectories(rows, warmup=2)['layer4.0.conv2']
    assert t['heads'] == 3 and t['warmup_epoch'] == 1 and t['final_epoch'] == 2
    assert t['gate']['init'] == pytest.approx(1 / (1 + math.exp(-1))) == INIT_GATE
    assert t['gate']['warmup'] == pytest.approx(0.5) and t['gate']['final'] == pytest.approx(0.32)
    assert t['content_heads'] == 2  # 0.05 and 0.01 are below CONTENT_GATE, 0.9 is not
    assert t['span']['init'] == 1.0 and t['span']['warmup'] == pytest.approx(1.0)
    assert t['span']['final'] == pytest.approx((0.5 + 2.0 + 1.02) / 3)
    assert (t['span']['wider'], t['span']['narrower']) == (1, 1)  # 1.02 is within 5% of 1


def test_a_late_reparameterised_run_reads_its_first_epoch_with_attention():
    rows = [{'epoch': 0, 'val_top1': 40.0}, {'epoch': 1, 'val_top1': 41.0}, {'epoch': 2, 'val_top1': 42.0},
            _gpsa_row(3, [0.6], [1.0]), _gpsa_row(4, [0.2], [1.5])]
    t = layer_trajectories(rows, warmup=2)['layer4.0.conv2']
    assert t['warmup_epoch'] == 3 and t['gate']['warmup'] == pytest.approx(0.6) and t['gate']['final'] == 0.2
    assert layer_trajectories(rows[:3], warmup=2) == {}  # no attention yet: no trajectory


def _demo_like(cnn_values, t_cnn_gates):
    runs = [{'seed': 0, 'arm': 'cnn', 'name': 'seed0-cnn'}, {'seed': 0, 'arm': 'no-sa', 'name': 'seed0-no-sa'},
            {'seed': 0, 'arm': 't-cnn', 'name': 'seed0-t-cnn'}]
    metrics = {'seed0-cnn': _rows(cnn_values),
               'seed0-no-sa': _rows([68, 72, 74]),
               'seed0-t-cnn': [_gpsa_row(0, [0.7] * 2, [1.0] * 2), _gpsa_row(1, [0.5] * 2, [1.0] * 2),
                               _gpsa_row(2, t_cnn_gates, [1.2, 0.8])]}
    metrics['seed0-t-cnn'][0]['val_top1'] = 55.0
    metrics['seed0-t-cnn'][2]['val_top1'] = 80.0
    return summarize_training(runs, metrics, warmup=1)


def test_summarize_training_measures_plateaus_and_dips_and_the_verdict_words_them():
    tr = _demo_like([10, 30, 50, 70, 71, 70, 70.5, 71, 70, 70.5], [0.9, 0.02])
    assert tr['cnns'] == 1 and tr['cnns_at_plateau'] == 1 and tr['cnn']['0']['final'] == 70.5
    assert tr['runs']['seed0-t-cnn']['dip']['dip'] == pytest.approx(15.5)  # 70.5 -> 55 in the warm-up epoch
    assert tr['runs']['seed0-no-sa']['dip']['dip'] == pytest.approx(2.5)
    assert tr['runs']['seed0-no-sa']['layers'] == {}
    assert tr['runs']['seed0-t-cnn']['layers']['layer4.0.conv2']['content_heads'] == 1
    lines = training_verdict({'training': tr})
    text = '\n'.join(lines)
    assert 'all 1 at their plateau' in text
    assert 'T-CNN: during the 1 warm-up epoch(s) val top-1 fell 15.5 points below the CNN' in text
    assert 'ended +9.5 points from it' in text
    assert f'layer4.0.conv2 0.73 -> 0.46 (1.0 of 2 heads below {CONTENT_GATE:g})' in text
    assert 'layer4.0.conv2 1.00 -> 1.00' in text  # spans 1.2 and 0.8: the mean did not move


def test_a_cnn_still_rising_is_said_so():
    tr = _demo_like([10, 20, 30, 40, 50, 60, 70, 80, 90, 95], [0.5, 0.5])
    assert tr['cnns_at_plateau'] == 0
    text = '\n'.join(training_verdict({'training': tr}))
    assert '0 of 1 at their plateau' in text and 'A CNN still rising' in text
    assert '+17.5 points' in text


def test_results_without_a_training_section_have_no_training_words():
    assert training_verdict({}) == []


def test_lr_sum_bounds_the_rate_summed_over_every_update():
    """Per epoch: its updates times the larger of the rate at its start and its end (a warm-up rises within an
    epoch, a cosine falls)."""
    rows = [{'epoch': 0, 'lr': 1e-3, 'train_images': 640}, {'epoch': 1, 'lr': 5e-4, 'train_images': 640},
            {'epoch': 2, 'lr': 1e-4, 'train_images': 600}]
    assert lr_sum(rows, batch_size=64) == pytest.approx(10 * 1e-3 + 10 * 1e-3 + 9 * 5e-4)
    assert lr_sum(rows, batch_size=64, key='gating_lr') is None  # not recorded
    assert lr_sum([], batch_size=64) is None
