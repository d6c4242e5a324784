"""Tests of ``tcnn train --log tensorboard wandb`` (live dashboards) and ``OUTPUT/status.json``: the logged values are
read back with TensorBoard's own reader and from W&B's offline run files (wandb's protobuf records), across a
preemption (SIGTERM -> exit 75 -> ``--resume auto``) and across a crash between two checkpoints. CPU only, offline:
random-init ``demo_resnet10`` on generated 32 px shapes."""
import glob
import io
import json
import os
import struct
import sys
import zlib
from typing import List

import numpy as np
import pytest
import torch
from PIL import Image

from tcnn.train import launch
from tcnn.train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest

from test_train import assert_same_weights, interrupt_in_epoch, load, metrics
from test_train_reliability import _stop_after

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

tensorboard_reader = pytest.importorskip('tensorboard.backend.event_processing.event_accumulator')
wandb_proto = pytest.importorskip('wandb.proto.wandb_internal_pb2')
from tensorboard.backend.event_processing import event_file_loader  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

UPDATES, EPOCHS = 4, 3  # 16 training images / batch 4
STEPS = list(range(1, UPDATES * EPOCHS + 1))
EPOCH_STEPS = [UPDATES * (e + 1) for e in range(EPOCHS)]
UPDATE_TAGS = ['train/loss', 'train/lr', 'train/gating_lr', 'train/grad_norm', 'train/img_per_s', 'train/data_wait']


IMAGE_FOLDER = dict(num_classes=2, train_per_class=8, val_per_class=2, size=32)  # the data_dir fixture's


@pytest.fixture
def fresh_wandb():
    """wandb reads its environment (mode, folder, key) once per process: start and leave these tests afresh."""
    import wandb
    wandb.teardown()
    yield
    wandb.teardown()


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch, fresh_wandb):
    folder = tmp_path / 'wandb-files'
    folder.mkdir()
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_DIR', str(folder))
    monkeypatch.setenv('WANDB_SILENT', 'true')
    return folder


def train_args(data_dir, output, *extra):
    return ['--data', data_dir, '--output', str(output), '--model', 'demo_resnet10', '--no-pretrained', '--epochs',
            str(EPOCHS), '--batch-size', '4', '--img-size', '32', '--workers', '0', '--no-progress', '--lr', '1e-3',
            '--gating-lr', '1.0', '--set', 'warmup_epochs=1', '--set', 'scale_lr=false', '--device', 'cpu', *extra]


def status(run):
    with open(run / 'status.json') as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------ readers

def tensorboard(run):
    """TensorBoard's own reader over the run's event files (all of them, in order, purges applied)."""
    events = tensorboard_reader.EventAccumulator(str(run / 'tensorboard'),
                                                 size_guidance={'scalars': 0, 'images': 0, 'tensors': 0})
    events.Reload()
    return events


def raw_tags(run):
    """The summary tags of every event in every event file, in order (TensorBoard's file reader, no purging)."""
    tags = []
    for path in sorted(glob.glob(str(run / 'tensorboard' / 'events.out.tfevents.*'))):
        for event in event_file_loader.EventFileLoader(path).Load():
            tags += [v.tag for v in event.summary.value]
    return tags


def scalars(events, tag):
    return [(e.step, e.value) for e in events.Scalars(tag)]


