"""``tcnn train --data wds/FOLDER``: timm's webdataset reader end to end on tiny shards that the tests write with
``tarfile`` (generated JPEGs, keys ``jpg``/``cls``), the epoch-boundary resume of a stream, and one-line errors for
what a user gets wrong (a misspelt reader, a missing shard, an unknown size or class count). CPU only."""
import io
import json
import os
import tarfile
from types import SimpleNamespace
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tcnn.train import launch
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.train.distributed import EXIT_PREEMPTED, ignore_stop_signals

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
    # the smallest T-CNN (resnet10t: 2 GPSA layers) at 32 px: the promises are the stream's, 2.3x faster than
    # resnet18d at 64 px
    return ['--data', data, '--output', str(output), '--model', 'resnet10t', '--no-pretrained', '--epochs',
            str(epochs), '--batch-size', '4', '--img-size', '32', '--workers', str(workers), '--no-progress',
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


def test_a_stream_readers_refusals_are_word_for_word_and_a_one_sample_split_opens(shards, tmp_path, monkeypatch):
    """What ``open_reader_datasets`` refuses before a run starts, in full: a missing shard folder, a training split of
    unknown size (the epoch length), a reader whose package is missing; a training split of one sample is a split."""
    import importlib.util
    from tcnn.data.readers import open_reader_datasets

    def refusal(data, train_split='train'):
        with pytest.raises(TcnnError) as error:
            open_reader_datasets(data, train_split, 'validation', num_classes=CLASSES, batch_size=4, seed=0)
        return str(error.value)

    missing = tmp_path / 'nope'
    assert refusal(f'wds/{missing}') == (f'webdataset folder not found: {missing} (--data wds/FOLDER: the folder of '
                                         'the .tar shards and their _info.json)')
    split = 'train-{0000..0001}.tar'
    assert refusal(f'wds/{shards}', split) == (
        f"the size of split {split!r} of wds/{shards} is unknown, so the epoch length is too: give it in the "
        '_info.json ("num_samples") or the split, e.g. --set train_split="train-{0000..0099}.tar|N"')
    train, _, _ = open_reader_datasets(f'wds/{shards}', 'train-{0000..0000}.tar|1', 'validation',
                                       num_classes=CLASSES, batch_size=4, seed=0)
    assert train.num_samples == 1
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *args: None)
    assert refusal(f'wds/{shards}') == f"--data wds/{shards} needs the webdataset package: pip install 'tcnn[wds]'"

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


# ------------------------------------------------------------------------------ the loaders of a stream, in-process


class _Split(torch.utils.data.IterableDataset):
    """The part of a ``StreamDataset`` that ``_stream_loaders`` uses, recording the worker counts it is given."""

    def __init__(self, shards: int, split: str = 'train'):
        self.shards, self.split = shards, split
        self.workers: List[Optional[int]] = []
        self.whole = False

    def set_workers(self, workers: Optional[int]) -> None:
        self.workers.append(workers)

    def use_every_sample_in_this_process(self) -> None:
        self.whole = True

    def __iter__(self) -> Iterator[int]:
        return iter(())


def _stream_loaders(shards: int, workers: int, *, val_shards: int = 1, world_size: int = 1, rank: int = 0,
                    pin: bool = True) -> Tuple[Any, _Split, _Split, List[str], torch.Generator]:
    """``builders._stream_loaders`` of fake splits: (its Loaders, the train and val splits, the lines it logged, the
    generator it was given)."""
    from tcnn.train.builders import _stream_loaders as build
    from tcnn.train.distributed import DistContext
    train, val = _Split(shards), _Split(val_shards, 'validation')
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                      device=torch.device('cpu'), distributed=world_size > 1)
    lines: List[str] = []
    generator = torch.Generator()
    recipe = SimpleNamespace(batch_size=4, data='wds/shards')  # the two keys it reads
    return build(recipe, train, val, ctx, lines.append, workers, pin, generator), train, val, lines, generator


