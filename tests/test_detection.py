"""torchvision's detection and segmentation models: created by name (``torchvision:NAME`` with their builders'
arguments), converted, saved and loaded back to the same boxes and masks; the CLI's convert, info and export; and
``check_equivalence`` telling a detector's float32 rounding (NMS and top-k picks swapped) from a wrong conversion.

Random weights, small images and small ``min_size``/``max_size``: detection models are slow on a CPU.
"""
import warnings

import pytest
import torch

import tcnn
from tcnn.cli import main
from tcnn.files import tcnn_file
from tcnn.files.sources import create_cnn

torchvision = pytest.importorskip('torchvision', reason='torchvision builds the detection and segmentation models')

SMALL = {'min_size': 96, 'max_size': 128}  # the detectors' own resize: their default is 800 px


def _images(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, 96, 128, generator=g), torch.rand(3, 112, 96, generator=g)]


def _assert_same_outputs(a, b) -> None:
    """The same detections (boxes, scores, labels) or masks, leaf by leaf: labels equal, floats to float32 rounding.

    Why not bit-equal floats: the weights are checked bit-equal (the promise of a reload), but two forwards of
    bit-equal models are not promised bit-equal by torch: DeepLabV3's masks differed in their last bits twice, each
    time in the whole suite's process (2026-12-03, after the tests of other files), never alone (5 runs)."""
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            if a[k].is_floating_point():
                torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m: f'{k}: {m}')
            else:
                assert torch.equal(a[k], b[k]), k
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_outputs(x, y)


def _convert(cnn):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return tcnn.reparameterize(cnn, verify=False).eval()


@pytest.mark.parametrize('name, kwargs, ext', [
    # frozen_batchnorm=0.0: the backbone as torchvision's COCO weights leave it (FrozenBatchNorm2d, eps 0)
    ('fasterrcnn_resnet50_fpn', dict(SMALL, frozen_batchnorm=0.0), '.pt'),
    ('fasterrcnn_resnet50_fpn', SMALL, '.safetensors'),
    ('retinanet_resnet50_fpn', dict(SMALL, score_thresh=0.2), '.safetensors'),
    ('fcn_resnet50', {'aux_loss': True}, '.pt'),
    ('deeplabv3_resnet50', {}, '.safetensors'),
])
def test_a_detector_round_trips_with_its_builder_and_the_same_outputs(name, kwargs, ext, tmp_path):
    """create_cnn -> reparameterize -> save -> load: the builder, its arguments and class count are recorded, and the
    loaded model gives the same boxes, scores, labels or masks."""
    torch.manual_seed(0)
    cnn = create_cnn(f'torchvision:{name}', pretrained=False, num_classes=7, **kwargs)
    t_model = _convert(cnn)
    assert t_model.tcnn_config['stages'] == [('backbone.body.layer4' if 'rcnn' in name or 'retina' in name
                                             else 'backbone.layer4')]
    path = tmp_path / f'{name}{ext}'
    tcnn.save(t_model, path)
    d = tcnn_file.read(str(path))
    assert d['source']['model'] == f'torchvision:{name}' and d['num_classes'] == 7
    assert d['source']['kwargs'] == {**kwargs, **({'aux_loss': False} if name == 'deeplabv3_resnet50' else {})}
    loaded = tcnn.load(path)
    assert type(loaded) is type(t_model)
    saved, reloaded = t_model.state_dict(), loaded.state_dict()
    assert list(saved) == list(reloaded) and all(torch.equal(saved[k], reloaded[k]) for k in saved)
    assert [n for n, _ in tcnn.gpsa_layers(loaded)] == [n for n, _ in tcnn.gpsa_layers(t_model)]
    images = _images()
    with torch.no_grad():
        expected = t_model(images if 'rcnn' in name or 'retina' in name else torch.stack([images[0], images[0]]))
        got = loaded(images if 'rcnn' in name or 'retina' in name else torch.stack([images[0], images[0]]))
    _assert_same_outputs(expected, got)
    if name == 'fasterrcnn_resnet50_fpn':
        frozen = 'frozen_batchnorm' in kwargs
        bn = loaded.backbone.body.layer4[0].bn2
        assert type(bn) is (torchvision.ops.misc.FrozenBatchNorm2d if frozen else torch.nn.BatchNorm2d)
        assert bn.eps == (0.0 if frozen else 1e-5)
        assert loaded.backbone.body.conv1.weight.requires_grad is not frozen  # torchvision trains 3 layers then
        assert len(expected[0]['boxes']) > 0  # something to compare
    if name == 'fcn_resnet50':
        assert loaded.aux_classifier is not None and expected['out'].shape[1] == 7


