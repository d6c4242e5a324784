"""Tests of ``tcnn train`` (issue 4): recipes, parameter groups and schedule, training, checkpoints, resume,
torchrun, the no-SA baseline, late reparameterisation and bad input. No network: random-init resnet18d on a
generated 3-class ImageFolder of 64 px shapes. On the CPU, or with ``TCNN_TEST_DEVICE=cuda`` the one-process runs on
the GPU (``tests/devices.py``)."""
import glob
import json
import math
import os
import socket
import subprocess
import sys

import pytest
import timm
import torch
import yaml
from torch.utils.data import DataLoader

import tcnn
from tcnn.train import launch
import tcnn.train.trainer as trainer
from tcnn.train.engine import validate
from tcnn.errors import TcnnError
from tcnn.files.tcnn_file import model_from_dict
from tcnn.files.run_folder import read_checkpoint
from tcnn.train.builders import create_model
from tcnn.train.data import build_transforms, open_training_data, recipe_data_config
from tcnn.train.optim import create_optimizer, create_scheduler, group_lrs, param_groups
from tcnn.train.recipe import RECIPE_KEYS, Recipe, bundled_recipes, load_recipe, parse_set, resolve_recipe, scaled_lrs

from devices import device_args
from imagegen import make_image_folder
from nontrivial import nontrivial

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, 'recipes')
TRAIN_IMAGES, VAL_IMAGES = 24, 12  # 3 classes x 8 / x 4
METRIC_KEYS = {'epoch', 'lr', 'gating_lr', 'train_loss', 'train_top1', 'val_loss', 'val_top1', 'val_top5',
               'img_per_s', 'epoch_time_s', 'gpsa'}
CHECKPOINT_KEYS = {'model_file', 'ema', 'optimizer', 'scheduler', 'scaler', 'epoch', 'rng', 'config', 'best_top1'}

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)


def common(data_dir, output, epochs=2, processes=1, device=None):
    # lr 1e-3 without batch scaling so that a few updates change the weights visibly; gating lr stays 1000x.
    # The device is explicit, not the default auto: on a GPU machine auto picks cuda, where two torchrun processes on
    # one GPU ask for cuda:1 and cuDNN's autotuned kernels make a resumed run differ from an uninterrupted one in the
    # last bits (tests/devices.py: the CPU, or the GPU with --deterministic for one process). ``device``: this one
    # instead, as the run's default (autotuned) path.
    return ['--data', data_dir, '--output', str(output), '--model', 'resnet18d', '--no-pretrained',
            '--epochs', str(epochs), '--batch-size', '4', '--img-size', '64', '--workers', '0', '--no-progress',
            '--lr', '1e-3', '--gating-lr', '1.0', '--set', f'warmup_epochs={min(epochs - 1, 1)}',
            '--set', 'scale_lr=false', *(device_args(processes) if device is None else ['--device', device])]


def metrics(output):
    with open(os.path.join(output, 'metrics.jsonl')) as f:
        return [json.loads(line) for line in f]


def load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


class _InterruptingLoader:
    """Yields ``after`` batches of a loader, then raises KeyboardInterrupt (a Ctrl-C in the middle of an epoch)."""

    def __init__(self, loader, after):
        self.loader, self.after = loader, after

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == self.after:
                raise KeyboardInterrupt
            yield batch


def interrupt_in_epoch(monkeypatch, epoch, after=2):
    original = trainer.train_one_epoch

    def patched(model, loader, *args, **kwargs):
        if kwargs['plan'].epoch == epoch:
            loader = _InterruptingLoader(loader, after)
        return original(model, loader, *args, **kwargs)

    monkeypatch.setattr(trainer, 'train_one_epoch', patched)


def assert_same_weights(ckpt_a, ckpt_b):
    sd_a, sd_b = ckpt_a['model_file']['state_dict'], ckpt_b['model_file']['state_dict']
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k


def same_numbers(rows_a, rows_b, keys=('train_loss', 'val_loss', 'val_top1', 'lr', 'gating_lr')):
    return [[r[k] for k in keys] for r in rows_a] == [[r[k] for k in keys] for r in rows_b]


# ------------------------------------------------------------------------------------------------ recipes

PAPER = {  # recipe: (timm model, fine-tuning resolution, stochastic depth); Tables 1 and 5 of T-CNN (arXiv:2106.05795)
    't_resnet50_rs': ('resnetrs50', 224, 0.1), 't_resnet101_rs': ('resnetrs101', 224, 0.1),
    't_resnet152_rs': ('resnetrs152', 320, 0.2), 't_resnet200_rs': ('resnetrs200', 320, 0.2),
    't_resnet270_rs': ('resnetrs270', 320, 0.2), 't_resnet350_rs': ('resnetrs350', 320, 0.2),
    't_resnet50_d': ('resnet50d', 320, 0.1), 't_resnet101_d': ('resnet101d', 384, 0.1),
    't_resnet152_d': ('resnet152d', 384, 0.2), 't_resnet200_d': ('resnet200d', 384, 0.2),
}


