"""tcnn.files.tcnn_file: the T-CNN file format (save / load / model_to_dict / model_from_dict / read)."""
import argparse
import copy
import json
import os
import re
import struct

import pytest
import timm
import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file

import tcnn
from tcnn.files import tcnn_file
from tcnn.files import run_folder
from tcnn.errors import TcnnError
from tcnn.files.sources import create_cnn

from helpers import images, write_partial


@pytest.fixture(scope='module')
def t_model() -> nn.Module:
    """A converted resnet18d with non-default settings whose GPSA parameters moved away from their init."""
    torch.manual_seed(0)
    cnn = create_cnn('resnet18d', pretrained=False, num_classes=10, zero_init_last=False, drop_path_rate=0.05)
    model = tcnn.reparameterize(cnn, stages=[3, 4], qk_dim=16, gating_init=0.5, verify=False).eval()
    with torch.no_grad():  # as after fine-tuning: per-head gates, moved centres, other localities
        for _, layer in tcnn.gpsa_layers(model):
            layer.gating.uniform_(-2, 2)
            layer.pos_centers.add_(0.3 * torch.randn_like(layer.pos_centers))
            layer.pos_locality.uniform_(0.2, 3)
    return model


def _plain_types(value, path='') -> None:
    """Everything outside the state_dict is JSON-compatible Python."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), path
            _plain_types(v, f'{path}.{k}')
    elif isinstance(value, list):
        for v in value:
            _plain_types(v, path)
    else:
        assert value is None or isinstance(value, (bool, int, float, str)), (path, type(value))


@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_round_trip_identical_outputs(t_model, tmp_path, ext):
    path = str(tmp_path / f'model{ext}')
    assert tcnn.save(t_model, path) == path
    loaded = tcnn.load(path)
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(images()), t_model(images()))
    assert [(n, m.qk_dim) for n, m in tcnn.gpsa_layers(loaded)] == [(n, 16) for n, _ in tcnn.gpsa_layers(t_model)]
    assert loaded.tcnn_config == t_model.tcnn_config
    assert tcnn.gpsa_summary(loaded) == tcnn.gpsa_summary(t_model)
    # timm's tooling on the loaded model sees the saved data config
    assert timm.data.resolve_data_config(model=loaded) == timm.data.resolve_data_config(model=t_model)
    assert os.listdir(tmp_path) == [f'model{ext}']  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # not the 0600 of the temporary file


def test_version_1_file_with_2d_filters_loads(t_model, tmp_path):
    # tcnn 0.1.0 wrote format version 1, with each GPSA filter as conv.weight.reshape(C_out, -1) ([c][h] order).
    d = tcnn_file.model_to_dict(t_model)
    old = {}
    for k, v in d['state_dict'].items():
        if k.endswith('proj_weight'):
            v = v.transpose(1, 2).reshape(v.shape[0], -1)  # (C_out, N_h, C_in) -> (C_out, C_in * N_h)
        old[k] = v
    path = tmp_path / 'v1.pt'
    torch.save(dict(d, version=1, state_dict=old), path)
    loaded = tcnn.load(str(path)).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), t_model(x))


def test_pt_file_is_a_plain_dict(t_model, tmp_path):
    path = tmp_path / 'model.pt'
    tcnn.save(t_model, str(path))
    d = torch.load(path, weights_only=True)
    state_dict = d.pop('state_dict')
    # no grouped GPSA layers: format version 2, which tcnn 0.2 reads too
    assert d['format'] == 'tcnn' and d['version'] == tcnn_file.PLAIN_FORMAT_VERSION == 2
    assert d['source'] == {'model': 'resnet18d', 'kwargs': {'zero_init_last': False, 'drop_path_rate': 0.05},
                           'weights': 'random'}
    assert d['conversion']['stages'] == ['layer3', 'layer4'] and d['conversion']['qk_dim'] == 16
    assert d['conversion']['gating_init'] == 0.5 and d['num_classes'] == 10
    assert d['data_config']['input_size'] == [3, 224, 224] and len(d['data_config']['mean']) == 3
    _plain_types(d)
    json.dumps(d)
    assert set(state_dict) == set(t_model.state_dict())
    assert all(isinstance(v, torch.Tensor) for v in state_dict.values())


def test_safetensors_holds_the_same_settings(t_model, tmp_path):
    tcnn.save(t_model, str(tmp_path / 'model.pt'))
    tcnn.save(t_model, str(tmp_path / 'model.safetensors'))
    d = torch.load(tmp_path / 'model.pt', weights_only=True)
    with safe_open(str(tmp_path / 'model.safetensors'), framework='pt') as f:
        settings = json.loads(f.metadata()['tcnn'])
        assert set(f.keys()) == set(d['state_dict'])
    assert settings == {k: v for k, v in d.items() if k != 'state_dict'}


def test_model_from_dict_is_the_inverse(t_model):
    d = tcnn_file.model_to_dict(t_model, data_config={'input_size': (3, 160, 160), 'crop_pct': 1.0})
    model = tcnn_file.model_from_dict(d)
    with torch.no_grad():
        assert torch.equal(model(images()), t_model(images()))
    assert model.pretrained_cfg['input_size'] == (3, 160, 160) and model.pretrained_cfg['crop_pct'] == 1.0
    assert tcnn_file.model_to_dict(nn.DataParallel(t_model))['source'] == d['source']  # wrappers are unwrapped


def test_plain_cnn_round_trip(tmp_path):
    """The no-SA baseline (an unconverted CNN) is saved and loaded the same way."""
    torch.manual_seed(0)
    cnn = create_cnn('resnet18d', pretrained=False, num_classes=4).eval()
    path = str(tmp_path / 'cnn.pt')
    tcnn.save(cnn, path)
    assert torch.load(path, weights_only=True)['conversion'] is None
    loaded = tcnn.load(path)
    assert not tcnn.gpsa_layers(loaded)
    with torch.no_grad():
        assert torch.equal(loaded(images()), cnn(images()))


def test_registry_and_timm_models_round_trip(tmp_path):
    """t_* models record their source; plain timm models are described by timm's own records."""
    torch.manual_seed(0)
    registry = timm.create_model('t_resnet18d.ra4_e3600_r224_in1k', num_classes=3, drop_path_rate=0.1).eval()
    timm_model = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=5, drop_rate=0.2), verify=False)
    for name, model in (('registry', registry), ('timm', timm_model.eval())):
        path = str(tmp_path / f'{name}.safetensors')
        tcnn.save(model, path)
        loaded = tcnn.load(path)
        with torch.no_grad():
            assert torch.equal(loaded(images()), model(images()))
        assert loaded.num_classes == model.num_classes
    assert tcnn_file.read(str(tmp_path / 'registry.safetensors'))['source'] == \
        {'model': 'resnet18d.ra4_e3600_r224_in1k', 'kwargs': {'drop_path_rate': 0.1}, 'weights': 'random'}
    default_tag = timm.models.get_pretrained_cfg('resnet18d').tag
    assert tcnn_file.read(str(tmp_path / 'timm.safetensors'))['source'] == {'model': f'resnet18d.{default_tag}',
                                                                      'kwargs': {'drop_rate': 0.2}, 'weights': None}


def test_torchvision_round_trip(tmp_path):
    torch.manual_seed(0)
    model = tcnn.reparameterize(create_cnn('torchvision:resnet18', pretrained=False, num_classes=5),
                                verify=False).eval()
    path = str(tmp_path / 'tv.pt')
    tcnn.save(model, path)
    d = tcnn_file.read(path)
    assert d['source']['model'] == 'torchvision:resnet18'
    # the eval transform of torchvision's weights (bilinear), not timm's generic default (bicubic)
    assert d['data_config']['interpolation'] == 'bilinear' and d['data_config']['input_size'] == [3, 224, 224]
    loaded = tcnn.load(path)
    assert type(loaded).__module__.startswith('torchvision')
    with torch.no_grad():
        assert torch.equal(loaded(images()), model(images()))


def test_training_checkpoint(t_model, tmp_path):
    """OUTPUT/last.pt of tcnn train: the model is under 'model_file'."""
    path = tmp_path / 'last.pt'
    torch.save({'model_file': tcnn_file.model_to_dict(t_model), 'ema': None, 'optimizer': {'state': {}},
                'scheduler': {}, 'scaler': None, 'epoch': 4, 'rng': {}, 'config': {'lr': 1e-4}, 'best_top1': 51.5},
               path)
    loaded = tcnn.load(str(path))
    with torch.no_grad():
        assert torch.equal(loaded(images()), t_model(images()))
    assert tcnn_file.read(str(path))['training'] == {'epoch': 4, 'best_top1': 51.5}
    assert tcnn_file.read(str(path))['recipe'] == {'lr': 1e-4}  # the run's recipe, for tcnn publish's model card


