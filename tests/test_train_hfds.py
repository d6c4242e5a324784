"""``--data hfds/NAME``: a Hugging Face dataset (here a local image folder that the ``datasets`` library reads with its
own ``imagefolder`` builder, offline), map-style like an ImageFolder: its splits, class names, samples named in
messages, and a training run through the CLI with the exact mid-epoch resume map-style data gets. The same folder
streams as ``hfids/NAME`` with the split sizes its builder recorded or ``SPLIT|N`` gives; a parquet dataset with bare integer labels
needs ``num_classes``."""
import os

import numpy as np
import pytest
import torch

from tcnn.cli import main
from tcnn.data.folders import BadImageError
from tcnn.data.readers import ReaderDataset, open_reader_datasets
from tcnn.errors import TcnnError
from tcnn.train import launch
from tcnn.train.distributed import EXIT_PREEMPTED

from imagegen import make_image_folder
from test_train import assert_same_weights, load, metrics, same_numbers
from test_train_reliability import _stop_after

pytest.importorskip('datasets', reason='the datasets package is not installed (pip install "tcnn[hfds]")')


@pytest.fixture(scope='module')
def hf_folder(tmp_path_factory):
    """A local dataset folder (train/ and val/ of 3 classes) and a cache of its own, offline."""
    root = tmp_path_factory.mktemp('hfds')
    mp = pytest.MonkeyPatch()
    mp.setenv('HF_DATASETS_OFFLINE', '1')
    mp.setenv('HF_DATASETS_CACHE', str(root / 'cache'))
    yield make_image_folder(str(root / 'data'), num_classes=3, train_per_class=6, val_per_class=2, size=32)
    mp.undo()


def test_a_local_hugging_face_dataset_opens_map_style_with_its_class_names_and_splits(hf_folder):
    spec = f'hfds/{hf_folder}'
    train, val, known = open_reader_datasets(spec, 'train', 'val', num_classes=None, batch_size=4, seed=0)
    assert isinstance(train, ReaderDataset) and isinstance(val, ReaderDataset) and known == 3
    assert (len(train), len(val)) == (18, 6) and val.split == 'validation'  # 'val' found as the dataset's name
    assert train.class_to_idx == val.class_to_idx == {'circle': 0, 'square': 1, 'triangle': 2}
    assert train.splits == ['train', 'validation'] and train.filename(5) == f'{spec}[train]#5'
    name, payload, size, label = train.read_encoded(7)
    assert name == f'{spec}[train]#7' and size == (32, 32) and label == 1
    assert payload.dtype == torch.uint8 and payload.shape == (3, 32, 32)  # PNG: decoded by Pillow in the worker
    assert (train.skip_bad_images, train.augment_seed, train.epoch, train.transform) == (False, None, 0, None)
    assert val.filename(1) == f'{spec}[validation]#1' and not val.skip_bad_images  # named as --data gives it
    skipping = open_reader_datasets(spec, 'train', 'val', num_classes=None, batch_size=4, seed=0, skip_bad_images=True)
    assert skipping[0].skip_bad_images and skipping[1].skip_bad_images


def test_a_split_the_hugging_face_dataset_lacks_is_one_line_naming_it(hf_folder):
    with pytest.raises(TcnnError) as info:
        ReaderDataset(f'hfds/{hf_folder}', hf_folder, 'test')
    message = str(info.value)  # the datasets library's own error, named by its type, on one line
    assert message.startswith(f"cannot open split 'test' of hfds/{hf_folder} (ValueError: ") and message.endswith(')')
    assert '"test"' in message and '\n' not in message


