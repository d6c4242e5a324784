"""``tcnn.save`` and ``model_to_dict`` (``tcnn.files.tcnn_file``): what a T-CNN file records of a model, and what
saving refuses, in one line each (word for word where the message is the promise)."""
import copy
import json
import os
import re

import pytest
import timm
import torch
import torch.nn as nn

import tcnn
from tcnn.files import tcnn_file
from tcnn.errors import TcnnError
from tcnn.files.sources import create_cnn

from helpers import write_partial


# ------------------------------------------------------------------------------------------------ what a file records

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


@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_save_stores_the_given_data_config_and_label_names(t_model, tmp_path, ext):
    """What ``save`` is given reaches the file, read back by ``tcnn.load``: an overridden crop and the class names."""
    names = [f'class {i}' for i in range(10)]
    path = tcnn.save(t_model, str(tmp_path / f'm{ext}'), data_config={'crop_pct': 0.8125}, label_names=names)
    d = tcnn_file.read(path)
    assert d['data_config']['crop_pct'] == d['data_config']['test_crop_pct'] == 0.8125
    assert d['label_names'] == names


def test_a_timm_models_file_records_its_architecture_arguments_only():
    """A plain timm model's source is its name and the architecture arguments timm recorded (``_model_args``): the
    class count is the file's own field; placement (device, dtype) is not recorded, so the file loads anywhere."""
    cnn = timm.create_model('resnet18d', num_classes=7, drop_path_rate=0.1, stem_width=16, device='cpu',
                            dtype=torch.float64)
    assert tcnn_file.model_to_dict(cnn)['source'] == {
        'model': 'resnet18d.ra2_in1k', 'kwargs': {'drop_path_rate': 0.1, 'stem_width': 16}, 'weights': None}
    loaded = tcnn_file.model_from_dict(tcnn_file.model_to_dict(cnn))
    assert loaded.num_classes == 7 and loaded.conv1[0].out_channels == 16


def test_a_timm_model_without_a_weights_tag_is_recorded_by_its_architecture():
    """A timm model whose pretrained_cfg names no weights tag (none, or None) is recorded as its architecture alone,
    with timm's factory arguments less those a file stores otherwise."""
    model = timm.create_model('resnet18d', num_classes=3, drop_rate=0.1)
    for cfg in ({k: v for k, v in model.pretrained_cfg.items() if k != 'tag'}, dict(model.pretrained_cfg, tag=None)):
        model.pretrained_cfg = cfg
        assert tcnn_file.model_to_dict(model)['source'] == {'model': 'resnet18d', 'kwargs': {'drop_rate': 0.1},
                                                            'weights': None}


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


def test_a_file_records_the_parameters_of_the_model_and_of_its_source_cnn(t_model):
    """``'parameters'``: the T-CNN's own count, and its source CNN's (every GPSA layer counted as the conv it stands
    for), counted here on the CNN itself."""
    cnn = create_cnn('resnet18d', pretrained=False, num_classes=10, zero_init_last=False, drop_path_rate=0.05)
    assert tcnn_file.model_to_dict(t_model)['parameters'] == {
        'total': sum(p.numel() for p in t_model.parameters()), 'cnn': sum(p.numel() for p in cnn.parameters())}


def test_a_report_is_stored_as_strict_json():
    """``report_to_dict``: a non-finite number (a sensitivity not measured, an infinite init error) as null and a
    tuple as a list, so that the report is strict JSON (a ``.safetensors`` file's metadata) and reads back the same."""
    from tcnn.convert.verify import EquivalenceReport
    report = EquivalenceReport(max_abs_err=1e-6, max_rel_err=2e-7, init_max_abs_err=float('inf'), init_max_rel_err=0.5,
                               input_size=(3, 64, 64), batch_size=2, dtype='float32', num_gpsa=2)
    d = tcnn_file.report_to_dict(report)
    assert d['init_max_abs_err'] is None and d['sensitivity'] is None and d['input_size'] == [3, 64, 64]
    assert json.loads(json.dumps(d, allow_nan=False)) == d


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


@pytest.mark.parametrize('groups,version', [(1, 2), (2, 3), (4, 3)])
def test_a_files_format_version_is_the_oldest_that_reads_it(groups, version):
    """Version 2 (tcnn 0.2 reads it) unless a GPSA layer is grouped (version 3: tcnn 0.2 refuses it with 'upgrade
    tcnn' instead of a shape error), whatever the groups."""
    torch.manual_seed(0)
    cnn = create_cnn('resnet26d', pretrained=False, num_classes=3, cardinality=groups, base_width=64 // groups)
    t_cnn = tcnn.reparameterize(cnn, input_size=(3, 64, 64), verify=False)
    assert {layer.groups for _, layer in tcnn.gpsa_layers(t_cnn)} == {groups}
    assert tcnn_file.model_to_dict(t_cnn)['version'] == version


def test_a_compiled_model_is_saved_as_the_model_it_wraps(t_model):
    """``torch.compile``'s wrapper (``_orig_mod``; nothing is compiled before a forward) is unwrapped, inside
    DataParallel too: the file is the model's."""
    expected = tcnn_file.model_to_dict(t_model)
    for wrapped in (torch.compile(t_model), nn.DataParallel(torch.compile(t_model))):
        d = tcnn_file.model_to_dict(wrapped)
        assert d['source'] == expected['source'] and d['state_dict'].keys() == expected['state_dict'].keys()


# ---------------------------------------------------------------------------- what saving refuses, and a failed write

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


def test_save_names_its_path_argument_when_it_is_no_path(t_model):
    for path, kind in ((123, 'int'), (None, 'NoneType')):
        with pytest.raises(TcnnError) as e:
            tcnn.save(t_model, path)
        assert str(e.value) == f'path must be a file path (str or os.PathLike), got {kind}'


@pytest.mark.parametrize('name, ext', [('m.bin', "'.bin'"), ('m.PTH.gz', "'.gz'"), ('model', "'(none)'")])
def test_save_refuses_other_extensions_word_for_word(t_model, tmp_path, name, ext):
    path = str(tmp_path / name)
    with pytest.raises(TcnnError) as e:
        tcnn.save(t_model, path)
    assert str(e.value) == f'{path}: unsupported extension {ext}: T-CNN files end in .pt, .pth, .safetensors'
    assert not os.path.exists(path)


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


def test_a_conversion_record_of_other_values_is_refused_word_for_word(t_model):
    """The conversion record (``tcnn_config``) is stored as plain values: anything else is refused, named by its
    place in the record."""
    model = copy.deepcopy(t_model)
    model.tcnn_config = dict(model.tcnn_config, locality_strength=torch.tensor(1.0))
    with pytest.raises(TcnnError) as err:
        tcnn_file.model_to_dict(model)
    assert str(err.value) == ('cannot store conversion.locality_strength = tensor(1.) in a T-CNN file (only plain '
                              'values: numbers, strings, lists, dicts); create the model with plain keyword arguments')


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
