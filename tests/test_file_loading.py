"""``tcnn.load``, ``read`` and ``model_from_dict`` (``tcnn.files.tcnn_file``): a saved model comes back the same,
rebuilt as its file records it; what a file cannot give is refused in one line that names the file."""
import argparse
import os

import pytest
import timm
import torch
import torch.nn as nn
from safetensors.torch import save_file

import tcnn
from tcnn.files import tcnn_file
from tcnn.errors import TcnnError
from tcnn.files.sources import create_cnn

from helpers import images


# ---------------------------------------------------------------------------------- a saved model loads back the same

@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_a_saved_t_cnn_loads_back_with_identical_outputs_and_settings(t_model, tmp_path, ext):
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


def test_a_plain_cnn_round_trips_as_a_t_cnn_does(tmp_path):
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


def test_a_torchvision_t_cnn_round_trips_with_its_weights_transform(tmp_path):
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


# -------------------------------------------------------------------------------------- a model rebuilt from its dict

def test_model_from_dict_is_the_inverse(t_model):
    d = tcnn_file.model_to_dict(t_model, data_config={'input_size': (3, 160, 160), 'crop_pct': 1.0})
    model = tcnn_file.model_from_dict(d)
    with torch.no_grad():
        assert torch.equal(model(images()), t_model(images()))
    assert model.pretrained_cfg['input_size'] == (3, 160, 160) and model.pretrained_cfg['crop_pct'] == 1.0
    assert tcnn_file.model_to_dict(nn.DataParallel(t_model))['source'] == d['source']  # wrappers are unwrapped


def test_model_from_dict_adopts_the_dicts_tensors_and_records_its_source(t_model):
    """The rebuilt model holds the dict's own tensors (built on the meta device: no random init, no second copy of
    the weights) and records the source it was rebuilt from, class count included, as ``create_cnn`` recorded it."""
    d = tcnn_file.model_to_dict(t_model)
    model = tcnn_file.model_from_dict(d)
    assert model.tcnn_source == t_model.tcnn_source and model.tcnn_source['num_classes'] == 10
    assert model.default_cfg == model.pretrained_cfg and model.default_cfg['num_classes'] == 10  # timm's older name
    state_dict = model.state_dict()
    assert all(state_dict[k].data_ptr() == v.data_ptr() for k, v in d['state_dict'].items())


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


def test_a_torch_file_goes_where_it_is_mapped(t_model, tmp_path):
    """``.pt``: the tensors go to the map_location (the meta device: no memory), the file's own device without one."""
    path = tcnn.save(t_model, str(tmp_path / 'm.pt'))
    state_dict = tcnn_file.read_raw(path, map_location='meta')['state_dict']
    assert set(state_dict) == set(t_model.state_dict()) and all(v.is_meta for v in state_dict.values())
    assert all(v.device.type == 'cpu' for v in tcnn_file.read(path, map_location=None)['state_dict'].values())


# ---------------------------------------------------------------------------------- what reading refuses, in one line

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


def test_load_names_a_missing_path_and_a_folder(tmp_path):
    with pytest.raises(TcnnError, match='not found'):
        tcnn.load(str(tmp_path / 'nope.pt'))
    with pytest.raises(TcnnError, match='folder'):
        tcnn.load(str(tmp_path))


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