def test_a_hugging_face_split_takes_a_class_map_a_transform_and_the_bad_image_policy(hf_folder):
    spec = f'hfds/{hf_folder}'
    mapped = ReaderDataset(spec, hf_folder, 'train', class_map={'circle': 2, 'square': 0, 'triangle': 1})
    assert mapped.class_to_idx == {'circle': 2, 'square': 0, 'triangle': 1}
    assert [mapped.read_encoded(i)[3] for i in (0, 6, 12)] == [2, 0, 1]
    transform = lambda img: img.size  # noqa: E731
    skipping = ReaderDataset(spec, hf_folder, 'train', skip_bad_images=True, transform=transform)
    assert skipping.transform is transform and skipping[0] == ((32, 32), 0)
    skipping.report_bad(f'{spec}[train]#3')
    skipping.report_bad(f'{spec}[train]#3')
    assert skipping.bad_images() == [f'{spec}[train]#3']  # each once
    strict = ReaderDataset(spec, hf_folder, 'train')
    assert strict.skip_bad_images is False and strict.transform is None
    with pytest.raises(BadImageError) as info:
        strict.report_bad(f'{spec}[train]#3')
    assert str(info.value).startswith(f'cannot decode image {spec}[train]#3: ')


def _args(data: str, output, epochs: int = 2):
    return ['--data', data, '--output', str(output), '--model', 'resnet10t', '--no-pretrained', '--epochs', str(epochs),
            '--batch-size', '4', '--img-size', '32', '--workers', '0', '--no-progress', '--lr', '1e-3', '--set',
            f'warmup_epochs={epochs - 1}', '--set', 'scale_lr=false', '--device', 'cpu', '--set', 'data_pipeline=pil']


def test_hfds_trains_through_the_cli_and_resumes_exactly_in_the_middle_of_an_epoch(hf_folder, tmp_path, monkeypatch,
                                                                                  capsys):
    spec = f'hfds/{hf_folder}'
    straight = tmp_path / 'straight'
    assert main(['train', *_args(spec, straight)]) == 0
    assert '18 train / 6 val images' in capsys.readouterr().out
    assert [r['val_images'] for r in metrics(straight)] == [6, 6]
    run = tmp_path / 'run'
    _stop_after(monkeypatch, 6)  # the second update of the second epoch (4 updates an epoch)
    assert launch.main(_args(spec, run)) == EXIT_PREEMPTED
    last = load(run / 'last.pt')
    assert last['partial']['epoch'] == 1 and last['partial']['positions'][0]['updates'] == 2
    monkeypatch.undo()
    assert launch.main(['--resume', str(run), '--no-progress']) == 0
    assert 'resuming in epoch 2/2 after 2 of 4 updates (update 6)' in capsys.readouterr().out
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
    assert os.path.isfile(run / 'best.pt')