@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_verified_report_and_weights_origin_round_trip(tmp_path, ext):
    """The conversion's verified report and where the CNN's weights came from travel with the file (a model card
    states both)."""
    torch.manual_seed(0)
    cnn = timm.create_model('resnet10t', num_classes=4, zero_init_last=False)
    weights = tmp_path / 'cnn.pth'
    torch.save(cnn.state_dict(), weights)
    model = tcnn.reparameterize(create_cnn('resnet10t', weights=str(weights), num_classes=4), input_size=(3, 64, 64))
    path = str(tmp_path / f'model{ext}')
    tcnn.save(model, path)
    loaded = tcnn.load(path)
    assert loaded.tcnn_report == model.tcnn_report and loaded.tcnn_report.max_rel_err < 1e-5
    assert loaded.tcnn_source['weights'] == 'file:cnn.pth'
    again = str(tmp_path / f'again{ext}')
    tcnn.save(loaded, again)  # and on to the next file
    assert tcnn.load(again).tcnn_report == model.tcnn_report


def test_atomic_save_leaves_no_partial_file(t_model, tmp_path, monkeypatch):
    path = tmp_path / 'model.pt'
    path.write_bytes(b'previous file')

    def failing_save(obj, f, *args, **kwargs):
        write_partial(f, b'partial')
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(TcnnError, match='No space left'):
        tcnn.save(t_model, str(path))
    assert path.read_bytes() == b'previous file' and os.listdir(tmp_path) == ['model.pt']
    with pytest.raises(TcnnError, match='No space left'):
        tcnn.save(t_model, str(tmp_path / 'new.pt'))
    assert os.listdir(tmp_path) == ['model.pt']


def test_save_rejects_what_it_cannot_store(t_model, tmp_path):
    with pytest.raises(TcnnError, match=r'\.safetensors'):
        tcnn.save(t_model, str(tmp_path / 'model.bin'))
    weird = copy.deepcopy(t_model)
    weird.tcnn_source = dict(weird.tcnn_source, kwargs={'act_layer': nn.ReLU})
    with pytest.raises(TcnnError, match='act_layer'):
        tcnn.save(weird, str(tmp_path / 'weird.pt'))
    with pytest.raises(TcnnError, match='features_only'):
        tcnn.save(timm.create_model('t_resnet18d', features_only=True), str(tmp_path / 'features.pt'))
    assert os.listdir(tmp_path) == []