def wandb_records(path):
    """The protobuf records of a W&B run file (``run-ID.wandb``: wandb's LevelDB-style log of ``Record`` messages,
    32 KiB blocks of chunks with a CRC-32 of type + data)."""
    with open(path, 'rb') as f:
        buf = f.read()
    assert struct.unpack('<4sHB', buf[:7])[0] == b':W&B', path
    records, pos, data = [], 7, b''
    while pos + 7 <= len(buf):
        left = 32768 - pos % 32768
        if left < 7:  # block trailer
            pos += left
            continue
        crc, length, kind = struct.unpack('<IHB', buf[pos:pos + 7])
        if kind == 0:  # zero padding at the end of a block
            pos += left
            continue
        chunk = buf[pos + 7:pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f'corrupt record in {path}'
        pos += 7 + length
        data = chunk if kind in (1, 2) else data + chunk  # FULL/FIRST start a record, MIDDLE/LAST continue it
        if kind in (1, 4):
            record = wandb_proto.Record()
            record.ParseFromString(data)
            records.append(record)
    return records


def wandb_runs(folder):
    """Per offline run directory (start order): its records, by W&B run id."""
    runs = {}
    for path in sorted(glob.glob(str(folder / 'wandb' / 'offline-run-*' / 'run-*.wandb'))):
        records = wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof('record_type') == 'run']
        runs.setdefault(run.run_id, []).append((run.start_time.ToNanoseconds(), os.path.dirname(path), records))
    return {run_id: [(d, r) for _, d, r in sorted(parts)] for run_id, parts in runs.items()}