def test_an_ssd_round_trips_with_its_class_count(tmp_path):
    """An SSD's class count is not an attribute of its head (torchvision's ``SSDClassificationHead`` keeps it as
    ``num_columns``, the scores per anchor): save reads it there, and the loaded SSDlite gives the same detections."""
    torch.manual_seed(0)
    with torch.device('meta'):  # VGG16's SSD: the class count alone, nothing computed
        ssd = torchvision.models.get_model('ssd300_vgg16', weights=None, weights_backbone=None, num_classes=5)
    assert tcnn.files.sources.dense_num_classes(ssd) == 5
    cnn = create_cnn('torchvision:ssdlite320_mobilenet_v3_large', pretrained=False, num_classes=3).eval()
    path = tmp_path / 'ssdlite.pt'
    tcnn.save(cnn, path)
    d = tcnn_file.read(str(path))
    assert d['num_classes'] == 3 and d['source']['model'] == 'torchvision:ssdlite320_mobilenet_v3_large'
    loaded = tcnn.load(path)
    images = _images()
    with torch.no_grad():
        expected = cnn(images)
        _assert_same_outputs(expected, loaded(images))
    assert len(expected[0]['boxes']) > 0  # something to compare


def _pretrained_style_detector(num_classes: int):
    """What fasterrcnn_resnet50_fpn(weights=COCO_V1, ...) builds, without the download: a ResNet with frozen batch
    norms (eps 0), 3 trainable layers."""
    from torchvision.models.detection._utils import overwrite_eps
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    resnet = torchvision.models.resnet50(norm_layer=torchvision.ops.misc.FrozenBatchNorm2d)
    model = torchvision.models.detection.FasterRCNN(_resnet_fpn_extractor(resnet, 3), num_classes=num_classes, **SMALL)
    overwrite_eps(model, 0.0)
    return model


def test_save_records_how_to_rebuild():
    """A detector the user built himself (as torchvision's weights leave it): tcnn.save asks for its builder,
    refuses one that would rebuild another model (other weights, other settings such as max_size), and takes the
    right one, adding the frozen batch norms; tcnn.load refuses weights that do not fit instead of building another
    model."""
    torch.manual_seed(0)
    t_model = _convert(_pretrained_style_detector(4))
    with pytest.raises(tcnn.TcnnError, match=r"cannot tell which torchvision builder made this FasterRCNN: .*"
                                             r"model.tcnn_source = \{'model': 'torchvision:NAME'"):
        tcnn_file.model_to_dict(t_model)
    t_model.tcnn_source = {'model': 'torchvision:fasterrcnn_resnet50_fpn', 'kwargs': {}}
    with pytest.raises(tcnn.TcnnError, match=r'would rebuild transform.max_size = 1333, it is 128'):
        tcnn_file.model_to_dict(t_model)
    t_model.tcnn_source = {'model': 'torchvision:fasterrcnn_resnet50_fpn_v2', 'kwargs': SMALL}
    with pytest.raises(tcnn.TcnnError, match=r'would rebuild other weights \(missing'):
        tcnn_file.model_to_dict(t_model)
    t_model.tcnn_source = {'model': 'torchvision:fcn_resnet50', 'kwargs': {}}
    with pytest.raises(tcnn.TcnnError, match=r"names 'torchvision:fcn_resnet50' \(segmentation model\)"):
        tcnn_file.model_to_dict(t_model)
    t_model.tcnn_source = {'model': 'torchvision:fasterrcnn_resnet50_fpn', 'kwargs': dict(SMALL)}
    d = tcnn_file.model_to_dict(t_model)
    assert d['num_classes'] == 4 and d['data_config'] == {}  # the detector resizes and normalises itself
    assert d['source']['kwargs'] == dict(SMALL, frozen_batchnorm=0.0)
    images = _images(1)
    with torch.no_grad():
        _assert_same_outputs(t_model(images), tcnn_file.model_from_dict(d)(images))
    with pytest.raises(tcnn.TcnnError, match=r'the weights do not fit the rebuilt model: .*shape mismatch'):
        tcnn_file.model_from_dict(dict(d, num_classes=5))