def _write(path, kind: str, t_model: nn.Module) -> str:
    """Files that are not loadable T-CNN files."""
    good = tcnn_file.model_to_dict(t_model)
    if kind == 'junk':
        path.write_bytes(os.urandom(4096))
    elif kind == 'empty':
        path.write_bytes(b'')
    elif kind in ('truncated', 'truncated_safetensors'):
        full = path.with_name('full' + path.suffix)
        tcnn.save(t_model, str(full))
        path.write_bytes(full.read_bytes()[:full.stat().st_size // 2])
    elif kind == 'state_dict':
        torch.save(good['state_dict'], path)
    elif kind == 'state_dict_safetensors':
        save_file({k: v.contiguous() for k, v in good['state_dict'].items()}, str(path))
    elif kind == 'pickled_object':
        # a class of the user's (timm train.py's argparse.Namespace is allowed: tests/test_integrity.py)
        torch.save({'args': argparse.Action(['--lr'], 'lr'), 'state_dict': good['state_dict']}, path)
    elif kind == 'other_format':
        torch.save(dict(good, format='something-else'), path)
    elif kind == 'future_version':
        torch.save(dict(good, version=tcnn_file.FORMAT_VERSION + 1), path)
    elif kind == 'missing_weight':
        torch.save(dict(good, state_dict={k: v for k, v in list(good['state_dict'].items())[1:]}), path)
    return str(path)


@pytest.mark.parametrize('kind, suffix, message', [
    ('junk', '.pt', 'not a T-CNN file'),
    ('empty', '.pt', 'is empty \\(0 bytes\\)'),
    ('truncated', '.pt', 'truncated or corrupt'),
    ('truncated_safetensors', '.safetensors', r'bad.safetensors is truncated \(\d+ of its \d+ bytes\): re-download'),
    ('state_dict', '.pt', r'state dict of a T-CNN \(8 GPSA layers\).*`tcnn convert t_MODEL --weights .*bad.pt --out'),
    ('state_dict_safetensors', '.safetensors', 'without T-CNN settings.*tcnn convert'),
    ('pickled_object', '.pt', 'pickled Python objects'),
    ('other_format', '.pt', "not a T-CNN file \\(format 'something-else'"),
    ('future_version', '.pt', 'format version 4.*upgrade tcnn'),
    ('missing_weight', '.pt', 'missing 1'),
])
def test_load_rejects_bad_files_clearly(t_model, tmp_path, kind, suffix, message):
    path = _write(tmp_path / f'bad{suffix}', kind, t_model)
    with pytest.raises(TcnnError, match=message):
        tcnn.load(path)


def test_load_missing_path_and_folder(tmp_path):
    with pytest.raises(TcnnError, match='not found'):
        tcnn.load(str(tmp_path / 'nope.pt'))
    with pytest.raises(TcnnError, match='folder'):
        tcnn.load(str(tmp_path))


def test_training_checkpoint_ema_weights(t_model, tmp_path):
    """A tcnn train checkpoint keeps the EMA under 'ema': load(ema=True) rebuilds the model with those weights;
    a file without EMA weights is a one-line error, never the raw weights in their place."""
    ema = copy.deepcopy(t_model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = str(tmp_path / 'last.pt')
    checkpoint = run_folder.make_checkpoint(t_model, ema=ema.state_dict(), epoch=3, best_top1=40.0)
    run_folder.write_checkpoint(checkpoint, path)
    with torch.no_grad():
        assert torch.equal(tcnn.load(path)(images()), t_model(images()))
        assert torch.equal(tcnn.load(path, ema=True)(images()), ema(images()))
    assert tcnn_file.read(path, ema=True)['training'] == {'epoch': 3, 'best_top1': 40.0, 'weights': 'ema'}
    assert tcnn_file.read(path)['training'] == {'epoch': 3, 'best_top1': 40.0}
    no_ema = str(tmp_path / 'no_ema.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(t_model, ema=None, epoch=3), no_ema)
    model_file = tcnn.save(t_model, str(tmp_path / 't.safetensors'))
    for where, message in ((no_ema, 'holds no EMA weights (its run did not use --model-ema)'),
                           (model_file, 'is a T-CNN file, which holds no EMA weights')):
        with pytest.raises(TcnnError, match=re.escape(message)) as info:
            tcnn.load(where, ema=True)
        assert '\n' not in str(info.value)


def test_ema_flags_of_info_inspect_and_eval(t_model, tmp_path, capsys):
    """tcnn info / inspect / eval --use-ema read the checkpoint's EMA weights (eval: scores only the EMA can give)."""
    from tcnn.cli import main
    raw, ema = copy.deepcopy(t_model), copy.deepcopy(t_model)
    with torch.no_grad():
        for _, layer in tcnn.gpsa_layers(ema):
            layer.gating.fill_(-3.0)  # gate sigmoid(-3) = 0.047 in every head
        for model, cls in ((raw, 1), (ema, 0)):  # a head that always predicts class `cls`
            model.fc.weight.zero_()
            model.fc.bias.copy_(torch.nn.functional.one_hot(torch.tensor(cls), 10).float())
    path = str(tmp_path / 'best.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(raw, ema=ema.state_dict(), epoch=2), path)
    assert main(['info', path, '--use-ema']) == 0
    out = capsys.readouterr().out
    assert '0.047 [0.047-0.047]' in out and 'weights ema' in out
    assert main(['info', path]) == 0 and '0.047 [0.047-0.047]' not in capsys.readouterr().out
    assert main(['inspect', path, '--use-ema', '--out', str(tmp_path / 'inspect')]) == 0
    summary = json.loads((tmp_path / 'inspect' / 'summary.json').read_text())
    assert summary['weights'] == 'ema'
    assert all(g == pytest.approx(0.0474, abs=1e-4) for layer in summary['layers'].values() for g in layer['gate'])
    capsys.readouterr()
    from PIL import Image
    for k, cls in enumerate('abcdefghij'):  # the model's 10 classes: 3 images of class a, 1 of each other class
        os.makedirs(tmp_path / 'val' / cls)
        for i in range(3 if cls == 'a' else 1):
            Image.new('RGB', (8, 8), (40 * k, 90, 20 * i)).save(tmp_path / 'val' / cls / f'{i}.png')
    scores = {}
    for flags in (['--use-ema'], []):
        out_json = tmp_path / f'res{len(flags)}.json'
        rc = main(['eval', path, *flags, '--suite', 'imagenet', '--data', str(tmp_path / 'val'), '--img-size', '32',
                   '--workers', '0', '--no-progress', '--out', str(out_json)])
        result = json.loads(out_json.read_text())
        assert rc == 0 and result['models']['best'].get('weights') == ('ema' if flags else None)
        (scores[len(flags)],) = result['suites']['imagenet']['results'].values()
    assert scores[1]['top1'] == pytest.approx(100 * 3 / 12)  # the EMA's head: always class a
    assert scores[0]['top1'] == pytest.approx(100 * 1 / 12)  # the model's head: always class b
    capsys.readouterr()
    raw_file = tcnn.save(t_model, str(tmp_path / 't.pt'))
    for argv in (['info', raw_file, '--use-ema'], ['inspect', raw_file, '--use-ema', '--out', str(tmp_path / 'x')],
                 ['eval', 'resnet18d', '--use-ema', '--suite', 'imagenet', '--data', str(tmp_path / 'val')]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and 'EMA weights' in err[0], err


# ---------------------------------------------------------------- save's arguments (issue 47, mutmut's sample)

@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_save_stores_the_given_data_config_and_label_names(t_model, tmp_path, ext):
    """What ``save`` is given reaches the file, read back by ``tcnn.load``: an overridden crop and the class names."""
    names = [f'class {i}' for i in range(10)]
    path = tcnn.save(t_model, str(tmp_path / f'm{ext}'), data_config={'crop_pct': 0.8125}, label_names=names)
    d = tcnn_file.read(path)
    assert d['data_config']['crop_pct'] == d['data_config']['test_crop_pct'] == 0.8125
    assert d['label_names'] == names


def test_save_names_its_arguments(t_model, tmp_path):
    for call, message in (
            (lambda: tcnn.save(None, str(tmp_path / 'm.pt')), 'model must be a torch.nn.Module, got None'),
            (lambda: tcnn.save(t_model, str(tmp_path / 'm.pt'), data_config=[1]),
             'data_config must be a dict or None, got list')):
        with pytest.raises(TcnnError) as e:
            call()
        assert str(e.value) == message
    folder = tmp_path / 'folder.pt'
    folder.mkdir()
    with pytest.raises(TcnnError) as e:
        tcnn.save(t_model, str(folder))
    assert str(e.value) == f'path {folder} is a folder; give a file name'
    assert os.listdir(tmp_path) == ['folder.pt']


# ---------------------------------------------------------------- tcnn_file's survivors (issue 47, mutmut's campaign)

def test_class_names_are_checked_when_saved_and_when_loaded(t_model, tmp_path):
    """``label_names`` is a list (or tuple) of strings, one for each of the model's 10 classes: anything else is a
    one-line error, from ``save`` (nothing written) and from a file that holds them (its path named)."""
    path = str(tmp_path / 'm.pt')
    for names, message in ((['a'] * 9 + [1], 'label_names must be a list of class names (strings), got list'),
                           ('abcdefghij', 'label_names must be a list of class names (strings), got str'),
                           (['a', 'b', 'c'], 'label_names has 3 names for 10 classes')):
        with pytest.raises(TcnnError) as e:
            tcnn.save(t_model, path, label_names=names)
        assert str(e.value) == message
    assert os.listdir(tmp_path) == []
    torch.save(dict(tcnn_file.model_to_dict(t_model), label_names=['a', 'b', 'c']), path)
    with pytest.raises(TcnnError) as e:
        tcnn.load(path)
    assert str(e.value) == f'{path}: label_names has 3 names for 10 classes'


def test_a_safetensors_file_that_safetensors_refuses_is_corrupt_with_its_reason(tmp_path):
    """A layout that holds (8-byte header length, JSON header, the bytes its offsets name) around a tensor whose
    shape needs more bytes than its offsets give: safetensors refuses it, and the message gives safetensors' own
    reason, its exception's name first."""
    header = json.dumps({'w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 4]}}).encode()
    path = tmp_path / 'bad.safetensors'
    path.write_bytes(struct.pack('<Q', len(header)) + header + bytes(4))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(str(path))
    assert str(e.value).startswith(f'{path} is corrupt (not a valid safetensors file: SafetensorError: ')
    assert str(e.value).endswith('): re-download or re-save it')


def test_a_dense_model_without_its_builder_is_told_one_that_builds_its_class():
    """A torchvision detection or segmentation model that does not record its builder (no ``tcnn_source``, built
    from torchvision's classes or by another builder): the one-line error gives, as an example, a torchvision builder
    (by its registered name) that builds the model's own class; for a class no builder makes (torchvision's
    ``GeneralizedRCNN``), a detection builder. Built on the meta device: nothing is computed."""
    import torchvision
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN

    def example(model):
        with pytest.raises(TcnnError) as e:
            tcnn_file.model_to_dict(model)
        assert '\n' not in str(e.value)
        found = re.search(r'cannot tell which torchvision builder made this (\w+): .*; NAME e\.g\. (\w+)\)$',
                          str(e.value))
        assert found and found.group(1) == type(model).__name__, str(e.value)
        return found.group(2)

    detection = torchvision.models.list_models(torchvision.models.detection)
    registered = torchvision.models.list_models()
    # builders other than the examples where torchvision has them: the example must build the class, not echo it
    for builder in ('fasterrcnn_mobilenet_v3_large_fpn', 'maskrcnn_resnet50_fpn_v2', 'keypointrcnn_resnet50_fpn',
                    'retinanet_resnet50_fpn_v2', 'fcos_resnet50_fpn', 'fcn_resnet101', 'deeplabv3_mobilenet_v3_large',
                    'lraspp_mobilenet_v3_large', 'ssdlite320_mobilenet_v3_large'):
        with torch.device('meta'):
            model = torchvision.models.get_model(builder, weights=None, weights_backbone=None)
            name = example(model)
            assert name in registered, name
            assert type(torchvision.models.get_model(name, weights=None, weights_backbone=None)) is type(model)
    with torch.device('meta'):
        model = torchvision.models.get_model('fasterrcnn_mobilenet_v3_large_fpn', weights=None, weights_backbone=None)
    model.__class__ = GeneralizedRCNN  # FasterRCNN's base class, which no builder returns
    assert example(model) in detection


def test_a_report_without_its_sensitivity_reads_as_not_measured(t_model, tmp_path):
    """The report of a file written before conversions measured their sensitivity has none: it reads as not
    measured (NaN), the report's other values as the file holds them."""
    report = {'max_abs_err': 1e-6, 'max_rel_err': 2e-7, 'init_max_abs_err': 0.5, 'init_max_rel_err': 0.25,
              'input_size': [3, 64, 64], 'batch_size': 2, 'dtype': 'float32', 'num_gpsa': 8}
    path = str(tmp_path / 'm.pt')
    torch.save(dict(tcnn_file.model_to_dict(t_model), report=report), path)
    loaded = tcnn.load(path).tcnn_report
    assert isinstance(loaded.sensitivity, float) and loaded.sensitivity != loaded.sensitivity  # NaN
    assert (loaded.max_abs_err, loaded.max_rel_err, loaded.init_max_abs_err, loaded.init_max_rel_err,
            loaded.input_size, loaded.batch_size, loaded.dtype, loaded.num_gpsa) == \
        (1e-6, 2e-7, 0.5, 0.25, (3, 64, 64), 2, 'float32', 8)


def test_what_is_not_a_valid_t_cnn_dict_is_named_in_one_line(t_model):
    """``check_dict``'s verdicts, word for word: files of other kinds say what they are and the command that makes a
    T-CNN file of them; a T-CNN dict with a bad version, source, state dict or conversion is named corrupt."""
    good = tcnn_file.model_to_dict(t_model)
    tensor = {'w': torch.zeros(1)}
    convert = ('`tcnn convert MODEL --weights f.pt --out FILE`, MODEL the CNN it was saved from (e.g. resnet50d)')
    lightning = "f.pt is a Lightning checkpoint, which does not record its model's architecture: make a T-CNN file " \
                'of its weights with `tcnn convert '
    cases = [
        ([1, 2], 'f.pt is not a T-CNN file (it holds a list, not a dict)'),
        (tensor, f'f.pt is a plain state_dict, not a T-CNN file: convert it with {convert}'),
        (good['state_dict'], 'f.pt is the state dict of a T-CNN (8 GPSA layers), not a T-CNN file: make one with '
                             '`tcnn convert t_MODEL --weights f.pt --out FILE`, t_MODEL the T-CNN it was saved from '
                             '(e.g. t_resnet50d)'),
        ({'pytorch-lightning_version': '2.4.0', 'state_dict': good['state_dict'], 'epoch': 1},
         lightning + 't_MODEL --weights f.pt --out FILE`, t_MODEL the T-CNN it trained (e.g. t_resnet50d)'),
        ({'pytorch-lightning_version': '2.4.0', 'state_dict': tensor, 'epoch': 1},
         lightning + 'MODEL --weights f.pt --out FILE`, MODEL the CNN it trained (e.g. resnet50d)'),
        ({'format': 'onnx', 'j': 1, 'i': 2, 'h': 3, 'g': 4, 'f': 5, 'e': 6, 'd': 7, 'c': 8, 'b': 9},
         "f.pt is not a T-CNN file (format 'onnx', expected 'tcnn'; keys: b, c, d, e, f, format, g, h)"),
        ({}, "f.pt is not a T-CNN file (format None, expected 'tcnn'; keys: )"),
        # a state dict under 'state_dict' without Lightning's key (timm's train.py), Lightning's key without one
        ({'state_dict': tensor, 'epoch': 3}, "f.pt is not a T-CNN file (format None, expected 'tcnn'; keys: epoch, "
                                             'state_dict)'),
        ({'pytorch-lightning_version': '2.4.0', 'state_dict': None},
         "f.pt is not a T-CNN file (format None, expected 'tcnn'; keys: pytorch-lightning_version, state_dict)"),
        (dict(good, version=0), 'f.pt: invalid T-CNN format version 0'),
        (dict(good, version=True), 'f.pt: invalid T-CNN format version True'),
        (dict(good, version='2'), "f.pt: invalid T-CNN format version '2'"),
        (dict(good, version=tcnn_file.FORMAT_VERSION + 1),
         f'f.pt was written in T-CNN format version {tcnn_file.FORMAT_VERSION + 1} (by tcnn {tcnn.__version__}); '
         f'this tcnn reads versions up to {tcnn_file.FORMAT_VERSION}: upgrade tcnn'),
        ({k: v for k, v in good.items() if k != 'tcnn_version'} | {'version': 99},
         f'f.pt was written in T-CNN format version 99 (by tcnn ?); this tcnn reads versions up to '
         f'{tcnn_file.FORMAT_VERSION}: upgrade tcnn'),
        (dict(good, source='resnet18d'), 'f.pt: corrupt T-CNN file (no source architecture)'),
        (dict(good, source={'model': None}), 'f.pt: corrupt T-CNN file (no source architecture)'),
        (dict(good, state_dict={}), 'f.pt: corrupt T-CNN file (no state_dict of tensors)'),
        (dict(good, state_dict=[torch.zeros(1)]), 'f.pt: corrupt T-CNN file (no state_dict of tensors)'),
        (dict(good, state_dict=dict(tensor, v=1.0)), 'f.pt: corrupt T-CNN file (no state_dict of tensors)'),
        (dict(good, conversion=['layer3']), 'f.pt: corrupt T-CNN file (bad conversion settings)'),
        (dict(good, conversion={'stages': ['layer3']}), 'f.pt: corrupt T-CNN file (bad conversion settings)'),
    ]
    for d, message in cases:
        with pytest.raises(TcnnError) as e:
            tcnn_file.check_dict(d, 'f.pt')
        assert str(e.value) == message
    for version in (1, 2, tcnn_file.FORMAT_VERSION):  # every version this tcnn reads
        assert tcnn_file.check_dict(dict(good, version=version), 'f.pt')['version'] == version
    assert tcnn_file.check_dict(dict(good, conversion=None), 'f.pt')['conversion'] is None


def test_a_training_checkpoint_yields_its_model_with_its_run(t_model):
    """A training checkpoint's T-CNN dict carries its epoch and best top-1 (not when stored as tensors), its recipe
    (a dict, else None) and, read with its EMA weights, ``'weights': 'ema'``."""
    good = tcnn_file.model_to_dict(t_model)
    d = tcnn_file.check_dict({'model_file': good, 'epoch': 7, 'best_top1': torch.tensor(50.0), 'config': 'lr=1'},
                             'last.pt')
    assert d['training'] == {'epoch': 7} and d['recipe'] is None and d['state_dict'] is good['state_dict']
    d = tcnn_file.check_dict({'model_file': good, 'best_top1': 12.5, 'config': {'lr': 0.1}, 'ema_weights': True},
                             'last.pt')
    assert d['training'] == {'best_top1': 12.5, 'weights': 'ema'} and d['recipe'] == {'lr': 0.1}
    # a T-CNN dict that holds a model_file entry is a T-CNN dict, not a checkpoint
    assert 'training' not in tcnn_file.check_dict(dict(good, model_file={'x': 1}), 'f.pt')


def test_a_dense_models_source_keeps_its_weights_origin_and_refuses_another_task():
    """A torchvision detector's recorded source: the builder's arguments less the class count (stored apart), the
    origin of its weights as recorded; a ``tcnn_source`` naming a builder of another task, or no torchvision builder,
    is a one-line error naming the model's class, what the source names and an example builder. Built on the meta
    device: nothing is computed."""
    with torch.device('meta'):
        model = create_cnn('torchvision:fasterrcnn_mobilenet_v3_large_320_fpn', pretrained=False, num_classes=3)
    model.tcnn_source = {'model': 'torchvision:fasterrcnn_mobilenet_v3_large_320_fpn',
                         'kwargs': {'num_classes': 3, 'box_score_thresh': 0.25}, 'weights': 'file:coco.pth'}
    model.roi_heads.score_thresh = 0.25  # as the builder's argument sets it
    d = tcnn_file.model_to_dict(model)
    assert d['source'] == {'model': 'torchvision:fasterrcnn_mobilenet_v3_large_320_fpn',
                           'kwargs': {'box_score_thresh': 0.25}, 'weights': 'file:coco.pth'}
    assert d['num_classes'] == 3
    fix = ("set model.tcnn_source = {'model': 'torchvision:NAME', 'kwargs': {...}}, NAME e.g. "
           'fasterrcnn_resnet50_fpn')
    for source, what in (('resnet50d', 'not a torchvision builder'), ('torchvision:fcn_resnet50', 'segmentation model'),
                         ('torchvision:resnet50', 'classification model')):
        model.tcnn_source = {'model': source, 'kwargs': {}}
        with pytest.raises(TcnnError) as e:
            tcnn_file.model_to_dict(model)
        assert str(e.value) == (f"this FasterRCNN is a torchvision detection model, but its tcnn_source names "
                                f"'{source}' ({what}): {fix}")
    with torch.device('meta'):  # the example is a builder of the model's own class
        model = create_cnn('torchvision:lraspp_mobilenet_v3_large', pretrained=False, num_classes=3)
    model.tcnn_source = {'model': 'torchvision:fasterrcnn_resnet50_fpn', 'kwargs': {}}
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_to_dict(model)
    assert str(e.value) == ("this LRASPP is a torchvision segmentation model, but its tcnn_source names "
                            "'torchvision:fasterrcnn_resnet50_fpn' (detection model): set model.tcnn_source = "
                            "{'model': 'torchvision:NAME', 'kwargs': {...}}, NAME e.g. lraspp_mobilenet_v3_large")


def test_a_dense_model_its_source_would_not_rebuild_is_refused_word_for_word():
    """``save`` rebuilds a torchvision detector from its recorded source (on the meta device) and refuses one that
    would come back otherwise, naming the call that rebuilds it (class count first, then the builder's arguments),
    what differs, and the fix: other weights, a module of another class or missing, another setting."""
    with torch.device('meta'):
        model = create_cnn('torchvision:fasterrcnn_mobilenet_v3_large_320_fpn', pretrained=False, num_classes=3)
    model.tcnn_source = {'model': 'torchvision:fasterrcnn_mobilenet_v3_large_320_fpn',
                         'kwargs': {'box_score_thresh': 0.25}}
    call = 'torchvision:fasterrcnn_mobilenet_v3_large_320_fpn(num_classes=3, box_score_thresh=0.25)'
    fix = ("set model.tcnn_source = {'model': 'torchvision:NAME', 'kwargs': {...}} to the builder and arguments that "
           'made it (or build it with tcnn.files.sources.create_cnn)')

    def refusal():
        with pytest.raises(TcnnError) as e:
            tcnn_file.model_to_dict(model)
        return str(e.value)

    assert refusal() == (f'cannot save this FasterRCNN: {call} would rebuild roi_heads.score_thresh = 0.25, it is '
                         f'0.05; {fix}')
    model.roi_heads.score_thresh = 0.25  # as the builder's argument sets it
    activation = model.backbone.body['0'][2]
    assert type(activation) is nn.Hardswish
    model.backbone.body['0'][2] = nn.ReLU()
    assert refusal() == (f'cannot save this FasterRCNN: {call} would rebuild backbone.body.0.2 as Hardswish, it is '
                         f'ReLU; {fix}')
    del model.backbone.body['0']._modules['2']
    assert refusal() == (f'cannot save this FasterRCNN: {call} would rebuild backbone.body.0.2 as Hardswish, it is '
                         f'nothing; {fix}')
    model.backbone.body['0']._modules['2'] = activation
    assert tcnn_file.model_to_dict(model)['source']['kwargs'] == {'box_score_thresh': 0.25}
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    model.__class__ = GeneralizedRCNN  # the same weights, but not the class the builder returns
    assert refusal() == (f'cannot save this GeneralizedRCNN: {call} would rebuild the model as FasterRCNN, it is '
                         f'GeneralizedRCNN; {fix}')
    model.__class__ = FasterRCNN
    model.tcnn_source = {'model': 'torchvision:fasterrcnn_resnet50_fpn', 'kwargs': {}}
    message = refusal()
    assert message.startswith('cannot save this FasterRCNN: torchvision:fasterrcnn_resnet50_fpn(num_classes=3) would '
                              'rebuild other weights (missing ') and message.endswith(f'); {fix}')


def test_what_save_cannot_describe_is_named_word_for_word(t_model):
    """``model_to_dict`` refuses, in one line each, what a file could not rebuild: a value that is not plain data, GPSA
    layers without their conversion settings or other than them, a model whose architecture nothing records."""
    weird = copy.deepcopy(t_model)
    weird.tcnn_source = dict(weird.tcnn_source, kwargs={'act_layer': nn.ReLU})
    cases = [(weird, f'cannot store source.kwargs.act_layer = {nn.ReLU!r} in a T-CNN file (only plain values: '
                     'numbers, strings, lists, dicts); create the model with plain keyword arguments')]
    listed = copy.deepcopy(t_model)  # inside a list: named by the list's key
    listed.tcnn_source = dict(listed.tcnn_source, kwargs={'acts': [1, nn.ReLU]})
    cases.append((listed, f'cannot store source.kwargs.acts = {nn.ReLU!r} in a T-CNN file (only plain values: '
                          'numbers, strings, lists, dicts); create the model with plain keyword arguments'))
    unconfigured = copy.deepcopy(t_model)
    del unconfigured.tcnn_config
    cases.append((unconfigured, 'the model has GPSA layers but no tcnn_config: convert it with tcnn.reparameterize'))
    other = copy.deepcopy(t_model)
    layers = [name for name, _ in tcnn.gpsa_layers(t_model)]
    other.tcnn_config = dict(other.tcnn_config, layers=layers[:-1])
    cases.append((other, f"the model's GPSA layers {layers} differ from its tcnn_config {layers[:-1]}"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
    cases.append((Net(), 'cannot tell which architecture this Net is: create it with tcnn.files.sources.create_cnn '
                         '(or timm.create_model), or set model.tcnn_source = {"model": NAME, "kwargs": {...}}'))
    registry = timm.create_model('t_resnet18d', num_classes=3)
    del registry.tcnn_source
    cases.append((registry, "t_resnet18d model without tcnn_source: create it with timm.create_model('t_resnet18d')"))
    for model, message in cases:
        with pytest.raises(TcnnError) as e:
            tcnn_file.model_to_dict(model)
        assert str(e.value) == message


def test_a_file_that_cannot_be_rebuilt_is_named_word_for_word(t_model, tmp_path):
    """What ``read`` and ``load`` refuse in a file, in one line each: bytes of no known kind, unreadable settings in a
    safetensors file, a device map it cannot follow, a source its builder refuses, GPSA layers this tcnn builds
    elsewhere."""
    junk = tmp_path / 'junk.pt'
    junk.write_bytes(b'junk' * 1024)
    with pytest.raises(TcnnError) as e:
        tcnn.load(str(junk))
    assert str(e.value) == f'{junk} is not a T-CNN file: neither a torch file nor (by its name) a safetensors file'
    path = str(tmp_path / 'm.safetensors')
    messages = []
    for settings in ('{"format": ', '[1, 2]'):  # not JSON (json's reason follows), JSON but not a dict
        save_file({'w': torch.zeros(2)}, path, metadata={'format': 'pt', 'tcnn': settings})
        with pytest.raises(TcnnError) as e:
            tcnn_file.read(path)
        messages.append(str(e.value))
    assert messages[0].startswith(f'{path}: corrupt T-CNN settings in the safetensors metadata (Expecting value')
    assert messages[1] == f'{path}: corrupt T-CNN settings in the safetensors metadata'
    tcnn.save(t_model, path)
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(path, map_location={'cuda:0': 'cpu'})
    assert str(e.value) == f'{path}: map_location of a safetensors file must be a device, got dict'
    d = tcnn_file.model_to_dict(t_model)
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_from_dict(dict(d, source=dict(d['source'], kwargs={'bogus': 1})), where='m.pt')
    assert str(e.value).startswith("cannot rebuild resnet18d with {'bogus': 1}: TypeError: ")
    layers = d['conversion']['layers']
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_from_dict(dict(d, conversion=dict(d['conversion'], layers=layers[1:])), where='m.pt')
    assert str(e.value) == f'm.pt: this tcnn/timm builds GPSA layers {layers}, the file has {layers[1:]}'


@pytest.mark.parametrize('origin, note', [
    ('pretrained', None),
    (None, None),
    ('file:cnn.pth', 'the local file cnn.pth'),
    ('random', 'a random initialisation'),
    ('hf-hub:someone/weights', 'hf-hub:someone/weights'),
])
def test_a_rebuilt_models_notes_say_where_its_weights_came_from(t_model, origin, note):
    """Weights that are not timm's published ones: the rebuilt model's pretrained_cfg loses the published weights'
    tag, license and notes, and its notes say where the source weights came from (license unknown)."""
    for model, kind in ((t_model, 'T-CNN'), (None, 'CNN')):
        if model is None:
            torch.manual_seed(0)
            model = create_cnn('resnet18d', pretrained=False, num_classes=10)
        d = tcnn_file.model_to_dict(model)
        d['source'] = dict(d['source'], model='resnet18d.ra2_in1k', weights=origin)
        cfg = tcnn_file.model_from_dict(d).pretrained_cfg
        if note is None:  # timm's published weights (or not recorded): the registry's config stands
            assert cfg.get('tag') == 'ra2_in1k' and 'license' in cfg
        else:
            assert cfg['notes'] == (f'{kind} of resnet18d (tcnn) whose source weights came from {note}, not from a '
                                    'published checkpoint: license unknown',)
            assert not {'tag', 'license', 'origin_url', 'description'} & set(cfg)


def test_ema_weights_asked_of_what_is_not_a_checkpoint_are_refused_word_for_word():
    """EMA weights are only in training checkpoints: a state dict (a dict, but no T-CNN file) or anything else is
    'not a training checkpoint', in one line that tells where they are."""
    for d in ({'w': torch.zeros(1)}, [torch.zeros(1)]):
        with pytest.raises(TcnnError) as e:
            tcnn_file.validated(d, 'f.pt', ema=True)
        assert str(e.value) == ('f.pt is not a training checkpoint, which holds no EMA weights: EMA weights are in the '
                                'checkpoints of `tcnn train --model-ema` (RUN/last.pt, RUN/best.pt); load this file '
                                'without ema / --use-ema')
    good = {'model_file': {'format': 'tcnn', 'version': 2, 'source': {'model': 'resnet18d'},
                           'state_dict': {'w': torch.zeros(1)}}, 'epoch': 1}
    for ema in (None, {}, {'w': 1.0}):  # a checkpoint whose run kept no EMA (or no tensors of one)
        with pytest.raises(TcnnError) as e:
            tcnn_file.validated(dict(good, ema=ema), 'last.pt', ema=True)
        assert str(e.value) == ('last.pt holds no EMA weights (its run did not use --model-ema): load it without ema '
                                '/ --use-ema')


def test_a_rebuilt_models_config_takes_the_files_sizes_classes_and_names():
    """``pretrained_cfg_of``: the file's data config and class count over the built model's config; the source's
    test size and crop stay only where the file says nothing of its own (tcnn 0.3's files), not for a file that
    stores them nor for a training checkpoint (validated at its run's size); the built model's class names stay only
    where they name each of the file's classes."""
    cfg = {'input_size': (3, 224, 224), 'test_input_size': (3, 288, 288), 'test_crop_pct': 0.95,
           'test_pool_size': (9, 9), 'num_classes': 1000, 'tag': 'ra2_in1k'}
    source = {'model': 'resnet18d.ra2_in1k', 'weights': 'pretrained'}
    new = {'source': source, 'conversion': None, 'num_classes': 10,
           'data_config': {'input_size': [3, 160, 160], 'test_input_size': [3, 192, 192], 'test_crop_pct': 1.0}}
    assert tcnn_file.pretrained_cfg_of(cfg, new, 'f.pt') == {
        'input_size': (3, 160, 160), 'test_input_size': (3, 192, 192), 'test_crop_pct': 1.0, 'num_classes': 10,
        'tag': 'ra2_in1k'}
    old = dict(new, data_config={'input_size': [3, 160, 160]})
    assert tcnn_file.pretrained_cfg_of(cfg, old, 'f.pt') == dict(cfg, input_size=(3, 160, 160), num_classes=10)
    checkpoint = dict(old, training={'epoch': 3})
    assert tcnn_file.pretrained_cfg_of(cfg, checkpoint, 'f.pt') == {
        'input_size': (3, 160, 160), 'num_classes': 10, 'tag': 'ra2_in1k'}
    assert cfg['num_classes'] == 1000 and cfg['test_pool_size'] == (9, 9)  # the built model's own, untouched
    named = dict(cfg, num_classes=3, label_names=('a', 'b', 'c'), label_descriptions=('A', 'B', 'C'))
    three = dict(new, num_classes=3)
    kept = tcnn_file.pretrained_cfg_of(named, three, 'f.pt')
    assert kept['label_names'] == ('a', 'b', 'c') and kept['label_descriptions'] == ('A', 'B', 'C')
    dropped = tcnn_file.pretrained_cfg_of(named, new, 'f.pt')  # 10 classes: the names of another head
    assert 'label_names' not in dropped and 'label_descriptions' not in dropped
    assert tcnn_file.pretrained_cfg_of(named, dict(new, label_names=list('abcdefghij')), 'f.pt')['label_names'] == \
        tuple('abcdefghij')


def test_a_timm_model_without_a_weights_tag_is_recorded_by_its_architecture():
    """A timm model whose pretrained_cfg names no weights tag (none, or None) is recorded as its architecture alone,
    with timm's factory arguments less those a file stores otherwise."""
    model = timm.create_model('resnet18d', num_classes=3, drop_rate=0.1)
    for cfg in ({k: v for k, v in model.pretrained_cfg.items() if k != 'tag'}, dict(model.pretrained_cfg, tag=None)):
        model.pretrained_cfg = cfg
        assert tcnn_file.model_to_dict(model)['source'] == {'model': 'resnet18d', 'kwargs': {'drop_rate': 0.1},
                                                            'weights': None}


def test_a_safetensors_file_keeps_the_convention_and_goes_where_it_is_mapped(t_model, tmp_path):
    """``.safetensors``: the metadata's ``'format': 'pt'`` (safetensors' convention for torch tensors); read with no
    map_location the tensors stay on the CPU, with one they go there (the meta device: no memory)."""
    path = tcnn.save(t_model, str(tmp_path / 'm.safetensors'))
    with safe_open(path, framework='pt') as f:
        assert f.metadata()['format'] == 'pt'
    assert all(v.device.type == 'cpu' for v in tcnn_file.read(path, map_location=None)['state_dict'].values())
    state_dict = tcnn_file.read_raw(path, map_location='meta')['state_dict']
    assert set(state_dict) == set(t_model.state_dict()) and all(v.is_meta for v in state_dict.values())


def test_a_safetensors_file_mapped_to_a_device_it_cannot_reach_says_so(t_model, tmp_path):
    """A device torch knows by name but cannot use here (Apple's ``mps`` on a machine without it): the tensors read on
    the CPU cannot move there, and the one-line error names the file, the map_location and torch's own reason."""
    if torch.backends.mps.is_available():
        pytest.skip('this machine has an mps device: the move succeeds')
    try:
        torch.zeros(1).to('mps')
    except RuntimeError as e:  # torch's reason, e.g. "PyTorch is not linked with support for mps devices"
        reason = ' '.join(str(e).split())
    else:
        pytest.skip('torch moves tensors to mps here')
    assert reason and '. ' not in reason and ': ' not in reason[20:] and len(reason) <= 160  # one sentence, whole
    path = tcnn.save(t_model, str(tmp_path / 'm.safetensors'))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(path, map_location='mps')
    assert str(e.value) == f"cannot load {path} onto map_location='mps': RuntimeError: {reason}"


def test_safetensors_tensors_share_no_storage_and_copy_only_what_they_must(tmp_path):
    """What ``.safetensors`` stores of a state dict: the same values, contiguous, no two tensors on one storage (tied
    weights, views: safetensors refuses them), and the state dict's own memory wherever it can be (saving a large
    model must not hold a second copy of every weight). Empty tensors share no bytes: left as they are."""
    from safetensors.torch import load_file
    w = torch.arange(12.).reshape(3, 4)
    state_dict = {'w': w, 'tied': w, 'row': w[1], 'wt': w.t(), 'other': torch.ones(2), 'empty': torch.zeros(0),
                  'empty_too': torch.zeros(0)}
    tensors = tcnn_file.safetensors_tensors(state_dict)
    assert list(tensors) == list(state_dict)
    for name, tensor in tensors.items():
        assert tensor.device.type == 'cpu' and tensor.is_contiguous() and torch.equal(tensor, state_dict[name])
    storages = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()]
    assert len(set(storages)) == len(storages)  # 'tied' and 'row' are copies, 'wt' made contiguous
    assert tensors['w'].data_ptr() == w.data_ptr() and tensors['other'].data_ptr() == state_dict['other'].data_ptr()
    path = str(tmp_path / 'tied.safetensors')
    save_file(tensors, path)  # safetensors' own check of shared storage
    assert all(torch.equal(t, state_dict[k]) for k, t in load_file(path).items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_safetensors_tensors_of_a_gpu_model_are_on_the_cpu():
    tensors = tcnn_file.safetensors_tensors({'w': torch.arange(4.).cuda()})
    assert tensors['w'].device.type == 'cpu' and torch.equal(tensors['w'], torch.arange(4.))


def test_read_names_the_file_it_refuses(tmp_path):
    """``read``'s refusals name the file as the caller gave it (a ``pathlib.Path`` too): a torch file holding a
    list, one of a format version from the future."""
    path = tmp_path / 'list.pt'
    torch.save([1, 2], str(path))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(path)
    assert str(e.value) == f'{path} is not a T-CNN file (it holds a list, not a dict)'
    path = tmp_path / 'version.pt'
    torch.save({'format': 'tcnn', 'version': 'x'}, str(path))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(str(path))
    assert str(e.value) == f"{path}: invalid T-CNN format version 'x'"


@pytest.mark.parametrize('name, ext', [('m.bin', "'.bin'"), ('m.PTH.gz', "'.gz'"), ('model', "'(none)'")])
def test_save_refuses_other_extensions_word_for_word(t_model, tmp_path, name, ext):
    path = str(tmp_path / name)
    with pytest.raises(TcnnError) as e:
        tcnn.save(t_model, path)
    assert str(e.value) == f'{path}: unsupported extension {ext}: T-CNN files end in .pt, .pth, .safetensors'
    assert not os.path.exists(path)


def test_save_names_its_path_argument_when_it_is_no_path(t_model):
    for path, kind in ((123, 'int'), (None, 'NoneType')):
        with pytest.raises(TcnnError) as e:
            tcnn.save(t_model, path)
        assert str(e.value) == f'path must be a file path (str or os.PathLike), got {kind}'


def test_a_failed_write_leaves_nothing_and_says_why(t_model, tmp_path, monkeypatch):
    """A write that fails part-way (a full disk, an exceeded quota): one line with the system's reason (its
    ``strerror``, else the error's text), and nothing left at the path or beside it."""
    import errno

    def disk_full(obj, f, *args, **kwargs):
        write_partial(f, b'half a file')
        raise OSError(errno.ENOSPC, 'No space left on device')

    def quota(obj, f, *args, **kwargs):
        raise OSError('quota exceeded')  # no errno, no strerror

    path = str(tmp_path / 'm.pt')
    for write, reason in ((disk_full, 'No space left on device'), (quota, 'quota exceeded')):
        monkeypatch.setattr(torch, 'save', write)
        with pytest.raises(TcnnError) as e:
            tcnn.save(t_model, path)
        assert str(e.value) == f'cannot write {path}: {reason}'
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_read_refuses_what_is_no_path_or_no_device_as_the_callers_mistake(t_model, tmp_path, ext):
    """A path that is not one, or a map_location torch does not know ('gpu'): the caller's mistake, named as such
    before the file is opened (never "corrupt file")."""
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(123)
    assert str(e.value) == 'path must be a file path (str or os.PathLike), got int'
    path = tcnn.save(t_model, str(tmp_path / f'm{ext}'))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(path, map_location='gpu')
    assert str(e.value) == "map_location 'gpu' is not a device (e.g. 'cpu', 'cuda', 'cuda:0')"


class _Pickled:
    """A class of this test module: a torch file holding one holds pickled code, which weights_only refuses."""


def test_read_names_a_missing_empty_or_code_holding_file_as_a_t_cnn_file(tmp_path):
    missing = str(tmp_path / 'missing.pt')
    empty = tmp_path / 'empty.pt'
    empty.write_bytes(b'')
    code = str(tmp_path / 'code.pt')
    torch.save({'x': _Pickled()}, code)
    for path, message in ((missing, f'T-CNN file not found: {missing}'),
                          (str(tmp_path), f'T-CNN file {tmp_path} is a folder, not a file'),
                          (str(empty), f'T-CNN file {empty} is empty (0 bytes): an interrupted copy or download?'),
                          (code, f'{code} is not a T-CNN file: it holds pickled Python objects other than tensors and '
                                 'plain values, which tcnn never loads (unpickling can run code); save a state_dict '
                                 '(torch.save(model.state_dict(), PATH)) or a safetensors file instead')):
        with pytest.raises(TcnnError) as e:
            tcnn_file.read(path)
        assert str(e.value) == message


def test_a_torch_file_goes_where_it_is_mapped(t_model, tmp_path):
    """``.pt``: the tensors go to the map_location (the meta device: no memory), the file's own device without one."""
    path = tcnn.save(t_model, str(tmp_path / 'm.pt'))
    state_dict = tcnn_file.read_raw(path, map_location='meta')['state_dict']
    assert set(state_dict) == set(t_model.state_dict()) and all(v.is_meta for v in state_dict.values())
    assert all(v.device.type == 'cpu' for v in tcnn_file.read(path, map_location=None)['state_dict'].values())


def test_model_from_dict_names_its_dict_and_maps_its_tensors(t_model):
    """``model_from_dict``'s refusals name the dict's origin (``where``; by default "the T-CNN dict"), weights the
    rebuilt model has no place for are named, never a KeyError, and the tensors go to the map_location."""
    d = tcnn_file.model_to_dict(t_model)
    layers = d['conversion']['layers']
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_from_dict(dict(d, conversion=dict(d['conversion'], layers=layers[1:])))
    assert str(e.value) == f'the T-CNN dict: this tcnn/timm builds GPSA layers {layers}, the file has {layers[1:]}'
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_from_dict({'format': 'tcnn', 'version': 'x'}, where='m.pt')
    assert str(e.value) == "m.pt: invalid T-CNN format version 'x'"
    extra = dict(d, state_dict=dict(d['state_dict'], **{'layer9.proj_weight': torch.zeros(2)}))
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_from_dict(extra, where='m.pt')
    assert str(e.value) == ('m.pt: the weights do not fit the rebuilt model: unexpected 1 (e.g. '
                            'layer9.proj_weight)')
    model = tcnn_file.model_from_dict(d, map_location='meta')
    assert all(p.is_meta for p in model.parameters()) and all(v.device.type == 'cpu' for v in d['state_dict'].values())


def test_a_t_cnn_with_grouped_gpsa_layers_round_trips(tmp_path):
    """A converted CNN whose stage has grouped convolutions (RegNetX): its grouped GPSA layers are rebuilt as such and
    give the same outputs."""
    torch.manual_seed(0)
    cnn = create_cnn('regnetx_002', pretrained=False, num_classes=3)
    t_model = tcnn.reparameterize(cnn, qk_dim=8, verify=False).eval()  # not the default: rebuilt as converted
    grouped = [name for name, layer in tcnn.gpsa_layers(t_model) if layer.groups > 1]
    assert grouped
    loaded = tcnn_file.model_from_dict(tcnn_file.model_to_dict(t_model))
    assert [n for n, layer in tcnn.gpsa_layers(loaded) if layer.groups > 1] == grouped
    with torch.no_grad():
        assert torch.equal(loaded(images()), t_model(images()))


def test_model_from_dict_adopts_the_dicts_tensors_and_records_its_source(t_model):
    """The rebuilt model holds the dict's own tensors (built on the meta device: no random init, no second copy of
    the weights) and records the source it was rebuilt from, class count included, as ``create_cnn`` recorded it."""
    d = tcnn_file.model_to_dict(t_model)
    model = tcnn_file.model_from_dict(d)
    assert model.tcnn_source == t_model.tcnn_source and model.tcnn_source['num_classes'] == 10
    assert model.default_cfg == model.pretrained_cfg and model.default_cfg['num_classes'] == 10  # timm's older name
    state_dict = model.state_dict()
    assert all(state_dict[k].data_ptr() == v.data_ptr() for k, v in d['state_dict'].items())


def test_a_model_with_buffers_no_file_holds_is_rebuilt_for_real():
    """Non-persistent buffers (EfficientViT's attention bias indices) are not in a state dict: built on the meta
    device they would stay there, so the model is rebuilt on the weights' device; it gives the same outputs."""
    torch.manual_seed(0)
    cnn = create_cnn('efficientvit_m0', pretrained=False, num_classes=3).eval()
    assert any(n not in cnn.state_dict() for n, _ in cnn.named_buffers())
    d = tcnn_file.model_to_dict(cnn)
    model = tcnn_file.model_from_dict(d)
    assert not any(b.is_meta for b in model.buffers())
    x = images(1, 224)
    with torch.no_grad():
        assert torch.equal(model(x), cnn(x))
    # rebuilt on the device the weights were mapped to (the meta device: no memory)
    model = tcnn_file.model_from_dict(d, map_location='meta')
    assert all(p.is_meta for p in model.parameters())


def test_a_file_records_the_parameters_of_the_model_and_of_its_source_cnn(t_model):
    """``'parameters'``: the T-CNN's own count, and its source CNN's (every GPSA layer counted as the conv it stands
    for), counted here on the CNN itself."""
    cnn = create_cnn('resnet18d', pretrained=False, num_classes=10, zero_init_last=False, drop_path_rate=0.05)
    assert tcnn_file.model_to_dict(t_model)['parameters'] == {
        'total': sum(p.numel() for p in t_model.parameters()), 'cnn': sum(p.numel() for p in cnn.parameters())}


def test_a_converted_model_outside_the_registry_is_rebuilt_with_its_settings():
    """A T-CNN whose source has no ``t_*`` name (torchvision's ResNet) is rebuilt by converting its source CNN with
    the file's conversion settings (here not the defaults), and gives the same outputs."""
    torch.manual_seed(0)
    cnn = create_cnn('torchvision:resnet18', pretrained=False, num_classes=3)
    t_model = tcnn.reparameterize(cnn, qk_dim=8, locality_strength=2.0, verify=False).eval()
    loaded = tcnn_file.model_from_dict(tcnn_file.model_to_dict(t_model))
    assert [(n, layer.qk_dim) for n, layer in tcnn.gpsa_layers(loaded)] == [
        (n, 8) for n, _ in tcnn.gpsa_layers(t_model)]
    with torch.no_grad():
        assert torch.equal(loaded(images()), t_model(images()))


def test_a_report_is_stored_as_strict_json():
    """``report_to_dict``: a non-finite number (a sensitivity not measured, an infinite init error) as null and a
    tuple as a list, so that the report is strict JSON (a ``.safetensors`` file's metadata) and reads back the same."""
    from tcnn.convert.verify import EquivalenceReport
    report = EquivalenceReport(max_abs_err=1e-6, max_rel_err=2e-7, init_max_abs_err=float('inf'), init_max_rel_err=0.5,
                               input_size=(3, 64, 64), batch_size=2, dtype='float32', num_gpsa=2)
    d = tcnn_file.report_to_dict(report)
    assert d['init_max_abs_err'] is None and d['sensitivity'] is None and d['input_size'] == [3, 64, 64]
    assert json.loads(json.dumps(d, allow_nan=False)) == d


def test_a_segmentation_models_data_config_is_its_weights_normalisation():
    """A torchvision segmentation model's file stores what its weights' transform applies before the model
    (ImageNet's mean and std, bilinear resize; no input size or crop), with the caller's overrides, which must be
    plain values like any data config's. Built on the meta device: nothing is computed."""
    with torch.device('meta'):
        model = create_cnn('torchvision:lraspp_mobilenet_v3_large', pretrained=False, num_classes=3)
    assert tcnn_file.model_to_dict(model)['data_config'] == {
        'interpolation': 'bilinear', 'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]}
    assert tcnn_file.model_to_dict(model, data_config={'interpolation': 'bicubic'})['data_config']['interpolation'] == \
        'bicubic'
    odd = object()
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_to_dict(model, data_config={'mean': odd})
    assert str(e.value) == (f'cannot store data_config.mean = {odd!r} in a T-CNN file (only plain values: numbers, '
                            'strings, lists, dicts); create the model with plain keyword arguments')


def test_a_classifiers_data_config_keeps_its_test_size_and_the_overrides():
    """A timm classifier's file stores its training size and crop and, apart, its test size and crop (resnet18d's
    weights: trained at 224 px, crop 0.875, tested at 288 px, crop 0.95, as timm's registry gives them); an overridden
    input size replaces the test size too (a fine-tuned model is evaluated as it was validated), and overrides must be
    plain values."""
    model = create_cnn('resnet18d', pretrained=False, num_classes=3)
    assert tcnn_file.model_to_dict(model)['data_config'] == {
        'input_size': [3, 224, 224], 'interpolation': 'bicubic', 'mean': [0.485, 0.456, 0.406],
        'std': [0.229, 0.224, 0.225], 'crop_pct': 0.875, 'crop_mode': 'center', 'test_input_size': [3, 288, 288],
        'test_crop_pct': 0.95}
    config = tcnn_file.model_to_dict(model, data_config={'input_size': (3, 160, 160)})['data_config']
    assert (config['input_size'], config['test_input_size'], config['test_crop_pct']) == (
        [3, 160, 160], [3, 160, 160], 0.95)
    odd = object()
    with pytest.raises(TcnnError) as e:
        tcnn_file.model_to_dict(model, data_config={'mean': odd})
    assert str(e.value) == (f'cannot store data_config.mean = {odd!r} in a T-CNN file (only plain values: numbers, '
                            'strings, lists, dicts); create the model with plain keyword arguments')


def test_a_compiled_model_is_saved_as_the_model_it_wraps(t_model):
    """``torch.compile``'s wrapper (``_orig_mod``; nothing is compiled before a forward) is unwrapped, inside
    DataParallel too: the file is the model's."""
    expected = tcnn_file.model_to_dict(t_model)
    for wrapped in (torch.compile(t_model), nn.DataParallel(torch.compile(t_model))):
        d = tcnn_file.model_to_dict(wrapped)
        assert d['source'] == expected['source'] and d['state_dict'].keys() == expected['state_dict'].keys()


@pytest.mark.parametrize('name,kwargs', [('resnet18d', {}), ('resnet18d', {'feature_cls': 'getter'}),
                                         ('resnet18d', {'feature_cls': 'hook'}), ('mobilenetv3_small_050', {})],
                         ids=['list', 'getter', 'hook', 'native'])
def test_a_features_only_model_is_refused_word_for_word(tmp_path, name, kwargs):
    """timm's feature wrappers and the feature classes a family builds itself (MobileNetV3Features: no wrapper) hold
    no classifier: saving one is refused with the fix, not as a model whose class count cannot be told."""
    model = timm.create_model(name, features_only=True, out_indices=(1, 2), **kwargs)
    with pytest.raises(TcnnError) as err:
        tcnn.save(model, str(tmp_path / 'f.pt'))
    assert str(err.value) == 'cannot save a features_only model: save the classification model it was made from'
    assert not os.listdir(tmp_path)


def test_a_timm_models_file_records_its_architecture_arguments_only():
    """A plain timm model's source is its name and the architecture arguments timm recorded (``_model_args``): the
    class count is the file's own field; placement (device, dtype) is not recorded, so the file loads anywhere."""
    cnn = timm.create_model('resnet18d', num_classes=7, drop_path_rate=0.1, stem_width=16, device='cpu',
                            dtype=torch.float64)
    assert tcnn_file.model_to_dict(cnn)['source'] == {
        'model': 'resnet18d.ra2_in1k', 'kwargs': {'drop_path_rate': 0.1, 'stem_width': 16}, 'weights': None}
    loaded = tcnn_file.model_from_dict(tcnn_file.model_to_dict(cnn))
    assert loaded.num_classes == 7 and loaded.conv1[0].out_channels == 16


def test_a_timm_model_built_by_its_entrypoint_is_refused_word_for_word(tmp_path):
    """timm records a model's arguments in ``timm.create_model``, not in its entrypoint: a model built by the
    entrypoint (here with ``global_pool='max'``, which no weight shows) would be saved without them and load as
    another model, so it is refused with the fix."""
    model = timm.models.resnet.resnet18d(num_classes=3, global_pool='max')
    with pytest.raises(TcnnError) as err:
        tcnn.save(model, str(tmp_path / 'm.pt'))
    assert str(err.value) == (
        "cannot tell which arguments this resnet18d was built with (timm.create_model records them, its entrypoint "
        "does not): build it with timm.create_model('resnet18d', ...), or set model.tcnn_source = "
        '{"model": NAME, "kwargs": {...}}')
    assert not os.listdir(tmp_path)
    tcnn.save(timm.create_model('resnet18d', num_classes=3, global_pool='max'), str(tmp_path / 'm.pt'))
    assert tcnn.load(str(tmp_path / 'm.pt')).global_pool.pool_type == 'max'


def test_a_models_own_label_names_are_stored_when_they_name_its_outputs():
    """Without ``label_names``, the model's (``pretrained_cfg['label_names']``, as timm and ``tcnn.load`` keep them)
    are stored when there is one for each output, and left out when they name another head's classes."""
    names = ['cat', 'dog', 'eel']
    model = timm.create_model('resnet18d', num_classes=3, pretrained_cfg_overlay=dict(label_names=names))
    assert tcnn_file.model_to_dict(model)['label_names'] == names
    assert tcnn_file.model_to_dict(model, label_names=['a', 'b', 'c'])['label_names'] == ['a', 'b', 'c']
    other = timm.create_model('resnet18d', num_classes=4, pretrained_cfg_overlay=dict(label_names=names))
    assert 'label_names' not in tcnn_file.model_to_dict(other)


@pytest.mark.parametrize('builder,num_classes', [('resnet18', 6), ('mobilenet_v2', 5), ('convnext_tiny', 4)])
def test_the_class_count_of_a_torchvision_classifier_is_its_last_linear_layers(builder, num_classes):
    """torchvision's classifiers keep no ``num_classes``: their class count is their last linear layer's outputs
    (``fc``, ``classifier.1``, ``classifier.2``)."""
    with torch.device('meta'):
        cnn = create_cnn(f'torchvision:{builder}', pretrained=False, num_classes=num_classes)
    assert not hasattr(cnn, 'num_classes') and tcnn_file.model_to_dict(cnn)['num_classes'] == num_classes


def test_a_model_without_a_class_count_is_refused_word_for_word():
    """A model with neither ``num_classes``, ``fc`` nor a linear layer (here a backbone given a source by hand), and a
    torchvision detector whose head is none of torchvision's, cannot be saved: its class count is unknown."""
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3))
    backbone.tcnn_source = {'model': 'resnet18d', 'kwargs': {}}
    with pytest.raises(TcnnError) as err:
        tcnn_file.model_to_dict(backbone)
    assert str(err.value) == 'cannot tell the class count of this Sequential (no num_classes, no linear layer)'
    with torch.device('meta'):
        detector = create_cnn('torchvision:fcos_resnet50_fpn', pretrained=False, num_classes=3,
                              kwargs=dict(weights_backbone=None))
    detector.head.classification_head = nn.Identity()
    with pytest.raises(TcnnError) as err:
        tcnn_file.model_to_dict(detector)
    assert str(err.value) == ("cannot tell the class count of this FCOS: its head is not one of torchvision's "
                              '(box_predictor.cls_score, classification_head, classifier)')


@pytest.mark.parametrize('groups,version', [(1, 2), (2, 3), (4, 3)])
def test_a_files_format_version_is_the_oldest_that_reads_it(groups, version):
    """Version 2 (tcnn 0.2 reads it) unless a GPSA layer is grouped (version 3: tcnn 0.2 refuses it with 'upgrade
    tcnn' instead of a shape error), whatever the groups."""
    torch.manual_seed(0)
    cnn = create_cnn('resnet26d', pretrained=False, num_classes=3, cardinality=groups, base_width=64 // groups)
    t_cnn = tcnn.reparameterize(cnn, input_size=(3, 64, 64), verify=False)
    assert {layer.groups for _, layer in tcnn.gpsa_layers(t_cnn)} == {groups}
    assert tcnn_file.model_to_dict(t_cnn)['version'] == version


def test_a_conversion_record_of_other_values_is_refused_word_for_word(t_model):
    """The conversion record (``tcnn_config``) is stored as plain values: anything else is refused, named by its
    place in the record."""
    model = copy.deepcopy(t_model)
    model.tcnn_config = dict(model.tcnn_config, locality_strength=torch.tensor(1.0))
    with pytest.raises(TcnnError) as err:
        tcnn_file.model_to_dict(model)
    assert str(err.value) == ('cannot store conversion.locality_strength = tensor(1.) in a T-CNN file (only plain '
                              'values: numbers, strings, lists, dicts); create the model with plain keyword arguments')