def wandb_history(records):
    """``[(step, {key: value})]`` of a run file's history records."""
    out = []
    for r in records:
        if r.WhichOneof('record_type') == 'history':
            items = {i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out.append((r.history.step.num, items))
    return out


# ------------------------------------------------------------------------------------------------ tests

@pytest.fixture(scope='module')
def plain(data_dir, tmp_path_factory):
    """The run without dashboards: logging must not change training."""
    out = tmp_path_factory.mktemp('plain') / 'run'
    assert launch.main(train_args(data_dir, out)) == 0
    return out


def test_dashboards_hold_every_value_and_continue_across_a_preemption(data_dir, plain, tmp_path, wandb_dir,
                                                                      monkeypatch):
    straight, run = tmp_path / 'straight', tmp_path / 'run'
    logged = ['--log', 'tensorboard', 'wandb', '--log-every', '1']
    assert launch.main(train_args(data_dir, straight, *logged)) == 0
    assert_same_weights(load(straight / 'last.pt'), load(plain / 'last.pt'))  # measuring changes nothing

    _stop_after(monkeypatch, UPDATES + 2)  # SIGTERM during the 2nd update of epoch 2
    auto = train_args(data_dir, run, *logged, '--resume', 'auto')
    assert launch.main(auto) == EXIT_PREEMPTED
    assert status(run)['state'] == 'preempted' and status(run)['num_updates'] == UPDATES + 2
    monkeypatch.setattr(launch, 'StopRequest', StopRequest)
    assert launch.main(auto) == 0
    assert status(run)['state'] == 'finished' and status(run)['completed_epochs'] == EPOCHS
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
    rows = metrics(run)

    # TensorBoard: every update once, the same values as the uninterrupted run, the epochs at their last update
    events, reference = tensorboard(run), tensorboard(straight)
    assert len(glob.glob(str(run / 'tensorboard' / 'events.out.tfevents.*'))) == 2  # one folder, one file a start
    for tag in UPDATE_TAGS:
        assert [s for s, _ in scalars(events, tag)] == STEPS, tag
    for tag in ('train/loss', 'train/lr', 'train/gating_lr', 'train/grad_norm'):
        assert scalars(events, tag) == scalars(reference, tag), tag
    assert all(v > 0 for _, v in scalars(events, 'train/grad_norm'))
    assert all(0 <= v <= 1 for _, v in scalars(events, 'train/data_wait'))
    lrs = dict(scalars(events, 'train/lr'))
    assert np.isclose(lrs[UPDATES], rows[0]['lr']) and np.isclose(lrs[STEPS[-1]], rows[-1]['lr'])
    assert all(np.isclose(dict(scalars(events, 'train/gating_lr'))[s], 1000 * lr) for s, lr in lrs.items())
    for key, tag in (('val_top1', 'val/top1'), ('val_top5', 'val/top5'), ('val_loss', 'val/loss'),
                     ('train_loss', 'train/epoch_loss')):
        assert scalars(events, tag) == [(s, pytest.approx(r[key], rel=1e-6)) for s, r in zip(EPOCH_STEPS, rows)], tag
    assert scalars(events, 'epoch') == [(s, e + 1) for e, s in enumerate(EPOCH_STEPS)]
    layers = list(rows[0]['gpsa'])
    assert layers == ['layer4.0.conv1', 'layer4.0.conv2']
    for layer in layers:
        for name in ('gate', 'span'):
            assert scalars(events, f'{name}/{layer}/mean') == [
                (s, pytest.approx(r['gpsa'][layer][f'{name}_mean'], rel=1e-6)) for s, r in zip(EPOCH_STEPS, rows)]
            for h in range(9):
                assert scalars(events, f'{name}/{layer}/head_{h}') == [
                    (s, pytest.approx(r['gpsa'][layer][name][h], rel=1e-6)) for s, r in zip(EPOCH_STEPS, rows)]
        nl = scalars(events, f'nonlocality/{layer}')
        assert [s for s, _ in nl] == EPOCH_STEPS and all(v > 0 for _, v in nl)
    assert scalars(events, 'nonlocality/mean') == [
        (s, pytest.approx(np.mean([dict(scalars(events, f'nonlocality/{lay}'))[s] for lay in layers]), rel=1e-6))
        for s in EPOCH_STEPS]
    figures = events.Images('attention')
    assert [f.step for f in figures] == EPOCH_STEPS
    for figure in figures:
        with Image.open(io.BytesIO(figure.encoded_image_string)) as img:
            assert img.mode == 'RGB' and img.width > 400 and img.height > 100  # 2 layers x 9 heads
            assert len(np.unique(np.asarray(img).reshape(-1, 3), axis=0)) > 50  # drawn maps, not a blank image
    assert raw_tags(run).count('_hparams_/session_start_info') == 1  # the recipe once, not again on resume
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent('hparams')['_hparams_/session_start_info']).session_start_info.hparams
    assert hparams['lr'].number_value == 1e-3 and hparams['model'].string_value == 'demo_resnet10'
    assert hparams['log'].string_value == '[tensorboard, wandb]' and hparams['log_every'].number_value == 1
    assert len(events.Tensors('recipe/text_summary')) == 1

    # W&B: the same run (its id kept in the checkpoint) in two offline files, every step once, in order
    runs = wandb_runs(wandb_dir)
    run_id = load(run / 'last.pt')['dashboards']['wandb_id']
    assert len(runs) == 2 and len(runs[run_id]) == 2  # the uninterrupted run and the resumed one
    history = [h for _, records in runs[run_id] for h in wandb_history(records)]
    assert [s for s, _ in history] == STEPS
    (first_dir, first), (second_dir, second) = runs[run_id]
    assert [s for s, _ in wandb_history(first)] == STEPS[:UPDATES + 2]
    exits = [[r.exit.exit_code for r in records if r.WhichOneof('record_type') == 'exit'] for _, records in
             runs[run_id]]
    assert exits == [[EXIT_PREEMPTED], [0]]
    tb_loss = dict(scalars(events, 'train/loss'))
    for step, items in history:
        assert set(t for t in UPDATE_TAGS) <= set(items), step
        assert np.float32(items['train/loss']) == tb_loss[step]
        if step in EPOCH_STEPS:
            row = rows[EPOCH_STEPS.index(step)]
            assert items['val/top1'] == pytest.approx(row['val_top1']) and items['epoch'] == row['epoch'] + 1
            assert items['gate/layer4.0.conv2/head_4'] == pytest.approx(row['gpsa']['layer4.0.conv2']['gate'][4])
            assert items['nonlocality/mean'] > 0
            folder = first_dir if step <= UPDATES + 2 else second_dir
            assert os.path.isfile(os.path.join(folder, 'files', items['attention/path']))
        else:
            assert 'val/top1' not in items and 'attention/path' not in items
    for _, records in runs[run_id]:
        configs = [r.run.config if r.WhichOneof('record_type') == 'run' else r.config for r in records
                   if r.WhichOneof('record_type') in ('run', 'config')]
        values = {u.key: json.loads(u.value_json) for config in configs for u in config.update}
        assert values['lr'] == 1e-3 and values['model'] == 'demo_resnet10' and values['epochs'] == EPOCHS