def test_a_streams_loaders_batch_it_with_the_runs_workers_generator_and_signal_handling():
    """Training drops the short last batch (every update a full batch) and its workers are seeded from the run's
    generator; both loaders pin memory as asked and their workers leave job-wide stop signals to this process."""
    loaders, train, val, lines, generator = _stream_loaders(shards=4, workers=2, val_shards=3)
    assert lines == []  # two workers for four shards: no note
    assert (loaders.sampler, loaders.generator, loaders.workers) == (None, generator, 2)
    t = loaders.train
    assert (t.dataset, t.batch_size, t.num_workers, t.pin_memory, t.drop_last, t.generator, t.worker_init_fn) == \
        (train, 4, 2, True, True, generator, ignore_stop_signals)
    v = loaders.val
    assert (v.dataset, v.batch_size, v.num_workers, v.pin_memory, v.drop_last, v.worker_init_fn) == \
        (val, 4, 2, True, False, ignore_stop_signals)
    assert train.workers == [2] and val.workers == [2] and val.whole and not train.whole
    assert _stream_loaders(shards=4, workers=2, pin=False)[0].train.pin_memory is False
    assert _stream_loaders(shards=4, workers=2, pin=False)[0].val.pin_memory is False


@pytest.mark.parametrize('workers, val_shards, val_workers', [(2, 1, 1), (1, 2, 1), (2, 5, 2), (0, 1, 0)])
def test_a_streams_validation_has_the_training_workers_capped_at_its_shards(workers, val_shards, val_workers):
    loaders, train, val, _, _ = _stream_loaders(shards=4, workers=workers, val_shards=val_shards)
    assert loaders.val.num_workers == val_workers and val.workers == [val_workers]
    assert loaders.train.num_workers == loaders.workers == workers and train.workers == [workers]


@pytest.mark.parametrize('shards, world_size, workers, per_process', [(2, 1, 4, 2), (3, 2, 2, 1), (5, 2, 8, 2)])
def test_a_streams_workers_are_capped_at_its_shards_per_process_with_a_note(shards, world_size, workers, per_process):
    """Each worker needs a shard of its own (an idle one would end the epoch short): a process gets the whole shards
    that fall to it, and the note says so."""
    loaders, train, _, lines, _ = _stream_loaders(shards=shards, workers=workers, world_size=world_size)
    assert lines == [f'note: {shards} training shards for {world_size} process(es): {per_process} loader worker(s) '
                     f'per process instead of {workers} (each needs a shard)']
    assert loaders.workers == loaders.train.num_workers == per_process and train.workers == [per_process]


def test_a_stream_with_a_shard_for_each_worker_exactly_keeps_its_workers_without_a_note():
    loaders, _, _, lines, _ = _stream_loaders(shards=2, workers=2)
    assert lines == [] and loaders.workers == loaders.train.num_workers == 2


@pytest.mark.parametrize('shards, world_size', [(1, 2), (3, 4)])
def test_a_stream_with_fewer_shards_than_processes_is_refused_naming_the_fix(shards, world_size):
    with pytest.raises(TcnnError) as error:
        _stream_loaders(shards=shards, workers=1, world_size=world_size)
    assert str(error.value) == (f"split 'train' of wds/shards has {shards} shard(s) for {world_size} processes: every "
                                'process needs at least one; write more shards')


def test_a_streams_validation_runs_on_the_first_process_only():
    """The other ranks add nothing to the summed metrics: rank 0 streams the whole split."""
    loaders, _, val, _, _ = _stream_loaders(shards=2, workers=1, world_size=2, rank=1)
    assert loaders.val == [] and val.whole and loaders.train.num_workers == 1
    assert isinstance(_stream_loaders(shards=2, workers=1, world_size=2, rank=0)[0].val, DataLoader)


# ------------------------------------------------------------------------------ the message of a stop in a stream