@pytest.mark.parametrize('name', sorted(PAPER))
def test_paper_recipes_hold_the_papers_settings(name):
    recipe = resolve_recipe(os.path.join(RECIPES, f'{name}.yaml'))
    model, size, dpr = PAPER[name]
    assert timm.is_model(recipe.model) and recipe.model == model
    assert (recipe.img_size, recipe.drop_path_rate) == (size, dpr)
    shared = {'epochs': 50, 'opt': 'adamw', 'lr': 1e-4, 'gating_lr': 0.1, 'lr_base_batch': 1024, 'scale_lr': True,
              'warmup_epochs': 5, 'sched': 'cosine', 'aa': 'rand-m9-mstd0.5-inc1', 'mixup': 0.8, 'cutmix': 1.0,
              'reprob': 0.25, 'smoothing': 0.1, 'locality_strength': 1.0, 'gating_init': 1.0, 'no_sa': False}
    assert {k: getattr(recipe, k) for k in shared} == shared
    assert isinstance(recipe.lr, float)  # '1.0e-4' in YAML, checked as a float


def test_every_recipe_file_is_listed():
    files = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(RECIPES, '*.yaml'))}
    assert files == set(PAPER) | {'base'}


def test_bundled_recipes_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # e.g. after `pip install`, far from the repository's recipes/
    assert bundled_recipes() == sorted(PAPER)
    assert load_recipe('t_resnet152_d')['model'] == 'resnet152d'
    assert resolve_recipe('t_resnet50_rs.yaml').img_size == 224
    with pytest.raises(TcnnError, match=r"'t_resnet51_rs' is neither a file nor a bundled recipe.*t_resnet50_rs"):
        load_recipe('t_resnet51_rs')


def test_flags_and_set_items_override_a_recipe_and_its_base(tmp_path):
    path = tmp_path / 'r.yaml'
    path.write_text(f'base: {os.path.join(RECIPES, "t_resnet50_rs.yaml")}\nlr: 2e-4\nepochs: 7\n')
    recipe = load_recipe(str(path))
    assert recipe['lr'] == 2e-4 and recipe['model'] == 'resnetrs50' and recipe['epochs'] == 7  # PyYAML: '2e-4' str
    resolved = resolve_recipe(str(path), {'lr': 3e-4, 'epochs': 9}, ['lr=5e-4', 'stages=[3, 4]', 'qk_dim=null'])
    assert resolved.lr == 5e-4 and resolved.epochs == 9 and resolved.stages == (3, 4)
    assert resolved.gating_lr == 0.1 and resolved.qk_dim is None
    assert list(Recipe().to_dict()) == list(RECIPE_KEYS)


@pytest.mark.parametrize('text, message', [
    ('lr_warmup: 3\n', "unknown recipe key 'lr_warmup'"),
    ('warmpu_epochs: 3\n', 'did you mean warmup_epochs'),
    ('epochs: many\n', "'epochs'"),
    ('amp: fp8\n', 'must be one of'),
    ('- a list\n', 'must be a mapping'),
    ('reparam_epoch: 60\n', 'must be smaller than epochs'),
    ('epochs: 5\n', 'warmup_epochs 5 must be smaller than epochs 5'),
    ('no_sa: true\nreparam_epoch: 2\n', 'exclude each other'),
    ('batch_size: 3\n', 'even batch_size'),
])
def test_bad_recipe_files_are_refused_naming_the_problem(tmp_path, text, message):
    path = tmp_path / 'bad.yaml'
    path.write_text(text)
    with pytest.raises(TcnnError, match=message):
        resolve_recipe(str(path))


@pytest.mark.parametrize('item, message', [
    ('lrr=1', "unknown recipe key 'lrr'"), ('epochs', 'KEY=VALUE'), ('epochs=1.5', "'epochs'"),
    ('pretrained=maybe', "'pretrained'"),
])
def test_bad_set_items_are_refused(item, message):
    with pytest.raises(TcnnError, match=message):
        parse_set([item])


def test_explicit_learning_rates_are_absolute():
    """As in timm, the batch rule scales a recipe's learning rates, never one the user typed (issue 25)."""
    recipe = resolve_recipe('t_resnet50_d', {'lr': 1e-3}, [])
    assert recipe.absolute_lrs == ('lr',)
    lrs = scaled_lrs(recipe, global_batch=64)
    assert lrs['lr'] == 1e-3 and math.isclose(lrs['gating_lr'], 0.1 * 64 / 1024)  # not 6.25e-5
    assert math.isclose(lrs['warmup_lr'], 1e-6 * 64 / 1024)
    recipe = resolve_recipe(None, {}, ['gating_lr=0.5', 'min_lr=0'])
    assert recipe.absolute_lrs == ('gating_lr', 'min_lr')
    lrs = scaled_lrs(recipe, global_batch=256)
    assert math.isclose(lrs['lr'], 2.5e-5) and lrs['gating_lr'] == 0.5 and lrs['min_lr'] == 0
    path = resolve_recipe('t_resnet50_d')  # a recipe's own values are scaled
    assert path.absolute_lrs == () and math.isclose(scaled_lrs(path, 256)['lr'], 2.5e-5)
    with pytest.raises(TcnnError, match="absolute_lrs"):
        resolve_recipe(None, {}, ['absolute_lrs=[momentum]'])