def test_a_run_shorter_than_log_every_shows_its_learning_rates_per_epoch(data_dir, tmp_path):
    """12 updates at the default log_every (50): no per-update point, but every epoch's learning rates (base and
    gating parameter groups) and loop numbers, as in metrics.jsonl, read back with TensorBoard's reader."""
    run = tmp_path / 'run'
    assert launch.main(train_args(data_dir, run, '--log', 'tensorboard')) == 0
    events, rows = tensorboard(run), metrics(run)
    assert 'train/lr' not in events.Tags()['scalars']  # fewer updates than log_every
    for key, tag in (('lr', 'train/epoch_lr'), ('gating_lr', 'train/epoch_gating_lr'),
                     ('img_per_s', 'train/epoch_img_per_s'), ('step_img_per_s', 'train/epoch_step_img_per_s'),
                     ('data_wait', 'train/epoch_data_wait')):
        assert scalars(events, tag) == [(s, pytest.approx(r[key], rel=1e-6)) for s, r in zip(EPOCH_STEPS, rows)], tag
    lrs = [v for _, v in scalars(events, 'train/epoch_lr')]
    assert len(set(lrs)) == EPOCHS  # warm-up then decay: a curve, not a constant
    assert all(np.isclose(g, 1000 * lr) for (_, g), lr in zip(scalars(events, 'train/epoch_gating_lr'), lrs))


def test_a_crash_between_checkpoints_is_logged_once(data_dir, plain, tmp_path, monkeypatch):
    """A process that dies after logging past its last checkpoint (here: an immediate Ctrl-C in epoch 2, whose
    checkpoint is the end of epoch 1): the resumed process logs those steps again, and TensorBoard shows each once
    (the purge point of the new event file), with the values of the uninterrupted run; every 2nd update only."""
    run = tmp_path / 'run'
    args = train_args(data_dir, run, '--log', 'tensorboard', '--log-every', '2')
    interrupt_in_epoch(monkeypatch, epoch=1, after=3)  # 3 updates into epoch 2
    assert launch.main(args) == EXIT_INTERRUPTED
    assert load(run / 'last.pt')['num_updates'] == UPDATES and 'partial' not in load(run / 'last.pt')
    assert [s for s, _ in scalars(tensorboard(run), 'train/loss')] == [2, 4, 6]  # step 6 is past the checkpoint
    assert status(run)['state'] == 'interrupted'
    monkeypatch.undo()
    assert launch.main(['--resume', str(run), '--data', str(tmp_path / 'moved')]) == 2
    assert status(run)['state'] == 'failed' and 'moved' in status(run)['message']
    assert launch.main(['--resume', str(run)]) == 0
    events = tensorboard(run)
    assert [s for s, _ in scalars(events, 'train/loss')] == STEPS[1::2]
    assert [s for s, _ in scalars(events, 'val/top1')] == EPOCH_STEPS
    assert len(events.Images('attention')) == EPOCHS and raw_tags(run).count('_hparams_/session_start_info') == 1
    assert_same_weights(load(run / 'last.pt'), load(plain / 'last.pt'))
    assert status(run)['state'] == 'finished'


def test_missing_extra_is_one_line_naming_it(data_dir, tmp_path, monkeypatch, capsys):
    for backend in ('tensorboard', 'wandb'):
        monkeypatch.setitem(sys.modules, backend, None)  # as if not installed
        out = tmp_path / backend
        assert launch.main(train_args(data_dir, out, '--log', 'tensorboard', 'wandb')) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f'tcnn train: error: --log {backend} needs the {backend} package: pip install '
                       f'"tcnn[{backend}]"'], err
        assert not out.exists()
        monkeypatch.undo()
    assert launch.main(train_args(data_dir, tmp_path / 'bad', '--set', 'log=[tensorbord]')) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recipe key 'log' takes tensorboard, wandb or none, got 'tensorbord'" in err[0], err