def test_a_hugging_face_dataset_streams_as_hfids_with_the_split_sizes_its_builder_recorded_or_the_split_gives(
        hf_folder, tmp_path):
    fresh = make_image_folder(str(tmp_path / 'fresh'), num_classes=2, train_per_class=2, val_per_class=1, size=16)
    fresh_spec = f'hfids/{fresh}'

    def refusal(train_split, val_split='validation', num_classes=None):
        with pytest.raises(TcnnError) as info:
            open_reader_datasets(fresh_spec, train_split, val_split, num_classes=num_classes, batch_size=4, seed=0)
        return str(info.value)
    # a stream's epoch length must be known before it starts: a builder that never prepared the data has no sizes
    assert refusal('train') == (f"the size of split 'train' of {fresh_spec} is unknown, so the epoch length is too: "
                                'give it in the split, e.g. --set train_split="train|N"')
    assert refusal('train|4') == (f"the size of split 'validation' of {fresh_spec} is unknown, so the epoch length is "
                                  'too: give it in the split, e.g. --set val_split="validation|N"')
    for bad in ('train|0', 'train|x', 'train|'):
        assert refusal(bad) == f'the size in split {bad!r} of {fresh_spec} must be a positive whole number: NAME|N'
    assert refusal('train|1', 'validation|-2') == (f"the size in split 'validation|-2' of {fresh_spec} must be a "
                                                   'positive whole number: NAME|N')  # a split of one sample is one
    assert refusal('train|4', 'validation|2') == f'the classes of {fresh_spec} are unknown: set --set num_classes=N'
    train, val, known = open_reader_datasets(fresh_spec, 'train|4', 'validation|2', num_classes=2, batch_size=4,
                                             seed=0)
    assert known is None and [(s.split, s.num_samples, s.num_classes) for s in (train, val)] == [
        ('train', 4, 2), ('validation', 2, 2)]
    assert sorted(int(label) for _, label in val) == [0, 1]

    open_reader_datasets(f'hfds/{hf_folder}', 'train', 'val', num_classes=None, batch_size=4, seed=0)  # prepares it
    spec = f'hfids/{hf_folder}'
    train, val, known = open_reader_datasets(spec, 'train', 'val', num_classes=None, batch_size=4, seed=0)
    classes = {'circle': 0, 'square': 1, 'triangle': 2}
    assert known == 3 and [(s.spec, s.split, s.num_samples, s.num_classes, s.shards, s.class_to_idx)
                           for s in (train, val)] == [(spec, 'train', 18, 3, 1, classes),
                                                      (spec, 'validation', 6, 3, 1, classes)]
    labels = sorted(int(label) for _, label in val)
    assert labels == [0, 0, 1, 1, 2, 2]  # the whole validation split, once
    _, _, known = open_reader_datasets(spec, 'train', 'validation', num_classes=5, batch_size=4, seed=0)
    assert known == 3  # what the data states, beside what --set num_classes says


def test_a_stream_whose_reader_opens_without_a_size_is_refused_naming_the_fix(hf_folder, monkeypatch):
    """A reader that opens a training split of no stated size (a TFDS builder, another timm's hfids) is refused as
    one that cannot open it; a validation split may have none."""
    from tcnn.data import readers
    open_reader_datasets(f'hfds/{hf_folder}', 'train', 'val', num_classes=None, batch_size=4, seed=0)  # prepares it
    real = readers.create_dataset

    def sizeless(*args, **kwargs):
        dataset = real(*args, **kwargs)
        dataset.reader.num_samples = 0
        return dataset
    monkeypatch.setattr(readers, 'create_dataset', sizeless)
    spec = f'hfids/{hf_folder}'
    with pytest.raises(TcnnError) as info:
        open_reader_datasets(spec, 'train', 'validation', num_classes=None, batch_size=4, seed=0)
    assert str(info.value) == (f"the size of split 'train' of {spec} is unknown, so the epoch length is too: give it "
                               'in the split, e.g. --set train_split="train|N"')
    train, val, _ = open_reader_datasets(spec, 'train|18', 'validation', num_classes=None, batch_size=4, seed=0)
    assert (train.num_samples, val.num_samples) == (18, 0)


def _readers_lacking(hf_folder: str, monkeypatch):
    """``hfids/`` of the prepared folder, whose readers lack the attributes named in the returned dict (is_training ->
    attribute names)."""
    from tcnn.data import readers
    open_reader_datasets(f'hfds/{hf_folder}', 'train', 'val', num_classes=None, batch_size=4, seed=0)  # prepares it
    real = readers.create_dataset
    dropped = {}

    def lacking(*args, **kwargs):
        dataset = real(*args, **kwargs)
        for name in dropped.get(kwargs['is_training'], ()):
            delattr(dataset.reader, name)
        return dataset
    monkeypatch.setattr(readers, 'create_dataset', lacking)
    return f'hfids/{hf_folder}', dropped


