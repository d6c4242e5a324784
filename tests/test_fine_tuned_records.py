"""What a fine-tuned model's files say about it (issue 31): the data config it was fine-tuned and validated with
(not its source CNN's timm test size), the class names of its training data, and where its weights came from, in
every file tcnn writes (training checkpoint, T-CNN file, Hub folder) and every model loaded from them.

One short real ``tcnn train`` run: resnet18d from the user's own weights file (``--weights my.pth``), 1 epoch at
32 px on a generated 3-class folder. resnet18d's timm config tests at 288 px, crop 0.95 (``test_input_size``,
``test_crop_pct``, which timm's ``resolve_data_config(use_test_size=True)`` and validate.py use).
"""
import json
import os

import pytest
import timm
import torch
from timm.data import resolve_data_config

import tcnn
import tcnn.export.metadata
from tcnn.files import tcnn_file
from tcnn.cli import main

from imagegen import SHAPES, make_image_folder

SIZE = 32
CLASSES = sorted(SHAPES[:3])  # make_image_folder's class folders, in timm's (sorted) order
SOURCE_TEST_SIZE = (3, 288, 288)
pytestmark = [
    # random weights: the conversion check at the start of the run is vacuous (zero-initialised last BNs), and says so
    pytest.mark.filterwarnings('ignore:the replaced layers do not influence'),
    pytest.mark.usefixtures('one_thread'),  # a tiny model on a shared 2-core machine (conftest.py)
]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """A finished ``tcnn train`` run of resnet18d from a local weights file at 32 px: (data folder, run folder)."""
    root = tmp_path_factory.mktemp('fine_tuned')
    assert tuple(timm.models.get_pretrained_cfg('resnet18d').test_input_size) == SOURCE_TEST_SIZE
    data = make_image_folder(str(root / 'shapes'), num_classes=3, train_per_class=4, val_per_class=2, size=SIZE)
    torch.manual_seed(0)
    weights = root / 'my.pth'
    torch.save(timm.create_model('resnet18d', num_classes=3).state_dict(), weights)
    out = root / 'run'
    assert main(['train', '--data', data, '--output', str(out), '--model', 'resnet18d', '--weights', str(weights),
                 '--epochs', '1', '--batch-size', '4', '--img-size', str(SIZE), '--workers', '0', '--no-progress',
                 '--set', 'warmup_epochs=0', '--set', 'scale_lr=false', '--device', 'cpu']) == 0
    return data, out


def _test_config(model):
    """What timm's validate.py evaluates ``model`` at: (input size, crop)."""
    cfg = resolve_data_config(model=model, use_test_size=True)
    return tuple(cfg['input_size']), cfg['crop_pct']


def _fine_tuned(run):
    """The size and crop the run validated with: its checkpoint's data config."""
    cfg = torch.load(run[1] / 'best.pt', weights_only=True)['model_file']['data_config']
    assert tuple(cfg['input_size']) == (3, SIZE, SIZE)
    return (3, SIZE, SIZE), cfg['crop_pct']


def test_checkpoint_file_and_loaded_models_keep_the_fine_tuned_size(run, tmp_path):
    expected = _fine_tuned(run)
    for name in ('best.pt', 'last.pt'):
        d = torch.load(run[1] / name, weights_only=True)['model_file']
        assert (tuple(d['data_config']['test_input_size']), d['data_config']['test_crop_pct']) == expected
        loaded = tcnn.load(str(run[1] / name))
        assert _test_config(loaded) == expected, name
        assert tcnn.data.config.data_config(loaded, use_test_size=True)['input_size'] == expected[0]
    # a T-CNN file of the trained model, and the model loaded from it; timm's own loader of such a file
    path = tcnn.save(tcnn.load(str(run[1] / 'best.pt')), str(tmp_path / 'fine_tuned.safetensors'))
    assert _test_config(tcnn.load(path)) == expected
    by_timm = timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=path))
    assert _test_config(by_timm) == expected
    stored = json.loads(tcnn.export.metadata.metadata_json(tcnn.load(path)))['data_config']
    assert stored['input_size'] == list(expected[0])


def test_published_folder_keeps_the_fine_tuned_size(run, tmp_path):
    expected = _fine_tuned(run)
    out = tmp_path / 'published'
    assert main(['publish', str(run[1]), '--out', str(out)]) == 0
    cfg = json.load(open(out / 'config.json'))['pretrained_cfg']
    assert (tuple(cfg['test_input_size']), cfg['test_crop_pct']) == expected
    assert _test_config(timm.create_model(f'local-dir:{out}', pretrained=True)) == expected
    assert _test_config(tcnn.load(str(out))) == expected
    assert 'Image size:** 32x32 (crop' in (out / 'README.md').read_text()
    assert 'tested at' not in (out / 'README.md').read_text()