def test_wandb_that_cannot_start_is_one_line(data_dir, tmp_path, monkeypatch, capsys, fresh_wandb):
    monkeypatch.setenv('WANDB_MODE', 'online')  # without an API key: wandb refuses at once, without the network
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv('WANDB_DIR', str(tmp_path))
    run = tmp_path / 'run'
    assert launch.main(train_args(data_dir, run, '--log', 'wandb')) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '--log wandb: cannot start the W&B run (No API key configured' in err[0], err
    assert 'WANDB_MODE=offline' in err[0] and status(run)['state'] == 'failed'


# ---------------------------------------------------------------------- what the W&B logger asks of wandb


class _FakeWandB:
    """The part of the ``wandb`` module the logger calls, recording each call."""

    def __init__(self):
        self.calls = []
        test = self

        class Run:
            id, step = 'run-id', 0

            def log(self, values, step):
                test.calls.append(('log', dict(values), step))

            def mark_preempting(self):
                test.calls.append(('mark_preempting',))

            def finish(self, exit_code):
                test.calls.append(('finish', exit_code))
        self.run = Run()

    def init(self, **kwargs):
        self.calls.append(('init', kwargs))
        return self.run

    def Image(self, pixels, caption=None):  # noqa: N802 - wandb's name
        return ('Image', pixels, caption)


@pytest.mark.parametrize('recipe_project, env_project, project', [('mine', 'env', 'mine'), (None, 'env', 'env'),
                                                                  (None, None, 'tcnn')])
def test_the_wandb_run_is_named_after_the_output_in_the_recipes_or_the_environments_project(
        monkeypatch, tmp_path, recipe_project, env_project, project):
    from tcnn.train.dashboards import _WandB
    from tcnn.train.recipe import Recipe
    fake = _FakeWandB()
    monkeypatch.setitem(sys.modules, 'wandb', fake)
    monkeypatch.delenv('WANDB_DIR', raising=False)
    if env_project:
        monkeypatch.setenv('WANDB_PROJECT', env_project)
    else:
        monkeypatch.delenv('WANDB_PROJECT', raising=False)
    recipe = Recipe(wandb_project=recipe_project)
    logger = _WandB(str(tmp_path / 'runs' / 'r1') + os.sep, recipe, 'id-7')
    assert fake.calls == [('init', {'project': project, 'id': 'id-7', 'resume': 'allow', 'config': recipe.to_dict(),
                                    'name': 'r1', 'dir': str(tmp_path / 'runs' / 'r1') + os.sep})]
    monkeypatch.setenv('WANDB_DIR', str(tmp_path))
    _WandB(str(tmp_path / 'r2'), recipe, None)
    assert fake.calls[-1][1]['dir'] is None and fake.calls[-1][1]['name'] == 'r2'  # wandb reads WANDB_DIR itself
    logger.image('attention', 'pixels', 'epoch 3', 5)
    assert fake.calls[-1] == ('log', {'attention': ('Image', 'pixels', 'epoch 3')}, 5)
    assert logger.state_dict() == {'wandb_id': 'run-id'}


@pytest.mark.parametrize('exit_code, preempting', [(EXIT_PREEMPTED, True), (0, False), (EXIT_INTERRUPTED, False),
                                                   (1, False)])
def test_a_preempted_wandb_run_is_marked_preempting_before_it_finishes(monkeypatch, tmp_path, exit_code, preempting):
    from tcnn.train.dashboards import _WandB
    from tcnn.train.recipe import Recipe
    fake = _FakeWandB()
    monkeypatch.setitem(sys.modules, 'wandb', fake)
    _WandB(str(tmp_path), Recipe(), None).close(exit_code)
    assert fake.calls[1:] == [('mark_preempting',)] * preempting + [('finish', exit_code)]