def test_a_stream_reader_lacking_a_size_or_class_names_is_refused_or_takes_num_classes_for_both_splits(
        hf_folder, monkeypatch):
    """timm's stream readers differ in what they state of a split: one with no ``num_samples`` at all is a training
    split of unknown size; one with no ``class_to_idx`` needs ``num_classes``."""
    spec, dropped = _readers_lacking(hf_folder, monkeypatch)

    def refusal(num_classes=None):
        with pytest.raises(TcnnError) as info:
            open_reader_datasets(spec, 'train', 'validation', num_classes=num_classes, batch_size=4, seed=0)
        return str(info.value)
    dropped[True] = ['num_samples']
    assert refusal() == (f"the size of split 'train' of {spec} is unknown, so the epoch length is too: give it in the "
                         'split, e.g. --set train_split="train|N"')
    dropped[True] = ['class_to_idx']
    assert refusal() == f'the classes of {spec} are unknown: set --set num_classes=N'
    train, val, known = open_reader_datasets(spec, 'train', 'validation', num_classes=3, batch_size=4, seed=0)
    assert known is None and (train.num_classes, val.num_classes) == (3, 3) and train.class_to_idx == {}


def test_a_streams_validation_labels_are_checked_against_the_training_splits_class_count(hf_folder, monkeypatch):
    """The training split's class count checks the validation split's labels, whatever the validation reader states
    (the model has that many outputs)."""
    spec, dropped = _readers_lacking(hf_folder, monkeypatch)
    dropped[False] = ['class_to_idx']
    train, val, known = open_reader_datasets(spec, 'train', 'validation', num_classes=None, batch_size=4, seed=0)
    assert known == 3 and (train.num_classes, val.num_classes) == (3, 3) and val.class_to_idx == {}


def test_a_stream_that_its_reader_cannot_open_is_one_line_and_tfds_never_asks_the_hugging_face_hub(monkeypatch):
    """A reader's failure to open a split becomes one line naming the split and the reader's error; a TFDS dataset's
    splits are TFDS's own (a user of tfds/ may not have the datasets package at all: it is never imported)."""
    import sys
    from tcnn.data import readers

    def unopenable(name, **kwargs):
        raise RuntimeError(f'no builder for {name} here')
    monkeypatch.setattr(readers, '_check_reader_package', lambda reader, data: None)
    monkeypatch.setattr(readers, 'create_dataset', unopenable)
    monkeypatch.setitem(sys.modules, 'datasets', None)  # import datasets fails
    with pytest.raises(TcnnError) as info:
        open_reader_datasets('tfds/imagenet2012', 'train|10', 'validation', num_classes=None, batch_size=4, seed=0)
    assert str(info.value) == ("cannot open split 'train' of tfds/imagenet2012 (RuntimeError: no builder for "
                               'tfds/imagenet2012 here)')


def _parquet_split(path: str, labels) -> None:
    import datasets
    from imagegen import SHAPES, draw_shape
    rng = np.random.default_rng(0)
    images = [draw_shape(SHAPES[label], 16, rng) for label in labels]
    features = datasets.Features({'image': datasets.Image(), 'label': datasets.Value('int64')})
    datasets.Dataset.from_dict({'image': images, 'label': list(labels)}, features=features).to_parquet(path)


def test_a_hugging_face_dataset_with_bare_integer_labels_needs_num_classes(tmp_path):
    os.makedirs(tmp_path / 'data')
    _parquet_split(str(tmp_path / 'data' / 'train-00000-of-00001.parquet'), [0, 1, 2, 0, 1, 2])
    _parquet_split(str(tmp_path / 'data' / 'validation-00000-of-00001.parquet'), [2, 1, 0])
    spec = f'hfds/{tmp_path}'
    with pytest.raises(TcnnError) as info:
        open_reader_datasets(spec, 'train', 'validation', num_classes=None, batch_size=4, seed=0)
    assert str(info.value) == f'{spec} does not name its classes: set --set num_classes=N'
    train, val, known = open_reader_datasets(spec, 'train', 'validation', num_classes=3, batch_size=4, seed=0)
    assert known is None and train.class_to_idx == val.class_to_idx == {}
    assert (len(train), len(val)) == (6, 3) and [val.read_encoded(i)[3] for i in range(3)] == [2, 1, 0]