def test_explicit_lr_in_a_run_and_on_resume(data_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    args = ['--data', data_dir, '--output', str(run), '--model', 'resnet18d', '--no-pretrained', '--epochs', '1',
            '--batch-size', '4', '--img-size', '64', '--workers', '0', '--no-progress', '--device', 'cpu',
            '--lr', '1e-3', '--set', 'warmup_epochs=0']
    assert launch.main(args) == 0
    out = capsys.readouterr().out
    assert 'lr 0.001 (as given), gating lr 0.000391 (recipe value x 0.003906 = global batch 4 / 1024)' in out
    assert 'warning: gating lr / lr = 0.39' in out and '--gating-lr' in out  # the paper's 1000:1 ratio is gone
    last = load(run / 'last.pt')
    assert last['config']['absolute_lrs'] == ['lr'] and last['scheduler']['base_values'][0] == 1e-3
    assert launch.main(['--resume', str(run), '--epochs', '2', '--no-progress']) == 0
    last = load(run / 'last.pt')
    assert last['config']['absolute_lrs'] == ['lr'] and last['scheduler']['base_values'][0] == 1e-3
    assert 'lr 0.001 (as given)' in capsys.readouterr().out


def test_print_config_prints_the_resolved_recipe(capsys):
    rc = launch.main(['--recipe', os.path.join(RECIPES, 't_resnet152_d.yaml'), '--lr', '2e-4', '--set',
                          'mixup=0', '--print-config'])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert rc == 0
    assert printed['model'] == 'resnet152d' and printed['img_size'] == 384 and printed['mixup'] == 0
    assert float(printed['lr']) == 2e-4 and printed['output'] == os.path.join('runs', 't_resnet152_d')


# ------------------------------------------------------------------------------------------------ optimiser

def test_param_groups_keep_the_gating_lr_ratio_when_scaled():
    model = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=3), verify=False)
    recipe = Recipe(epochs=4, warmup_epochs=2)
    lrs = scaled_lrs(recipe, global_batch=256)
    assert lrs['factor'] == 0.25 and math.isclose(lrs['lr'], 2.5e-5) and math.isclose(lrs['gating_lr'], 0.025)

    optimizer = create_optimizer(model, recipe, lrs['lr'], lrs['gating_lr'])
    groups = {g['group_name']: g for g in optimizer.param_groups}
    names = {id(p): n for n, p in model.named_parameters()}
    members = {k: {names[id(p)] for p in g['params']} for k, g in groups.items()}
    assert members['gating'] == {n for n in names.values() if n.endswith('.gating')} and len(members['gating']) == 4
    assert all(n.endswith(('pos_centers', 'pos_locality')) or model.get_parameter(n).ndim <= 1
               for n in members['no_decay'])
    assert {n for n in names.values() if 'pos_' in n} <= members['no_decay']
    assert 'layer4.0.conv1.q_weight' in members['decay'] and 'fc.weight' in members['decay']
    assert (groups['decay']['weight_decay'], groups['no_decay']['weight_decay'], groups['gating']['weight_decay']) \
        == (0.05, 0.0, 0.0)
    assert sum(len(m) for m in members.values()) == len(names)

    updates_per_epoch = 5
    scheduler = create_scheduler(optimizer, recipe, updates_per_epoch, lrs['warmup_lr'], lrs['min_lr'])
    trace = []
    for step in range(recipe.epochs * updates_per_epoch + 1):
        scheduler.step_update(step)
        t = group_lrs(optimizer)
        trace.append(t)
        # the warm-up and the decay move both learning rates together: 1000x at every update
        assert math.isclose(t['gating_lr'] / t['lr'], 1000.0, rel_tol=1e-9)
        assert all(math.isclose(g['lr'], t['lr']) for g in optimizer.param_groups if g['group_name'] != 'gating')
    base = [t['lr'] for t in trace]
    peak = recipe.warmup_epochs * updates_per_epoch
    assert math.isclose(base[0], lrs['warmup_lr']) and math.isclose(base[peak], lrs['lr'])
    assert all(a < b for a, b in zip(base[:peak], base[1:peak + 1]))  # warm-up rises
    assert all(a > b for a, b in zip(base[peak:-1], base[peak + 1:]))  # cosine decays
    assert math.isclose(base[-1], lrs['min_lr'])


def test_param_groups_of_plain_cnn_have_no_gating():
    model = timm.create_model('resnet18d', num_classes=3)
    groups = param_groups(model, 1e-4, 0.05)
    assert [g['group_name'] for g in groups] == ['decay', 'no_decay']


# ------------------------------------------------------------------------------------------------ training runs

def test_train_interrupt_and_exact_resume(data_dir, tmp_path, monkeypatch, capsys):
    """Two epochs write metrics and checkpoints; Ctrl-C in the third keeps them; --resume finishes the third epoch
    exactly as an uninterrupted run does."""
    straight, run = tmp_path / 'straight', tmp_path / 'run'
    assert launch.main(common(data_dir, straight, epochs=3)) == 0

    interrupt_in_epoch(monkeypatch, epoch=2)
    assert launch.main(common(data_dir, run, epochs=3)) == 130
    assert 'continue with --resume' in capsys.readouterr().err
    rows = metrics(run)
    assert [r['epoch'] for r in rows] == [0, 1]
    for row in rows:
        assert METRIC_KEYS <= row.keys()
        assert math.isclose(row['gating_lr'] / row['lr'], 1000.0, rel_tol=1e-9)
        assert row['train_images'] == TRAIN_IMAGES and row['val_images'] == VAL_IMAGES
        assert sorted(row['gpsa']) == ['layer4.0.conv1', 'layer4.0.conv2', 'layer4.1.conv1', 'layer4.1.conv2']
        layer = row['gpsa']['layer4.0.conv2']
        assert len(layer['gate']) == len(layer['span']) == len(layer['center']) == 9
        assert math.isclose(layer['gate_mean'], sum(layer['gate']) / 9, rel_tol=1e-6)
    assert rows[0]['lr'] > rows[1]['lr']  # past the 1-epoch warm-up, cosine decay
    last, best = load(run / 'last.pt'), load(run / 'best.pt')
    assert CHECKPOINT_KEYS <= last.keys() and last['epoch'] == 1 and last['converted'] is True
    assert best['epoch'] in (0, 1) and best['best_top1'] == max(r['val_top1'] for r in rows)
    assert isinstance(last['rng'][0]['python'][1], list) and last['ema'] is None
    with open(run / 'config.yaml') as f:
        config = yaml.safe_load(f)
    assert config['epochs'] == 3 and config['num_classes'] == 3 and config['model'] == 'resnet18d'
    assert not [p for p in os.listdir(run) if 'tmp' in p]
    model = tcnn.load(str(run / 'last.pt'))  # the model file inside a checkpoint (tcnn.files.tcnn_file)
    assert len(tcnn.gpsa_layers(model)) == 4

    monkeypatch.undo()
    assert launch.main(['--resume', str(run / 'last.pt'), '--no-progress']) == 0
    assert 'resuming after epoch 2/3' in capsys.readouterr().out
    rows = metrics(run)
    assert [r['epoch'] for r in rows] == [0, 1, 2]
    assert same_numbers(rows, metrics(straight))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))

    # a finished run has nothing left to do; another fresh run into the same folder is refused
    assert launch.main(['--resume', str(run / 'last.pt'), '--no-progress']) == 0
    assert len(metrics(run)) == 3
    assert launch.main(common(data_dir, run)) == 2
    assert 'already holds a run' in capsys.readouterr().err