def test_an_epoch_row_without_gpsa_layers_gives_the_accuracy_and_loss_scalars_only():
    from tcnn.train.dashboards import epoch_scalars
    row = {'epoch': 2, 'train_loss': 1.5, 'val_top1': 60.0, 'val_top5': None}
    scalars = epoch_scalars(row)
    assert scalars['epoch'] == 3 and 1.5 in scalars.values() and 60.0 in scalars.values()
    assert not [tag for tag in scalars if tag.startswith(('gate/', 'span/'))] and None not in scalars.values()


def test_a_wandb_run_that_cannot_start_is_one_error_naming_the_ways_on(monkeypatch, tmp_path):
    """wandb's own error (its first line) and the three ways on, word for word."""
    from tcnn.errors import TcnnError
    from tcnn.train.dashboards import _WandB
    from tcnn.train.recipe import Recipe
    fake = _FakeWandB()

    def refuse(**kwargs):
        raise RuntimeError('No API key configured.\nUse `wandb login` to log in.')
    fake.init = refuse
    monkeypatch.setitem(sys.modules, 'wandb', fake)
    with pytest.raises(TcnnError) as error:
        _WandB(str(tmp_path), Recipe(), None)
    assert str(error.value) == ('--log wandb: cannot start the W&B run (No API key configured.); log in (wandb login), '
                                'set WANDB_MODE=offline to sync later, or leave out wandb')


# ------------------------------------------------------------------------------------------ the probe images


class _Images:
    """A map-style validation set of ``n`` one-pixel images whose value is their index."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.full((3, 1, 1), float(i)), i % 2


class _NamedImages(_Images):
    """An image folder: its images have file names."""

    def filename(self, i: int) -> str:
        return f'/data/val/class{i % 2}/img{i:03d}.jpg'


class _Stream(torch.utils.data.IterableDataset):
    """A stream of ``n`` such images: ``__getitem__`` (torch's Dataset has one) but no ``__len__``."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(_Images(self.n)[i] for i in range(self.n))


def _probed(probe) -> List[int]:
    return probe.images[:, 0, 0, 0].long().tolist()


@pytest.mark.parametrize('n, indices', [(20, [0, 3, 5, 8, 11, 14, 16, 19]), (9, [0, 1, 2, 3, 5, 6, 7, 8]),
                                        (8, list(range(8))), (3, [0, 1, 2]), (1, [0])])
def test_the_probe_images_spread_over_a_map_style_validation_set_from_its_first_to_its_last(n, indices):
    """``PROBE_IMAGES`` (8) images, evenly spaced over the split and each once (all of a smaller one); the figure is
    titled with the first one's file name, or its index for a set without file names."""
    from tcnn.train.dashboards import PROBE_IMAGES, _Probe
    assert PROBE_IMAGES == 8
    config = {'mean': (0.5,) * 3}
    probe = _Probe(_NamedImages(n), config)
    assert _probed(probe) == indices and probe.name == 'img000.jpg' and probe.data_config is config
    assert probe.images.shape == (len(indices), 3, 1, 1)
    unnamed = _Probe(_Images(n), config)
    assert _probed(unnamed) == indices and unnamed.name == 'validation image 0'
    assert _probed(_Probe(_Images(n), config, count=2)) == [0, n - 1][:min(n, 2)]


def test_the_probe_images_of_a_stream_are_its_first_ones():
    from tcnn.train.dashboards import _Probe
    probe = _Probe(_Stream(20), {})
    assert _probed(probe) == list(range(8)) and probe.name == 'first validation image'
    assert _probed(_Probe(_Stream(3), {})) == [0, 1, 2]


@pytest.mark.parametrize('dataset', [_Images(0), _Stream(0)])
def test_an_empty_validation_set_has_no_probe_images(dataset):
    from tcnn.errors import TcnnError
    from tcnn.train.dashboards import _Probe
    with pytest.raises(TcnnError, match='^the validation set is empty$'):
        _Probe(dataset, {})
