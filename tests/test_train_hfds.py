"""``--data hfds/NAME``: a Hugging Face dataset (here a local image folder that the ``datasets`` library reads with its
own ``imagefolder`` builder, offline), map-style like an ImageFolder: its splits, class names, samples named in
messages, and a training run through the CLI with the exact mid-epoch resume map-style data gets."""
import os

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