def test_resume_to_a_third_epoch_with_more_epochs(data_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    assert launch.main(common(data_dir, run, epochs=2)) == 0
    assert launch.main(['--resume', str(run / 'last.pt'), '--model', 'resnet26d']) == 2
    assert 'cannot change model when resuming' in capsys.readouterr().err
    resume = ['--resume', str(run / 'last.pt'), '--epochs', '3', '--gating-lr', '2.0', '--no-progress']
    assert launch.main(resume) == 0
    rows = metrics(run)
    assert [r['epoch'] for r in rows] == [0, 1, 2]
    assert [round(r['gating_lr'] / r['lr']) for r in rows] == [1000, 1000, 2000]  # overrides apply on resume
    last = load(run / 'last.pt')
    assert last['epoch'] == 2 and last['num_updates'] == 3 * TRAIN_IMAGES // 4 and last['config']['epochs'] == 3


def test_the_no_sa_baseline_trains_with_accumulation(data_dir, tmp_path):
    run = tmp_path / 'nosa'
    args = common(data_dir, run, epochs=1) + ['--no-sa', '--batch-size', '2', '--accum-steps', '2']
    assert launch.main(args) == 0
    (row,) = metrics(run)
    assert row['gpsa'] == {} and row['gating_lr'] is None and row['train_images'] == TRAIN_IMAGES
    last = load(run / 'last.pt')
    assert last['model_file']['conversion'] is None and last['converted'] is False
    assert last['num_updates'] == TRAIN_IMAGES // 4 and last['global_batch'] == 4
    assert [g['group_name'] for g in last['optimizer']['param_groups']] == ['decay', 'no_decay']
    assert not tcnn.gpsa_layers(tcnn.load(str(run / 'last.pt')))


def test_the_emas_gpsa_layers_start_from_the_models_init_and_keep_the_filters_of_its_own_convs():
    """Late reparameterisation with an EMA: ``copy_gpsa_init`` gives the EMA's GPSA layers the model's content and
    positional initialisation (rank 0's, which DDP gives every process), while each filter stays the one converted
    from the EMA's own averaged conv; nothing else of the EMA changes."""
    from tcnn.layers.gpsa import GPSA
    from tcnn.train.builders import copy_gpsa_init
    torch.manual_seed(0)
    model = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=3), verify=False)
    torch.manual_seed(1)  # other conv weights and another GPSA init
    ema = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=3), verify=False)
    before = {n: p.clone() for n, p in ema.named_parameters()}
    copy_gpsa_init(model, ema)
    models = dict(model.named_parameters())
    gpsa = {f'{name}.{pname}': pname for name, layer in tcnn.gpsa_layers(ema) for pname, _ in layer.named_parameters()}
    assert 'proj_weight' in gpsa.values()  # the filter (these convs have no bias)
    init = [n for n, p in gpsa.items() if p not in GPSA.filter_params]
    assert any(not torch.equal(before[n], models[n]) for n in init)  # the two inits differ: the copy shows
    for name, param in ema.named_parameters():
        if name in init:
            assert torch.equal(param, models[name]), name
        else:
            assert torch.equal(param, before[name]), name
    assert any(not torch.equal(ema.get_parameter(n), models[n]) for n in gpsa if gpsa[n] in GPSA.filter_params)


