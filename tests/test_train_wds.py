"""``tcnn train --data wds/FOLDER``: timm's webdataset reader end to end on tiny shards that the tests write with
``tarfile`` (generated JPEGs, keys ``jpg``/``cls``), the epoch-boundary resume of a stream, and one-line errors for
what a user gets wrong (a misspelt reader, a missing shard, an unknown size or class count). CPU only."""
import io
import json
import os
import tarfile

import numpy as np
import pytest

from tcnn.train import launch
from tcnn.cli import main
from tcnn.train.distributed import EXIT_PREEMPTED

from imagegen import SHAPES, draw_shape
from test_train import assert_same_weights, load, metrics, same_numbers
from test_train_reliability import _stop_after

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

pytest.importorskip('webdataset', reason='webdataset is not installed (pip install "tcnn[wds]")')

CLASSES = 3
TRAIN_SHARDS, PER_SHARD, VAL_IMAGES = 2, 24, 12
UPDATES = TRAIN_SHARDS * PER_SHARD // 4  # batch 4, one process


def write_shard(path: str, items) -> None:
    """A webdataset shard: per sample KEY.jpg (JPEG bytes) and KEY.cls (the label as text)."""
    with tarfile.open(path, 'w') as tar:
        for key, img, label in items:
            buf = io.BytesIO()
            img.save(buf, format='JPEG', quality=90)
            for ext, data in (('jpg', buf.getvalue()), ('cls', str(label).encode())):
                info = tarfile.TarInfo(f'{key}.{ext}')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def make_shards(root: str, info: bool = True) -> str:
    """Train shards train-0000.tar, train-0001.tar and validation-0000.tar, with timm's _info.json (splits
    'train' and 'validation', as timm's webdataset ImageNet names them) unless ``info`` is false."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    splits = {}
    for split, shards, per in (('train', TRAIN_SHARDS, PER_SHARD), ('validation', 1, VAL_IMAGES)):
        files = []
        for s in range(shards):
            name = f'{split}-{s:04d}.tar'
            write_shard(os.path.join(root, name), [(f'{split}{s}_{i:04d}', draw_shape(SHAPES[i % CLASSES], 64, rng),
                                                    i % CLASSES) for i in range(per)])
            files.append(name)
        splits[split] = {'name': split, 'num_samples': shards * per, 'filenames': files,
                         'shard_lengths': [per] * shards}
    if info:
        with open(os.path.join(root, '_info.json'), 'w') as f:
            json.dump({'name': 'shapes', 'splits': splits}, f)
    return root


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp('wds')))


def args(data: str, output, epochs: int = 2, workers: int = 0, num_classes=CLASSES):
    classes = ['--set', f'num_classes={num_classes}'] if num_classes else []
    return ['--data', data, '--output', str(output), '--model', 'resnet18d', '--no-pretrained', '--epochs',
            str(epochs), '--batch-size', '4', '--img-size', '64', '--workers', str(workers), '--no-progress',
            '--lr', '1e-3', '--set', f'warmup_epochs={epochs - 1}', '--set', 'scale_lr=false', '--device', 'cpu',
            *classes]  # cpu: the exact-resume checks need deterministic kernels, also on a machine with a GPU


def test_wds_trains_end_to_end_through_the_cli(shards, tmp_path, capsys):
    """``--data wds/FOLDER`` with the recipe's default splits: 'train', and 'val' found as 'validation'. Two loader
    workers, one shard each; every epoch has the updates its stated size gives and validates every image once."""
    run = tmp_path / 'run'
    assert main(['train', *args(f'wds/{shards}', run, workers=2)]) == 0
    out = capsys.readouterr().out
    assert f'{TRAIN_SHARDS * PER_SHARD} train / {VAL_IMAGES} val images' in out and f'{UPDATES} updates/epoch' in out
    rows = metrics(run)
    assert [r['epoch'] for r in rows] == [0, 1]
    assert all(r['train_images'] == UPDATES * 4 and r['val_images'] == VAL_IMAGES for r in rows), rows
    assert load(run / 'last.pt')['epoch'] == 1


def test_wds_workers_are_capped_at_the_shards(shards, tmp_path, capsys):
    assert main(['train', *args(f'wds/{shards}', tmp_path / 'run', epochs=1, workers=4)]) == 0
    out = capsys.readouterr().out
    assert f'note: {TRAIN_SHARDS} training shards for 1 process(es): {TRAIN_SHARDS} loader worker(s) per process ' \
           'instead of 4' in out
    assert metrics(tmp_path / 'run')[0]['train_images'] == UPDATES * 4


def test_wds_stop_mid_epoch_redoes_the_epoch_and_resume_is_exact(shards, tmp_path, monkeypatch, capsys):
    """A stream cannot restart at a sample: a stop inside epoch 2 keeps last.pt at the end of epoch 1 (no partial
    state), and the resumed run redoes epoch 2 from its start, ending where an uninterrupted run ends."""
    straight = tmp_path / 'straight'
    assert launch.main(args(f'wds/{shards}', straight, workers=2)) == 0
    run = tmp_path / 'run'
    _stop_after(monkeypatch, UPDATES + 5)  # the 5th update of the second epoch
    assert launch.main(args(f'wds/{shards}', run, workers=2)) == EXIT_PREEMPTED
    out = capsys.readouterr().out
    assert f'stopped by SIGTERM in epoch 2 after update 5/{UPDATES}' in out
    assert f'holds the end of epoch 1; continue with --resume {run} (epoch 2 is redone from its start' in out
    last = load(run / 'last.pt')
    assert last['epoch'] == 0 and 'partial' not in last and last['num_updates'] == UPDATES
    monkeypatch.undo()
    assert launch.main(['--resume', str(run), '--no-progress']) == 0
    assert f'resuming after epoch 1/2 (update {UPDATES})' in capsys.readouterr().out
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))


def test_wds_stop_in_the_first_epoch_leaves_no_checkpoint(shards, tmp_path, monkeypatch, capsys):
    run = tmp_path / 'run'
    _stop_after(monkeypatch, 3)
    assert launch.main(args(f'wds/{shards}', run)) == EXIT_PREEMPTED
    assert 'no epoch was completed, so there is no checkpoint; --resume auto starts the run again' in \
        capsys.readouterr().out
    assert not (run / 'last.pt').exists()


def test_wds_splits_are_named_by_their_shard_patterns(tmp_path, capsys):
    """Without _info.json the splits name their shards (brace patterns) and the training split its size (|N)."""
    root = make_shards(str(tmp_path / 'bare'), info=False)
    extra = ['--set', f'train_split=train-{{0000..0001}}.tar|{TRAIN_SHARDS * PER_SHARD}',
             '--set', 'val_split=validation-0000.tar']
    assert main(['train', *args(f'wds/{root}', tmp_path / 'run', epochs=1), *extra]) == 0
    assert metrics(tmp_path / 'run')[0]['val_images'] == VAL_IMAGES


def _one_line_error(argv, capsys) -> str:
    assert main(['train', *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('tcnn train: error: '), err
    return err[0]


def test_wds_user_mistakes_are_one_line(shards, tmp_path, capsys):
    out = tmp_path / 'out'
    err = _one_line_error(args(f'wsd/{shards}', out), capsys)
    assert f"unknown dataset reader 'wsd' in --data wsd/{shards}: did you mean wds/{shards}?" in err
    assert "unknown dataset reader 'torch'" in _one_line_error(args('torch/cifar10', out), capsys)
    assert f'webdataset folder not found: {tmp_path / "nope"}' in _one_line_error(args(f'wds/{tmp_path / "nope"}', out),
                                                                                 capsys)
    broken = make_shards(str(tmp_path / 'broken'))
    os.remove(os.path.join(broken, 'train-0001.tar'))
    err = _one_line_error(args(f'wds/{broken}', out), capsys)
    assert f"shard not found: {os.path.join(broken, 'train-0001.tar')}, split 'train'" in err
    assert 'set --set num_classes=N' in _one_line_error(args(f'wds/{shards}', out, num_classes=None), capsys)
    err = _one_line_error(args(f'wds/{shards}', out) + ['--set', 'train_split=test'], capsys)
    assert "has no split 'test' (its _info.json lists train, validation)" in err
    err = _one_line_error(args(f'wds/{shards}', out) + ['--set', 'train_split=train-{0000..0001}.tar'], capsys)
    assert 'is unknown, so the epoch length is too' in err and '|N' in err
    import importlib.util
    if importlib.util.find_spec('datasets') is None:
        assert 'needs the datasets package: pip install datasets' in _one_line_error(args('hfds/beans', out), capsys)
    assert not out.exists()


def test_wds_class_count_of_its_info_is_checked(shards, tmp_path, capsys):
    """A webdataset whose _info.json states its class count: a run that leaves num_classes out takes it, and another
    count is refused in one line before training."""
    stated = tmp_path / 'stated'
    make_shards(str(stated))
    info = json.loads((stated / '_info.json').read_text())
    (stated / '_info.json').write_text(json.dumps(dict(info, num_classes=CLASSES)))
    err = _one_line_error(args(f'wds/{stated}', tmp_path / 'out', epochs=1, num_classes=5), capsys)
    assert f"num_classes 5 disagrees with the data's {CLASSES} classes (the classes of wds/{stated})" in err
    run = tmp_path / 'run'
    assert main(['train', *args(f'wds/{stated}', run, epochs=1, num_classes=None)]) == 0
    assert load(run / 'last.pt')['config']['num_classes'] == CLASSES


def test_wds_labels_beyond_num_classes_name_the_fix(shards, tmp_path, capsys):
    argv = args(f'wds/{shards}', tmp_path / 'out', epochs=1, workers=2, num_classes=2)
    err = _one_line_error(argv, capsys)
    assert 'has label 2, outside 0..1: set num_classes' in err
