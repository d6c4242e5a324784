"""tcnn.train.report: what a run prints about itself, word for word (its set-up before the first epoch, the
warnings that save a small run's first try, one line per epoch). A user reads these lines to tell whether the run is
the one they meant: a wrong number or a lost warning is a silently different run."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from tcnn.train import report
from tcnn.train.distributed import DistContext
from tcnn.train.engine import DATA_BOUND_FRACTION
from tcnn.train.recipe import Recipe


def _run(recipe: Recipe, **changes) -> SimpleNamespace:
    """A set-up trainer as ``setup_lines`` reads it: 1,234,335 parameters, 2 processes, 1000/200 images."""
    model = nn.Sequential(nn.Linear(1110, 1111), nn.Linear(1, 7))  # 1110 x 1111 + 1111 + 7 + 7 parameters
    ctx = DistContext(rank=0, world_size=2, local_rank=0, local_world_size=2, device=torch.device('cpu'),
                      distributed=True, backend='gloo')
    run = dict(model=model, recipe=recipe, ctx=ctx, late=False, device=torch.device('cpu'), amp_dtype=None,
               train_set=list(range(1000)), val_set=list(range(200)), workers=3, pipeline_reason='chosen by auto',
               global_batch=64, updates_per_epoch=15,
               lrs={'lr': 6.25e-6, 'gating_lr': 0.00625, 'warmup_lr': 6.25e-8, 'min_lr': 6.25e-8, 'factor': 0.0625},
               compile_mode=None, best_metric='val_top1', output='runs/x')
    run.update(changes)
    return SimpleNamespace(**run)


def test_the_set_up_lines_name_the_model_data_batch_layout_and_learning_rates():
    recipe = Recipe(model='resnet18d', num_classes=7, data='/data/x', img_size=96, batch_size=16, accum_steps=2,
                    warmup_epochs=3, data_pipeline='resident')
    assert sum(p.numel() for p in _run(recipe).model.parameters()) == 1234335
    assert report.setup_lines(_run(recipe)) == [
        'model resnet18d (T-CNN), 1.23M params, 7 classes, device cpu, 2 process(es) (gloo process group), amp none',
        'data /data/x: 1000 train / 200 val images, 96 px, data pipeline resident (chosen by auto), 3 loader '
        'workers per process; global batch 64 = 16 x 2 process(es) x 2 accum, 15 updates/epoch',
        'lr 6.25e-06 (recipe value x 0.0625 = global batch 64 / 1024), gating lr 0.00625 (recipe value x 0.0625 = '
        'global batch 64 / 1024); 3 warm-up epochs from 6.25e-08, cosine decay to 6.25e-08',
        'output runs/x']


def test_the_set_up_lines_say_late_reparameterisation_amp_determinism_compilation_and_the_ema_best_rule():
    recipe = Recipe(model='resnet18d', num_classes=7, data='/data/x', reparam_epoch=4, deterministic=True,
                    scale_lr=False)
    lines = report.setup_lines(_run(recipe, late=True, amp_dtype=torch.bfloat16, compile_mode='max-autotune',
                                    best_metric='ema_val_top1', val_set=[],
                                    ctx=DistContext(0, 1, 0, 1, torch.device('cpu'), False)))
    assert lines[0] == ('model resnet18d (T-CNN, reparameterised after 4 CNN epochs), 1.23M params, 7 classes, '
                        'device cpu, 1 process(es), amp torch.bfloat16, deterministic')
    # a split of unknown size (a stream's stated 0)
    assert lines[1].startswith('data /data/x: 1000 train / unknown val images, 224 px')
    assert '1 process(es) x 1 accum' in lines[1]
    assert lines[2].startswith('lr 6.25e-06 (recipe value, scale_lr off), gating lr 0.00625 (recipe value, '
                               'scale_lr off); 5 warm-up epochs')
    assert lines[3:] == [
        'torch.compile mode max-autotune: the first epoch compiles the training step and the validation forward',
        'best.pt: the epoch with the best EMA validation top-1 (ema_val_top1); it holds the model and its EMA: read '
        'the EMA with tcnn.load(PATH, ema=True) or tcnn eval/inspect --use-ema',
        'output runs/x']
    baseline = report.setup_lines(_run(Recipe(model='resnet18d', no_sa=True, num_classes=7)))
    assert baseline[0].startswith('model resnet18d (no-SA baseline), ')


def test_a_learning_rate_given_by_the_user_is_as_given():
    recipe = Recipe(absolute_lrs=('lr',))
    lrs = {'factor': 0.5}
    assert report.lr_rule(recipe, lrs, 512, 'lr') == 'as given'
    assert report.lr_rule(recipe, lrs, 512, 'gating_lr') == 'recipe value x 0.5 = global batch 512 / 1024'
    assert report.lr_rule(dataclasses.replace(recipe, scale_lr=False), lrs, 512, 'gating_lr') == \
        'recipe value, scale_lr off'


@pytest.mark.parametrize('factor, warned', [(1 / 16, False), (1 / 16 - 1e-9, True)])
def test_a_small_batch_that_shrinks_every_learning_rate_past_a_sixteenth_is_warned_of(factor, warned):
    lrs = {'lr': 1e-4 * factor, 'gating_lr': 0.1 * factor, 'factor': factor}
    out = report.small_run_warnings(Recipe(), lrs, 63)
    if not warned:
        assert out == []
        return
    assert out == [f'the batch rule scales every learning rate by 63/1024 = {factor:.3g} (lr {1e-4 * factor:.2g}, '
                   f'gating lr {0.1 * factor:.2g}): a small run may barely move; consider --set scale_lr=false or a '
                   'larger --lr']
    assert report.small_run_warnings(Recipe(scale_lr=False), lrs, 63) == []
    assert report.small_run_warnings(Recipe(absolute_lrs=('lr', 'gating_lr')), lrs, 63) == []


def test_a_gating_lr_that_lost_its_ratio_to_the_lr_is_warned_of():
    # --lr given (as given), gating lr scaled by the batch rule: the ratio 1000 becomes 1000 x 0.25
    out = report.small_run_warnings(Recipe(absolute_lrs=('lr',)), {'lr': 1e-4, 'gating_lr': 0.025, 'factor': 0.25},
                                    256)
    assert out == ["gating lr / lr = 250, not the recipe's 1000: --lr is used as given while the batch rule scales "
                   'gating_lr; give --gating-lr too to choose both']
    out = report.small_run_warnings(Recipe(absolute_lrs=('gating_lr',)), {'lr': 4e-4, 'gating_lr': 0.1,
                                                                           'factor': 4.0}, 4096)
    assert out == ["gating lr / lr = 250, not the recipe's 1000: --gating-lr is used as given while the batch rule "
                   'scales lr; give --lr too to choose both']
    # the batch rule leaves both alone (factor 1), or scale_lr is off: the ratio stands
    assert report.small_run_warnings(Recipe(absolute_lrs=('lr',)), {'lr': 1e-4, 'gating_lr': 0.1, 'factor': 1},
                                     1024) == []
    assert report.small_run_warnings(Recipe(absolute_lrs=('lr',), scale_lr=False),
                                     {'lr': 1e-4, 'gating_lr': 0.025, 'factor': 0.25}, 256) == []


def _row(**changes):
    row = {'epoch': 2, 'train_loss': 1.23456, 'val_loss': 0.98765, 'val_top1': 71.234, 'val_top5': 90.5, 'lr': 1.5e-4,
           'gating_lr': 0.15, 'img_per_s': 123.45, 'step_img_per_s': 150.04, 'data_wait': 0.05, 'epoch_time_s': 12.34,
           'gpsa': {'a': {'gate_mean': 0.9, 'span_mean': 1.5}, 'b': {'gate_mean': 0.7, 'span_mean': 2.5}}}
    row.update(changes)
    return row


def test_each_epoch_is_one_line_with_its_losses_accuracy_speed_and_the_layers_mean_gate_and_span():
    assert report.epoch_summary(_row(), 10) == (
        'epoch 3/10: train loss 1.2346, val loss 0.9877, top-1 71.23%, top-5 90.50%, lr 0.00015, gating lr 0.15, '
        '123.5 img/s (step alone 150.0, waiting for data 5% of the time), 12.3 s, gate 0.800, span 1/alpha 2.000 '
        'tokens^2')
    # no GPSA layer (the no-SA baseline), rates not measured, no wait measured
    assert report.epoch_summary(_row(gpsa={}, lr=None, gating_lr=None, img_per_s=None, step_img_per_s=None,
                                     data_wait=None), 10) == (
        'epoch 3/10: train loss 1.2346, val loss 0.9877, top-1 71.23%, top-5 90.50%, lr n/a, gating lr n/a, n/a '
        'img/s (step alone n/a, waiting for data 0% of the time), 12.3 s')


def test_an_epoch_line_adds_the_ema_the_best_checkpoint_and_a_data_bound_warning():
    line = report.epoch_summary(_row(gpsa={}, ema_val_loss=0.5, ema_val_top1=72.0, is_best=True,
                                     best_metric='ema_val_top1', data_wait=DATA_BOUND_FRACTION), 10)
    assert line.endswith('waiting for data 10% of the time), 12.3 s; EMA val loss 0.5000, top-1 72.00%; best '
                         'ema_val_top1 so far: best.pt; data-bound: raise --workers, try --data-pipeline device or '
                         'resident, or lighten the augmentation')
    assert DATA_BOUND_FRACTION == 0.1
    below = report.epoch_summary(_row(gpsa={}, data_wait=DATA_BOUND_FRACTION - 1e-9, ema_val_top1=None,
                                      is_best=False), 10)
    assert below.endswith('waiting for data 10% of the time), 12.3 s')


def test_the_progress_bar_shows_the_mean_loss_lr_and_the_jobs_throughput_and_data_wait():
    from tcnn.train.engine import EpochPosition, _bar_postfix
    position = EpochPosition(updates=4, loss_sum=8.2, images=100, compute_time_s=3.0, data_time_s=1.0)
    # 2 processes: 200 images in 4 s of loop, a quarter of it waiting for data
    assert _bar_postfix(position, 1.5e-4, 2) == {'loss': '2.0500', 'lr': '0.00015', 'img_s': '50.0', 'data': '25%'}
    assert _bar_postfix(EpochPosition(), 0.1, 1) == {'loss': '0.0000', 'lr': '0.1', 'img_s': '0.0', 'data': '0%'}
    # one update: its own loss; three quarters of the loop waiting: 75%
    assert _bar_postfix(EpochPosition(updates=1, loss_sum=0.5, images=10, compute_time_s=1.0, data_time_s=3.0), 2e-3,
                        1) == {'loss': '0.5000', 'lr': '0.002', 'img_s': '2.5', 'data': '75%'}


def test_each_logged_update_reports_its_own_numbers_and_the_jobs_throughput_since_the_last_report(monkeypatch):
    import torch
    from tcnn.train import engine
    seen = []
    plan = SimpleNamespace(on_update=seen.append, log_every=2)
    position = engine.EpochPosition(images=10, compute_time_s=1.0, data_time_s=1.0)
    reporter = engine._UpdateReporter(plan, position)
    assert [reporter.wants(n) for n in (1, 2, 3, 4)] == [False, True, False, True]
    monkeypatch.setattr(engine, 'world_size', lambda: 2)
    position = engine.EpochPosition(images=30, compute_time_s=4.0, data_time_s=2.0)  # 20 images in 3 + 1 s
    reporter.report(2, 0.5, {'lr': 1e-4, 'gating_lr': 0.1}, torch.tensor(3.0), position)
    position = engine.EpochPosition(images=40, compute_time_s=5.0, data_time_s=2.0)  # 10 more in 1 s, no wait
    reporter.report(4, 0.25, {'lr': 2e-4, 'gating_lr': None}, None, position)
    assert seen == [
        {'step': 2, 'loss': 0.5, 'lr': 1e-4, 'gating_lr': 0.1, 'grad_norm': 3.0, 'img_per_s': 10.0, 'data_wait': 0.25},
        {'step': 4, 'loss': 0.25, 'lr': 2e-4, 'gating_lr': None, 'grad_norm': None, 'img_per_s': 20.0,
         'data_wait': 0.0}]
    assert not engine._UpdateReporter(SimpleNamespace(on_update=None, log_every=2), position).wants(2)
    assert not engine._UpdateReporter(SimpleNamespace(on_update=seen.append, log_every=0), position).wants(2)


def test_the_gradient_norm_is_the_float32_norm_of_every_gradient_together():
    import torch
    from tcnn.train.engine import grad_norm
    a, b, c = (torch.zeros(3, requires_grad=True), torch.zeros(1000, dtype=torch.bfloat16, requires_grad=True),
               torch.zeros(1, requires_grad=True))
    a.grad = torch.tensor([3.0, 0.0, 4.0])
    b.grad = torch.ones(1000, dtype=torch.bfloat16)  # its norm, sqrt(1000), is 31.625 in bfloat16
    norm = grad_norm([a, b, c])  # c has no gradient
    assert norm.dtype == torch.float32 and norm.item() == pytest.approx((25 + 1000) ** 0.5, rel=1e-6)
    empty = grad_norm([c])
    assert empty.shape == () and empty.item() == 0.0