def test_late_reparameterisation_resumes_exactly_with_the_ema(data_dir, tmp_path, monkeypatch, capsys):
    """--reparam-epoch 1: one CNN epoch, then the same optimiser gains the GPSA groups; resume works before and
    after the conversion point and matches an uninterrupted run. With the EMA, best.pt is chosen on its validation."""
    straight, run = tmp_path / 'straight', tmp_path / 'run'
    # a gating lr off the default ratio (1000x): the gating group added at the conversion takes the run's (500x)
    extra = ['--reparam-epoch', '1', '--model-ema', '--set', 'model_ema_decay=0.5', '--gating-lr', '0.5']
    assert launch.main(common(data_dir, straight, epochs=3) + extra) == 0
    rows = metrics(straight)
    # best.pt: the epoch of the best EMA validation (timm's rule with an EMA); the log and the metrics say so
    assert 'best.pt: the epoch with the best EMA validation top-1 (ema_val_top1)' in capsys.readouterr().out
    ema_top1 = [r['ema_val_top1'] for r in rows]
    best = load(straight / 'best.pt')
    assert best['best_metric'] == 'ema_val_top1' and best['best_top1'] == max(ema_top1)
    assert best['epoch'] == ema_top1.index(max(ema_top1))
    assert [r['is_best'] for r in rows] == [t > max(ema_top1[:i], default=-1) for i, t in enumerate(ema_top1)]
    assert all(r['best_metric'] == 'ema_val_top1' for r in rows)
    assert rows[0]['gpsa'] == {} and rows[0]['gating_lr'] is None
    for row in rows[1:]:
        assert len(row['gpsa']) == 4 and math.isclose(row['gating_lr'] / row['lr'], 500.0, rel_tol=1e-9)
        assert 'ema_val_top1' in row
    last = load(straight / 'last.pt')
    groups = last['optimizer']['param_groups']
    assert [g['group_name'] for g in groups] == ['decay', 'no_decay', 'gpsa_decay', 'gpsa_no_decay', 'gating']
    # same optimiser: CNN parameters kept their Adam state through the conversion, GPSA ones started at it
    updates = TRAIN_IMAGES // 4
    steps = {int(s['step']) for i, s in last['optimizer']['state'].items() if i in groups[0]['params']}
    gpsa_steps = {int(last['optimizer']['state'][i]['step']) for g in groups[2:] for i in g['params']}
    assert steps == {3 * updates} and gpsa_steps == {2 * updates}
    assert any('gating' in k for k in last['ema'])

    interrupt_in_epoch(monkeypatch, epoch=1)  # before the conversion reaches a checkpoint
    assert launch.main(common(data_dir, run, epochs=3) + extra) == 130
    assert load(run / 'last.pt')['converted'] is False
    monkeypatch.undo()
    interrupt_in_epoch(monkeypatch, epoch=2)
    assert launch.main(['--resume', str(run / 'last.pt'), '--no-progress']) == 130
    assert load(run / 'last.pt')['converted'] is True
    monkeypatch.undo()
    assert launch.main(['--resume', str(run / 'last.pt'), '--no-progress']) == 0
    assert same_numbers(metrics(run), rows, keys=('train_loss', 'val_loss', 'ema_val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), last)


def test_bf16_and_channels_last_reach_the_forward_on_the_cpu(data_dir, tmp_path, monkeypatch):
    """--amp bf16 and channels_last reach the model's forward in training and validation: the stem conv and a GPSA
    layer run under CPU autocast in bfloat16 on channels-last inputs and weights, and both give bfloat16
    channels-last outputs (the GPSA layer too: no conversion around it)."""
    seen = []

    def channels_last(t):  # and not merely contiguous both ways (a 1x1 grid or one channel would be)
        return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()

    def hook(module, inputs, output):
        seen.append((module.training, type(module).__name__, torch.is_autocast_enabled('cpu'),
                     torch.get_autocast_dtype('cpu'), output.dtype, channels_last(inputs[0]), channels_last(output)))

    for name in ('train_one_epoch', 'validate'):
        original = getattr(trainer, name)

        def observed(model, *args, original=original, **kwargs):
            if not any(m._forward_hooks for m in model.modules()):
                model.conv1[0].register_forward_hook(hook)
                model.layer4[0].conv2.register_forward_hook(hook)
                assert model.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)
            return original(model, *args, **kwargs)

        monkeypatch.setattr(trainer, name, observed)
    run = tmp_path / 'bf16'
    assert launch.main(common(data_dir, run, epochs=1, device='cpu') +
                           ['--amp', 'bf16', '--set', 'channels_last=true']) == 0
    (row,) = metrics(run)
    assert math.isfinite(row['train_loss']) and math.isfinite(row['val_loss'])
    assert {(training, layer) for training, layer, *_ in seen} == {
        (True, 'Conv2d'), (True, 'GPSA'), (False, 'Conv2d'), (False, 'GPSA')}
    assert all(on and dtype == torch.bfloat16 and out == torch.bfloat16 for _, _, on, dtype, out, _, _ in seen), seen
    assert all(into and out for *_, into, out in seen), seen


def test_non_finite_loss_stops_and_keeps_last_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / 'nan'
    original = trainer.train_one_epoch

    def poisoned(model, *args, **kwargs):
        if kwargs['plan'].epoch == 1:
            with torch.no_grad():
                model.get_submodule('layer4.1.bn2').weight.fill_(float('nan'))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(trainer, 'train_one_epoch', poisoned)
    assert launch.main(common(data_dir, run, epochs=2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'non-finite training loss (nan) in epoch 2, update 1' in err[0]
    assert 'last.pt (epoch 1/2) is kept' in err[0]
    last = load(run / 'last.pt')
    assert last['epoch'] == 0 and len(metrics(run)) == 1
    assert all(torch.isfinite(v).all() for v in last['model_file']['state_dict'].values() if v.is_floating_point())


# ------------------------------------------------------------------------------------------------ distributed

def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _torchrun(args, processes=2):
    """``tcnn.train`` under torchrun (gloo, CPU) through tests/torchrun_ranks.py: every rank also writes its final
    model to OUTPUT/rank{R}.pt."""
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={processes}', '--master_addr=127.0.0.1',
           f'--master_port={_free_port()}', os.path.join(REPO, 'tests', 'torchrun_ranks.py'), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def assert_same_state(sd_a, sd_b, rtol=0.0, atol=0.0):
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        if sd_a[k].is_floating_point():
            torch.testing.assert_close(sd_a[k], sd_b[k], rtol=rtol, atol=atol, msg=k)
        else:
            assert torch.equal(sd_a[k], sd_b[k]), k


def evaluate_checkpoint(path, ema=False):
    """Validation of a saved checkpoint in one process, the way a user re-evaluates it: the model of the file (or its
    EMA weights) on the whole validation split with the run's preprocessing."""
    ckpt = read_checkpoint(str(path))
    model = model_from_dict(ckpt['model_file'])
    if ema:
        model.load_state_dict(ckpt['ema'])
    recipe = Recipe.from_dict(ckpt['config'])
    data = open_training_data(recipe)
    _, data.val.transform = build_transforms(recipe, recipe_data_config(recipe, model))
    return validate(model, DataLoader(data.val, batch_size=5), device=torch.device('cpu'),
                    prefix='ema_val' if ema else 'val')


def test_torchrun_two_processes_validate_and_save_the_same_model(data_dir, tmp_path):
    """2 processes (gloo): the ranks end with one model (batch-norm statistics averaged, as timm's distribute_bn),
    and the logged validation of the model and of its EMA is what the saved checkpoint gives when re-evaluated."""
    run = tmp_path / 'ddp'
    proc = _torchrun(common(data_dir, run, epochs=1, processes=2) + ['--model-ema', '--set', 'model_ema_decay=0.5'])
    assert proc.stdout.count('epoch 1/1:') == 1 and proc.stdout.count('2 process(es)') == 2  # rank 0 prints only
    assert '2 process(es) (gloo process group)' in proc.stdout
    assert sorted(os.listdir(run)) == ['best.pt', 'config.yaml', 'last.pt', 'metrics.jsonl', 'rank0.pt', 'rank1.pt',
                                       'status.json']
    (row,) = metrics(run)
    # each rank trains on its half (3 updates of 4 images) and evaluates a disjoint shard; metrics are global
    assert row['train_images'] == TRAIN_IMAGES and row['val_images'] == VAL_IMAGES
    last = load(run / 'last.pt')
    assert last['world_size'] == 2 and len(last['rng']) == 2 and last['global_batch'] == 8
    assert last['num_updates'] == TRAIN_IMAGES // 8
    assert not torch.equal(last['rng'][0]['torch'], last['rng'][1]['torch'])
    rank0, rank1 = load(run / 'rank0.pt'), load(run / 'rank1.pt')
    assert_same_state(rank0['model'], rank1['model'])
    assert_same_state(rank0['ema'], rank1['ema'])
    assert_same_state(rank0['model'], last['model_file']['state_dict'])
    saved = evaluate_checkpoint(run / 'last.pt')
    assert math.isclose(saved['val_loss'], row['val_loss'], rel_tol=1e-5) and saved['val_top1'] == row['val_top1']
    saved_ema = evaluate_checkpoint(run / 'last.pt', ema=True)
    assert math.isclose(saved_ema['ema_val_loss'], row['ema_val_loss'], rel_tol=1e-5)
    assert saved_ema['ema_val_top1'] == row['ema_val_top1']


@pytest.fixture(scope='module')
def convnext_weights(tmp_path_factory):
    """A convnext_atto checkpoint whose layer scales are of order 1 (timm starts them at 1e-6, which would keep the
    blocks' gradients, the GPSA layers' included, too small for the comparisons below to see anything)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp('convnext') / 'convnext_atto.pt'
    torch.save(nontrivial(timm.create_model('convnext_atto', num_classes=3)).state_dict(), path)
    return str(path)


def _exact_args(data_dir, output, weights, batch, accum):
    """A run whose updates depend on the global batch only: ConvNeXt (LayerNorm, no batch statistics) without mixup,
    stochastic depth or dropout (per-image augmentation is seeded by image), and SGD, whose step is proportional to
    the gradient (Adam would hide a wrongly scaled one)."""
    return ['--data', data_dir, '--output', str(output), '--model', 'convnext_atto', '--weights', weights, '--epochs',
            '1', '--batch-size', str(batch), '--accum-steps', str(accum), '--img-size', '64', '--workers', '0',
            '--no-progress', '--device', 'cpu', '--lr', '0.05', '--gating-lr', '5', '--set', 'opt=sgd',
            '--set', 'warmup_epochs=0', '--set', 'mixup=0', '--set', 'cutmix=0', '--set', 'scale_lr=false']


@pytest.fixture(scope='module')
def one_process_batch_8(data_dir, convnext_weights, tmp_path_factory):
    run = tmp_path_factory.mktemp('exact') / 'b8'
    assert launch.main(_exact_args(data_dir, run, convnext_weights, batch=8, accum=1)) == 0
    return run


def _assert_same_run(run, reference, weights):
    trained = load(run / 'last.pt')['model_file']['state_dict']
    assert_same_state(trained, load(reference / 'last.pt')['model_file']['state_dict'], rtol=1e-4, atol=1e-6)
    (row,), (ref,) = metrics(run), metrics(reference)
    assert math.isclose(row['train_loss'], ref['train_loss'], rel_tol=1e-5)
    assert math.isclose(row['val_loss'], ref['val_loss'], rel_tol=1e-5)
    # not vacuous: the updates moved the weights well beyond the tolerance, the GPSA layers' too
    start = load(weights)
    assert (trained['head.fc.weight'] - start['head.fc.weight']).abs().max() > 1e-2
    # stages.3: its 2x2 downsampling conv and two 7x7 depthwise convs; lambda starts at gating_init 1.0
    gates = [trained[k] for k in trained if k.endswith('.gating')]
    assert len(gates) == 3 and all((g - 1.0).abs().max() > 1e-3 for g in gates)


def test_gradient_accumulation_equals_the_larger_batch(data_dir, convnext_weights, tmp_path, one_process_batch_8):
    run = tmp_path / 'b4x2'
    assert launch.main(_exact_args(data_dir, run, convnext_weights, batch=4, accum=2)) == 0
    assert load(run / 'last.pt')['num_updates'] == 3
    _assert_same_run(run, one_process_batch_8, convnext_weights)


def test_torchrun_with_accumulation_equals_one_process(data_dir, convnext_weights, tmp_path, one_process_batch_8):
    """2 processes x batch 2 x 2 accumulated micro-batches = 1 process x batch 8: the same images per update (the
    sampler interleaves the ranks), gradients averaged by DDP, and the ranks end equal."""
    run = tmp_path / 'ddp'
    _torchrun(_exact_args(data_dir, run, convnext_weights, batch=2, accum=2))
    assert_same_state(load(run / 'rank0.pt')['model'], load(run / 'rank1.pt')['model'])
    _assert_same_run(run, one_process_batch_8, convnext_weights)


# ------------------------------------------------------------------------------------------------ bad input

def test_bad_data_folders_are_refused_in_one_line(data_dir, tmp_path, capsys):
    base = common(data_dir, tmp_path / 'out', epochs=1)
    cases = []
    missing = base.copy()
    missing[1] = str(tmp_path / 'nowhere')
    cases.append((missing, 'data folder not found'))
    no_val = tmp_path / 'no_val'
    make_image_folder(str(no_val), num_classes=2, train_per_class=4, val_per_class=0)
    os.rmdir(no_val / 'val' / 'circle')
    os.rmdir(no_val / 'val' / 'square')
    os.rmdir(no_val / 'val')
    cases.append(([*base[:1], str(no_val), *base[2:]], f'data folder not found: {no_val / "val"}'))
    empty = tmp_path / 'empty'
    for split in ('train', 'val'):
        (empty / split / 'circle').mkdir(parents=True)
    cases.append(([*base[:1], str(empty), *base[2:]], 'no images in'))
    extra_class = tmp_path / 'extra'
    make_image_folder(str(extra_class), num_classes=2, train_per_class=4, val_per_class=2)
    make_image_folder(str(tmp_path / 'more'), num_classes=3, train_per_class=0, val_per_class=2)
    os.rename(tmp_path / 'more' / 'val' / 'triangle', extra_class / 'val' / 'triangle')
    cases.append(([*base[:1], str(extra_class), *base[2:]], 'classes that the training set lacks: triangle'))
    cases.append((base + ['--batch-size', '32'], 'smaller than one update'))
    for args, message in cases:
        assert launch.main(args) == 2, message
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith('tcnn train: error:') and message in err[0], err


def test_a_dropped_head_is_named_with_the_data_class_count(data_dir, tmp_path):
    """``tcnn train --weights`` of a 1000-class checkpoint on a 3-class folder: the one warning about the replaced
    head speaks of the data's class count, not of a ``num_classes`` the user never gave."""
    weights = tmp_path / 'imagenet_head.pth'
    torch.save(timm.create_model('resnet18d', num_classes=1000).state_dict(), weights)
    recipe = resolve_recipe(None, {'data': data_dir, 'model': 'resnet18d', 'weights': str(weights)}, [])
    with pytest.warns(UserWarning) as caught:
        model = create_model(recipe, open_training_data(recipe).num_classes)
    (message,) = [str(w.message) for w in caught if 'dropped' in str(w.message)]
    assert message == (f"{weights}: its head 'fc' (1000 classes) is dropped for a new, randomly initialised one for "
                       "the data's 3 classes")
    assert model.fc.out_features == 3


@pytest.mark.parametrize('classes', [1000, 5])
def test_a_class_count_other_than_the_data_is_refused(data_dir, tmp_path, capsys, classes):
    """``--set num_classes=N`` on a 3-class folder: one line naming both counts and the fix, before any training (an
    ImageNet head trained on its classes 0-2 would learn nothing useful); the folder's own count is accepted."""
    from tcnn.cli import main as tcnn_main
    out = tmp_path / 'deep' / 'out'
    assert tcnn_main(['train', *common(data_dir, out, epochs=1), '--set', f'num_classes={classes}']) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('tcnn train: error: '), err
    assert f"num_classes {classes} disagrees with the data's 3 classes" in err[0]
    assert 'leave num_classes out' in err[0] and '--set num_classes=3' in err[0]
    assert 'epoch 1' not in captured.out and not (tmp_path / 'deep').exists()
    recipe = resolve_recipe(None, {'data': data_dir}, ['num_classes=3'])
    assert open_training_data(recipe).num_classes == 3


def test_bad_recipe_and_model_fail_clearly(data_dir, tmp_path, capsys):
    bad = tmp_path / 'bad.yaml'
    bad.write_text('base: ' + os.path.join(RECIPES, 'base.yaml') + '\nmodle: resnet50d\n')
    base = common(data_dir, tmp_path / 'out', epochs=1)
    cases = [
        (['--recipe', str(bad)] + base, "unknown recipe key 'modle'"),
        (['--recipe', str(tmp_path / 'none.yaml')] + base, 'recipe file not found'),
        (base + ['--set', 'wight_decay=0.1'], 'did you mean weight_decay'),
        (base + ['--model', 'vit_tiny_patch16_224'], 'has no stage with a k x k convolution'),
        (base + ['--model', 'convnext_atto', '--set', 'stages=stages.3.*.conv_pw'],
         'no module of convnext_atto matches'),
        (base + ['--set', 'stages=layer9'], "no submodule 'layer9'"),
        (base + ['--model', 'resnet18q'], 'unknown timm model'),
        (['--resume', str(tmp_path / 'none.pt')], 'checkpoint not found'),
    ]
    for args, message in cases:
        assert launch.main(args) == 2, message
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / 'out' / 'last.pt').exists()


@pytest.mark.parametrize('argv, message', [
    (['--num-classes', '5'], "--num-classes is timm train.py's flag; tcnn train's way: the class count comes from the "
                             'data (one output per class folder); for data that does not state its classes: --set '
                             'num_classes=5'),
    (['--warmup-epochs', '3'], 'tcnn train has no --warmup-epochs flag: use --set warmup_epochs=3'),
    (['--weight-decay=0.1'], 'use --set weight_decay=0.1'),
    (['--drop-path', '0.1'], 'use --set drop_path_rate=0.1'),
    (['--opt', 'sgd'], 'use --set opt=sgd'),
    (['--sched', 'cosine'], 'use --set sched=cosine'),
    (['--mixup', '0.2', '--cutmix', '0'], 'use --set mixup=0.2'),
    (['--scale', '0.5', '1'], 'use --set scale=[0.5,1]'),
    (['--smoothing', '0.1', '0.2'], 'use --set smoothing=[0.1,0.2]'),  # two values: a list, for the check to refuse
    (['--smoothing', '-0.5'], 'use --set smoothing=-0.5'),  # a negative number is a value, not a flag
    (['--smoothing', '-1e-3'], 'use --set smoothing=-1e-3'),
    (['--channels-last'], 'use --set channels_last=true'),
    (['-b', '64'], "-b is timm train.py's flag; tcnn train's way: --batch-size 64"),
    (['--grad-accum-steps', '2'], '--accum-steps 2'),
    (['--initial-checkpoint', 'w.pth'], '--weights w.pth'),
    (['--log-wandb'], '--log wandb'),
    (['--pretrained'], 'a run starts from the pretrained weights by default'),
    (['--layer-decay', '0.7'], 'unknown argument --layer-decay: tcnn train takes its flags (tcnn train --help) and any '
                               'recipe key as --set KEY=VALUE (closest: weight_decay); every key and its value: tcnn '
                               'train --print-config'),
])
def test_timm_train_flags_point_to_tcnn_train_in_one_line(data_dir, tmp_path, capsys, argv, message):
    """Flags of timm's train.py that tcnn train spells otherwise (or not at all): one line with tcnn's way, from
    ``tcnn train`` and ``python -m tcnn.train`` alike, not argparse's usage; timm's flags that tcnn shares work."""
    from tcnn.cli import main as tcnn_main
    args = ['--data', data_dir, '--lr', '1e-3', '--epochs', '2', '--model', 'resnet18d', '--img-size', '64', *argv]
    for prog, call in (('tcnn train', lambda: tcnn_main(['train', *args])), ('python -m tcnn.train',
                                                                            lambda: launch.main(args))):
        with pytest.raises(SystemExit) as exit_info:
            call()
        assert exit_info.value.code == 2
        captured = capsys.readouterr()
        assert captured.err.count('\n') == 1 and 'usage' not in captured.err, captured.err
        assert captured.err.startswith(f'{prog}: error: ') and message in captured.err, captured.err


def test_cli_error_is_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    proc = subprocess.run([sys.executable, '-m', 'tcnn.cli', 'train', '--data', str(tmp_path / 'nowhere'),
                           '--no-pretrained', '--output', str(tmp_path / 'out')],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f'tcnn train: error: data folder not found: {tmp_path / "nowhere"}']
    proc = subprocess.run([sys.executable, '-m', 'tcnn.cli', 'train', '--data', str(tmp_path), '--num-classes', '1000'],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("tcnn train: error: --num-classes is timm train.py's flag") and \
        '--set num_classes=1000' in proc.stderr


def test_offline_pretrained_names_the_train_flags(data_dir, tmp_path, monkeypatch, capsys):
    """tcnn train without the pretrained weights (offline): one line naming its flags, not the Python arguments that
    the same error from tcnn.files.sources names."""
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr('tcnn.files.sources._cached_timm_file', lambda cfg: None)  # whatever this machine has cached
    from tcnn.cli import main
    args = [a for a in common(data_dir, tmp_path / 'out', epochs=1) if a != '--no-pretrained']
    assert main(['train', *args]) == 2  # offline: asserts the fast failure, downloads nothing
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tcnn train: error: cannot download pretrained weights for 'resnet18d'")
    assert err[0].endswith('pass --weights PATH (a local checkpoint) or --no-pretrained (random init)'), err
    assert 'pretrained=False' not in err[0]
    assert not (tmp_path / 'out').exists()


def test_docs_list_every_recipe_key():
    with open(os.path.join(REPO, 'docs', 'train.md')) as f:
        docs = f.read()
    assert [k for k in RECIPE_KEYS if f'`{k}`' not in docs] == []