def test_eval_runs_at_the_fine_tuned_size(run, tmp_path, capsys):
    expected = _fine_tuned(run)
    res = tmp_path / 'res.json'
    assert main(['eval', str(run[1] / 'best.pt'), '--suite', 'imagenet', '--data', os.path.join(run[0], 'val'),
                 '--workers', '0', '--no-progress', '--out', str(res)]) == 0
    result = json.loads(res.read_text())['suites']['imagenet']['results']['best']
    assert (result['img_size'], result['crop_pct']) == (SIZE, expected[1])
    assert f'{SIZE} px' in capsys.readouterr().out


def test_checkpoint_of_tcnn_0_3_stops_inheriting_the_source_test_size(run, tmp_path):
    """tcnn 0.3 stored no test size: a training checkpoint's data config is its run's, so it is the test size too;
    a converted file of tcnn 0.3 (not fine-tuned) keeps its source's test size."""
    ckpt = torch.load(run[1] / 'best.pt', weights_only=True)
    d = ckpt['model_file']
    for key in ('test_input_size', 'test_crop_pct'):
        d['data_config'].pop(key, None)
    d.pop('label_names', None)
    old = tmp_path / 'best.pt'
    torch.save(dict(ckpt, model_file=dict(d, tcnn_version='0.3.1')), old)
    assert _test_config(tcnn.load(str(old))) == _fine_tuned(run)
    converted = tmp_path / 'converted.pt'
    torch.save(dict(d, tcnn_version='0.3.1'), converted)  # the same dict as a T-CNN file: no training record
    assert _test_config(tcnn.load(str(converted))) == (SOURCE_TEST_SIZE, 0.95)


def test_class_names_travel_with_the_model(run, tmp_path, capsys):
    d = torch.load(run[1] / 'best.pt', weights_only=True)['model_file']
    assert d['label_names'] == CLASSES  # the training folder's class order
    loaded = tcnn.load(str(run[1] / 'best.pt'))
    assert list(loaded.pretrained_cfg['label_names']) == CLASSES
    assert tcnn_file.read(tcnn.save(loaded, str(tmp_path / 'again.pt')))['label_names'] == CLASSES
    out = tmp_path / 'published'
    assert main(['publish', str(run[1]), '--out', str(out)]) == 0
    config = json.load(open(out / 'config.json'))
    assert config['label_names'] == CLASSES  # timm's field, read into pretrained_cfg by its Hub loader
    by_timm = timm.create_model(f'local-dir:{out}', pretrained=True)
    assert list(by_timm.pretrained_cfg['label_names']) == CLASSES
    assert timm.data.infer_imagenet_subset(by_timm) is None  # 3 classes: not taken for ImageNet's
    assert 'Classes:** 3: `circle`, `square`, `triangle`' in (out / 'README.md').read_text()
    capsys.readouterr()
    assert main(['info', str(run[1] / 'best.pt')]) == 0
    assert '  classes     circle, square, triangle' in capsys.readouterr().out
    # files without names stay valid; names that do not fit the head are refused in one line
    del d['label_names']
    torch.save(d, tmp_path / 'nameless.pt')
    assert 'label_names' not in tcnn.load(str(tmp_path / 'nameless.pt')).pretrained_cfg
    torch.save(dict(d, label_names=['a', 'b']), tmp_path / 'bad.pt')
    with pytest.raises(tcnn.TcnnError, match='label_names has 2 names for 3 classes'):
        tcnn.load(str(tmp_path / 'bad.pt'))
    with pytest.raises(tcnn.TcnnError, match='has 2 names for 3 classes'):
        tcnn.save(loaded, str(tmp_path / 'x.pt'), label_names=['a', 'b'])


def test_records_of_a_model_from_the_users_file(run, tmp_path, capsys):
    """No borrowed tag, license or notes; epochs counted from 1 in config.json, card, console and tcnn info."""
    out = tmp_path / 'published'
    capsys.readouterr()
    assert main(['publish', str(run[1]), '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    config = json.load(open(out / 'config.json'))
    card = (out / 'README.md').read_text()
    assert config['tcnn']['source']['weights'] == 'file:my.pth'
    assert not {'tag', 'license', 'origin_url'} & set(config['pretrained_cfg'])
    assert 'ra2_in1k' not in json.dumps(config) + card and 'apache' not in card
    assert 'license: unknown' in card and 'a local checkpoint, `my.pth`' in card
    assert 'the local file my.pth' in config['pretrained_cfg']['notes'][0]
    loaded = tcnn.load(str(run[1] / 'best.pt'))
    assert 'tag' not in loaded.pretrained_cfg and 'license' not in loaded.pretrained_cfg
    epoch = torch.load(run[1] / 'best.pt', weights_only=True)['epoch']
    assert epoch == 0 and config['tcnn']['training']['epochs_completed'] == 1
    assert 'after epoch 1.' in card and 'training    epoch 1' in printed
    assert main(['info', str(run[1] / 'best.pt')]) == 0
    assert 'training    after epoch 1,' in capsys.readouterr().out