def _stopped_stream(epoch: int, updates: int, signal_name: Optional[str]) -> Tuple[int, List[str]]:
    """``Trainer._stopped_stream`` on the attributes it reads: (its exit code, the lines it logged)."""
    from tcnn.train.engine import EpochPosition
    from tcnn.train.trainer import Trainer
    lines: List[str] = []
    run = SimpleNamespace(stop=SimpleNamespace(signal_name=signal_name, exit_code=EXIT_PREEMPTED),
                          folder=SimpleNamespace(last='/runs/r/last.pt'), output='/runs/r',
                          recipe=SimpleNamespace(data='wds/shards'), updates_per_epoch=12, log=lines.append)
    return Trainer._stopped_stream(run, epoch, EpochPosition(updates=updates)), lines


@pytest.mark.parametrize('signal_name, cause', [('SIGUSR1', 'SIGUSR1'), (None, 'a signal to another process')])
def test_a_stop_in_a_streams_later_epoch_says_last_pt_holds_the_previous_epoch_which_resume_redoes(signal_name, cause):
    """No signal name: another process was signalled and this one learnt of the stop from it."""
    assert _stopped_stream(1, 5, signal_name) == (EXIT_PREEMPTED, [
        f'stopped by {cause} in epoch 2 after update 5/12: /runs/r/last.pt holds the end of epoch 1; continue with '
        '--resume /runs/r (epoch 2 is redone from its start: wds/shards is a stream) (exit code 75)'])
    assert _stopped_stream(4, 11, signal_name)[1] == [
        f'stopped by {cause} in epoch 5 after update 11/12: /runs/r/last.pt holds the end of epoch 4; continue with '
        '--resume /runs/r (epoch 5 is redone from its start: wds/shards is a stream) (exit code 75)']


def test_a_stop_in_a_streams_first_epoch_says_there_is_no_checkpoint():
    assert _stopped_stream(0, 3, None) == (EXIT_PREEMPTED, [
        'stopped by a signal to another process in epoch 1 after update 3/12: no epoch was completed, so there is no '
        'checkpoint; --resume auto starts the run again (exit code 75)'])


def test_a_split_none_of_whose_synonyms_the_data_has_is_refused_under_the_name_asked_for(tmp_path):
    """``val`` where the shards' _info.json lists neither it nor a synonym (validation, valid, eval, evaluation): the
    refusal names the split the user gave, and a synonym it has is taken in its place."""
    from tcnn.data.readers import _wds_split
    info = {'splits': {name: {'name': name, 'num_samples': 4, 'filenames': [f'{name}-0000.tar'], 'shard_lengths': [4]}
                       for name in ('train', 'training')}}
    for name in info['splits']:
        (tmp_path / f'{name}-0000.tar').touch()
    with pytest.raises(TcnnError) as error:
        _wds_split(str(tmp_path), 'val', info)
    assert str(error.value).startswith(f"wds/{tmp_path} has no split 'val' (its _info.json lists train, training):")
    assert _wds_split(str(tmp_path), 'training', info)[0] == 'training'  # the name itself before a synonym


def _stream(shards: str, split: str) -> Any:
    """The training (or validation) StreamDataset of ``--data wds/SHARDS``, as ``tcnn train`` opens it."""
    from tcnn.data.readers import open_reader_datasets
    train, val, _ = open_reader_datasets(f'wds/{shards}', 'train', 'validation', num_classes=CLASSES, batch_size=4,
                                         seed=0)
    return train if split == 'train' else val


def _seen(dataset: Any) -> List[Tuple[int, int]]:
    """Each sample of one pass, in order: its label and a checksum of its pixels."""
    return [(target, int(np.asarray(img, dtype=np.int64).sum())) for img, target in dataset]


def test_a_streams_epoch_read_in_this_process_depends_on_its_number_only(shards):
    """Without loader workers timm's webdataset pipeline lives in this process and its sample shuffle keeps a random
    state: ``set_epoch`` rebuilds it, so epoch 1 after epoch 0 is epoch 1 of a run resumed there (and not epoch 0)."""
    straight = _stream(shards, 'train')
    straight.set_workers(0)
    epoch0 = _seen(straight)
    straight.set_epoch(1)
    resumed = _stream(shards, 'train')
    resumed.set_workers(0)
    resumed.set_epoch(1)
    assert _seen(straight) == _seen(resumed) != epoch0
    assert sorted(epoch0) == sorted(_seen(resumed))  # the same samples in another order