def test_convert_info_and_export_handle_a_torchvision_detector(tmp_path, capsys):
    """tcnn convert torchvision:fasterrcnn_resnet50_fpn with builder arguments, tcnn info, and tcnn export: the model
    itself is one line saying why not, its backbone exports."""
    out = str(tmp_path / 't_frcnn.pt')
    assert main(['convert', 'torchvision:fasterrcnn_resnet50_fpn', '--out', out, '--model-kwargs', 'weights=DEFAULT',
                 'min_size=96']) == 2
    assert 'weights=...: this command sets weights itself; give it with --weights PATH' in capsys.readouterr().err
    rc = main(['convert', 'torchvision:fasterrcnn_resnet50_fpn', '--no-pretrained', '--num-classes', '3',
               '--model-kwargs', 'min_size=96', 'max_size=128', '--img-size', '96', '--out', out])
    text = capsys.readouterr().out
    assert rc == 0
    for line in ('torchvision:fasterrcnn_resnet50_fpn (random init, 3 classes)', '3 convs in backbone.body.layer4',
                 'backbone.body.layer4.0.conv2: 512->512, 3x3, stride 2 -> 9 heads', 'verified    exact'):
        assert line in text, (line, text)
    model = tcnn.load(out)
    assert model.tcnn_report.verdict in ('equivalent', 'rounding')  # reparameterize's check, stored in the file
    assert model.transform.min_size == (96,) and model.transform.max_size == 128
    assert model.roi_heads.box_predictor.cls_score.out_features == 3
    assert main(['info', out]) == 0
    text = capsys.readouterr().out
    assert "torchvision:fasterrcnn_resnet50_fpn, 3 classes, kwargs {'min_size': 96, 'max_size': 128}" in text
    assert 'none: a torchvision detection model resizes and normalises' in text
    assert main(['export', out, '--out', str(tmp_path / 'x.pt2')]) == 2
    err = capsys.readouterr().err
    assert 'a detection model: its resizing, anchors and NMS' in err and '--backbone' in err
    assert len(err.strip().splitlines()) == 1
    assert main(['export', out, '--out', str(tmp_path / 'x.pt2'), '--backbone', '--img-size', '64']) == 0
    text = capsys.readouterr().out
    assert 'output      logits (batch, 2048, 2, 2)' in text and 'checked     torch.export.load' in text


@pytest.fixture(scope='module')
def retinanet():
    """A RetinaNet that keeps every candidate (score_thresh 0): its random head scores them all near 0.01, so float32
    rounding swaps its top-k and NMS picks."""
    torch.manual_seed(0)
    cnn = create_cnn('torchvision:retinanet_resnet50_fpn', pretrained=False, num_classes=5, score_thresh=0.0,
                     **SMALL)
    return cnn, _convert(cnn)


def test_a_detectors_miss_is_told_rounding_or_wrong_conversion(retinanet):
    """check_equivalence on a detector: float32 boxes differ by ~0.5 of their scale (rounding swaps picks) while float64
    copies agree to ~1e-15: 'rounding'; one GPSA filter scaled by 1.05 misses in float64 too: 'wrong conversion'."""
    cnn, t_model = retinanet
    # whether rounding swaps picks depends on the draw, the CPU's kernels and the process's state (on 2026-11-26 draws
    # 0, 1, 3 and 5 kept the same picks, 1.6e-6, and draw 4 swapped them, 0.37; in a whole-suite run on an AMD EPYC,
    # 2026-12-04, draw 4 failed here): the first of a few draws that swaps them
    for seed in (4, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15):
        images = _images(seed)
        report = tcnn.check_equivalence(cnn, t_model, example_inputs=(images,))
        if report.max_rel_err > 0.1:
            break
    assert report.max_rel_err > 0.1 and report.float64_max_rel_err < 1e-12, report
    assert report.verdict == 'rounding' and 'verdict: rounding' in str(report)
    assert next(cnn.parameters()).dtype == next(t_model.parameters()).dtype == torch.float32  # put back
    layer = t_model.backbone.body.layer4[0].conv2
    saved = layer.proj_weight.detach().clone()
    try:
        with torch.no_grad():
            layer.proj_weight.mul_(1.05)
        report = tcnn.check_equivalence(cnn, t_model, example_inputs=(images,))
    finally:
        with torch.no_grad():
            layer.proj_weight.copy_(saved)
    assert report.verdict == 'wrong conversion' and report.float64_max_rel_err > 1e-3, report