def test_a_streams_reader_is_told_the_loaders_workers(shards):
    """timm's stream readers estimate their per-worker sample counts from the worker count before the workers
    start (zero workers: the main process reads, one)."""
    train = _stream(shards, 'train')
    train.set_workers(5)
    # 48 samples over 5 workers: 9.6 each, rounded up to whole batches of 4 (timm's reader repeats samples to fill them)
    assert train.dataset.reader.num_workers == 5 and len(train.dataset) == 5 * 12
    train.set_workers(0)
    assert train.dataset.reader.num_workers == 1


def test_a_streams_validation_on_rank_0_reads_every_sample(shards):
    """Validation runs on the first process only (the other ranks add nothing): there the reader, which timm set to
    its rank's share under torchrun, reads the whole split."""
    val = _stream(shards, 'validation')
    val.dataset.reader.dist_rank, val.dataset.reader.dist_num_replicas = 1, 2  # as timm sets them under torchrun
    val.use_every_sample_in_this_process()
    assert len(_seen(val)) == VAL_IMAGES


def test_a_stream_over_a_split_with_two_shards_validates_every_sample_on_rank_0_with_loader_workers(shards):
    """The whole split on rank 0 also when loader workers share it: timm's reader gives worker ``w`` of rank ``r``
    the shards ``r * workers + w`` apart, so rank 0 of one process is needed, not only one process."""
    from tcnn.data.readers import open_reader_datasets
    _, val, _ = open_reader_datasets(f'wds/{shards}', 'train', 'train', num_classes=CLASSES, batch_size=4, seed=0)
    val.dataset.reader.dist_rank, val.dataset.reader.dist_num_replicas = 1, 2  # as timm sets them under torchrun
    val.use_every_sample_in_this_process()
    val.set_workers(TRAIN_SHARDS)
    loader = DataLoader(val, batch_size=None, num_workers=TRAIN_SHARDS)
    assert sorted(_seen(loader)) == sorted(_seen(_stream(shards, 'train')))


def test_a_streams_class_names_are_those_its_reader_gives():
    """A stream whose reader names its classes (a Hugging Face dataset's label names) keeps them for the run's
    records; one without (webdataset's bare indices) has none."""
    from tcnn.data.readers import StreamDataset, class_names
    named = StreamDataset(None, 'hfids/x', 'train', 8, 2, 1, class_to_idx={'cat': 0, 'dog': 1})
    assert class_names(named, 2) == ['cat', 'dog'] and named.class_to_idx == {'cat': 0, 'dog': 1}
    assert class_names(StreamDataset(None, 'wds/x', 'train', 8, 2, 1), 2) is None
    assert class_names(list(range(4)), 2) is None  # any dataset: one without class_to_idx names none


def test_a_folder_named_like_a_misspelt_reader_is_read_as_a_folder(tmp_path, monkeypatch):
    """Only a path with a slash, neither it nor its first folder existing, is taken for a misspelt reader."""
    from tcnn.data.readers import split_data_spec
    monkeypatch.chdir(tmp_path)
    assert split_data_spec('wsd') == (None, 'wsd')  # no slash: a folder, even a missing one
    os.makedirs(os.path.join('wsd', 'train'))
    assert split_data_spec('wsd/train') == (None, 'wsd/train')
    assert split_data_spec('wsd/other') == (None, 'wsd/other')  # its first folder exists
    with pytest.raises(TcnnError, match="^unknown dataset reader 'hdfs' in --data hdfs/x: did you mean hfds/x"):
        split_data_spec('hdfs/x')
    readers = "tcnn train reads a folder (ImageFolder layout) or timm's readers wds/, hfds/, hfids/, tfds/"
    for data in ('torch/cifar10', 'webdataset/x'):  # timm's other readers, no close spelling: no guess
        with pytest.raises(TcnnError) as info:
            split_data_spec(data)
        assert str(info.value) == f"unknown dataset reader {data.split('/')[0]!r} in --data {data}: {readers}"
    with pytest.raises(TcnnError, match="^unknown dataset reader 'HF' in --data HF/x: did you mean hfds/x"):
        split_data_spec('HF/x')


def test_a_shard_folders_info_file_that_does_not_read_as_a_json_object_is_refused_word_for_word(tmp_path):
    """timm's ``_info.json`` (or ``info.json``) of a local shard folder: broken JSON and a JSON value other than an
    object are refused naming the file; a folder without one has no info; remote and piped shards are not local."""
    from tcnn.data.readers import _is_local, _read_info
    assert _read_info(str(tmp_path)) == {}
    (tmp_path / 'info.json').write_text('{"splits": {}}')
    assert _read_info(str(tmp_path)) == {'splits': {}}
    path = tmp_path / '_info.json'
    path.write_text('{"splits": ')
    try:
        json.loads(path.read_text())
    except ValueError as e:
        reason = f'JSONDecodeError: {e}'
    with pytest.raises(TcnnError) as error:
        _read_info(str(tmp_path))
    assert str(error.value) == f'cannot read {path} ({reason}): fix or remove it'
    path.write_text('[1, 2]')
    with pytest.raises(TcnnError) as error:
        _read_info(str(tmp_path))
    assert str(error.value) == f'{path} is not a JSON object (timm\'s webdataset info: {{"splits": {{...}}}})'
    assert _is_local('/data/shards') and _is_local('shards')
    assert not _is_local('pipe:aws s3 cp s3://b/shards -') and not _is_local('pipe:cat /data/shards')
    assert not _is_local('https://host/shards')


def test_a_webdataset_split_that_cannot_be_found_or_read_is_refused_word_for_word(tmp_path):
    """What ``--set train_split=...`` or the shard folder's _info.json gets wrong, each refused in a message that
    says what the folder has; a brace pattern names its shards without an _info.json entry."""
    from tcnn.data.readers import _wds_split
    root = str(tmp_path)

    def refusal(split, info):
        with pytest.raises(TcnnError) as error:
            _wds_split(root, split, info)
        return str(error.value)

    fix = ('name the split, or its shards and size in the split, e.g. --set train_split="train-{0000..0099}.tar|N" '
           '(N: images in them)')
    assert refusal('train', {}) == f"wds/{root} has no split 'train' (it has no _info.json): {fix}"
    assert refusal('train', {'name': 'x'}) == f"wds/{root} has no split 'train' (its _info.json lists no splits): {fix}"
    assert refusal('train', {'splits': ['train']}) == (f"wds/{root} has no split 'train' (its _info.json lists no "
                                                       f"splits): {fix}")  # a list is not timm's {name: split}
    broken = {'splits': {'train': {'name': 'train', 'num_samples': 4, 'filenames': ['train-0000.tar']}}}
    assert refusal('train', broken) == (f"cannot read split 'train' of wds/{root} (KeyError: 'shard_lengths'): check "
                                        'its _info.json or the split pattern NAME-{0000..0099}.tar|N')
    empty = {'splits': {'train': {'name': 'train', 'num_samples': 0, 'filenames': [], 'shard_lengths': []}}}
    assert refusal('train', empty) == f"split 'train' of wds/{root} has no shard files"
    # missing shards of a local folder: the first named, the count of the others (none, one, two)
    for last, more in ((0, ''), (1, ' (and 1 more)'), (2, ' (and 2 more)')):
        assert refusal(f'a-{{0000..000{last}}}.tar|9', {}) == (
            f"shard not found: {os.path.join(root, 'a-0000.tar')}{more}, split 'a-{{0000..000{last}}}.tar|9' of "
            f"wds/{root}: check --data and the split's shard names")
    for name in ('part-0000', 'part-0001'):
        (tmp_path / name).touch()
    assert _wds_split(root, 'part-{0000..0001}|8', {}) == ('part-{0000..0001}|8', [os.path.join(root, 'part-0000'),
                                                                                   os.path.join(root, 'part-0001')], 8)
