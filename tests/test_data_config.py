"""tcnn.data.config: a model's eval preprocessing, the one place tcnn asks for it. A timm model's is timm's; a
torchvision classifier's is its default weights' eval transform (torchvision's ResNet-50 V2 weights: resize 232,
crop 224, bilinear), a segmentation model's its normalisation, a detector's nothing (it normalises itself). The
expected values are torchvision's published weight transforms, written out here."""
import pytest
import timm
import torch.nn as nn
import torchvision

from tcnn.data.config import DATA_CONFIG_KEYS, _torchvision_data_config, data_config, dense_data_config
from tcnn.errors import TcnnError

IMAGENET = {'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225)}


@pytest.mark.parametrize('arch, crop, resize, interpolation', [
    ('resnet50', 224, 232, 'bilinear'),  # IMAGENET1K_V2
    ('vit_b_16', 224, 256, 'bilinear'),
    ('efficientnet_b3', 300, 320, 'bicubic'),
])
def test_a_torchvision_classifiers_config_is_its_default_weights_eval_transform(arch, crop, resize, interpolation):
    assert _torchvision_data_config(arch) == {'input_size': (3, crop, crop), 'interpolation': interpolation,
                                              **IMAGENET, 'crop_pct': crop / resize, 'crop_mode': 'center'}


@pytest.mark.parametrize('arch', ['fasterrcnn_resnet50_fpn', 'deeplabv3_resnet50', 'no_such_model'])
def test_a_model_without_a_classifiers_eval_transform_has_no_torchvision_config(arch):
    assert _torchvision_data_config(arch) is None


def test_a_dense_models_config_is_what_its_weights_transform_applies_before_the_model():
    assert dense_data_config('torchvision:deeplabv3_resnet50') == {'interpolation': 'bilinear', **IMAGENET}
    assert dense_data_config('torchvision:lraspp_mobilenet_v3_large') == {'interpolation': 'bilinear', **IMAGENET}
    assert dense_data_config('deeplabv3_resnet50') == dense_data_config('torchvision:deeplabv3_resnet50')
    for detector in ('torchvision:fasterrcnn_resnet50_fpn', 'torchvision:ssdlite320_mobilenet_v3_large'):
        assert dense_data_config(detector) == {}  # it resizes and normalises images in [0, 1] itself
    assert dense_data_config('torchvision:no_such_model') == {}
    assert dense_data_config('torchvision:x:deeplabv3_resnet50') == {}  # the whole name after the prefix, or nothing


def test_data_config_of_a_torchvision_model_follows_its_weights_and_of_a_timm_model_timms():
    model = torchvision.models.resnet18()
    model.tcnn_source = {'model': 'torchvision:resnet18'}
    assert data_config(model) == {'input_size': (3, 224, 224), 'interpolation': 'bilinear', **IMAGENET,
                                  'crop_pct': 224 / 256, 'crop_mode': 'center'}
    assert data_config(model, img_size=(160, 192), crop_pct=0.5) == {
        'input_size': (3, 160, 192), 'interpolation': 'bilinear', **IMAGENET, 'crop_pct': 0.5, 'crop_mode': 'center'}
    # the whole name after the prefix, or timm's defaults (no torchvision model is named 'x')
    model.tcnn_source = {'model': 'torchvision:x:resnet18'}
    assert data_config(model) == data_config(nn.Linear(2, 2))  # bicubic, not torchvision's bilinear
    # a stored config (what tcnn.load puts in pretrained_cfg) comes before the weights' transform
    model.tcnn_source = {'model': 'torchvision:resnet18'}
    model.pretrained_cfg = {'input_size': (3, 160, 160), 'crop_pct': 0.95, 'interpolation': 'bicubic',
                            'mean': (0.5, 0.5, 0.5), 'std': (0.25, 0.25, 0.25), 'crop_mode': 'squash'}
    assert data_config(model) == model.pretrained_cfg
    timm_model = timm.create_model('resnet18d', pretrained=False)
    cfg = data_config(timm_model, img_size=96)
    assert tuple(cfg) == DATA_CONFIG_KEYS and cfg['input_size'] == (3, 96, 96) and cfg['crop_pct'] == 0.875
    assert data_config(timm_model, use_test_size=True)['input_size'] == (3, 288, 288)  # resnet18d's test size
    plain = nn.Linear(2, 2)  # no pretrained_cfg, no recorded source: timm's ImageNet defaults, centre crop
    assert data_config(plain) == {'input_size': (3, 224, 224), 'interpolation': 'bicubic', **IMAGENET,
                                  'crop_pct': 0.875, 'crop_mode': 'center'}


def test_a_bad_input_size_or_crop_is_refused_under_the_name_the_caller_gives_it():
    from tcnn.data.config import check_image_options

    def refusal(img_size, crop_pct, **kwargs):
        with pytest.raises(TcnnError) as info:
            check_image_options(img_size, crop_pct, **kwargs)
        return str(info.value)
    flags = dict(names=('--img-size', '--crop-pct'))
    assert refusal((1, 2, 3), None, **flags) == '--img-size must be 2 positive integers (H, W), got (1, 2, 3)'
    assert refusal((0, 5), None, **flags) == '--img-size must be >= 1, got 0'
    assert refusal(0, None, **flags) == '--img-size must be >= 1, got 0'
    assert refusal((4, 4), 0, **flags) == '--crop-pct must be > 0, got 0'
    assert refusal([4, 4, 4], None) == 'img_size must be 2 positive integers (H, W), got [4, 4, 4]'
    assert refusal(9.0, None) == 'img_size must be an integer, got 9.0 (float)'
    assert check_image_options(1, 1.0) is None and check_image_options((1, 1), 1e-3) is None  # the bounds themselves
    with pytest.raises(TcnnError, match=r'^img_size must be 2 positive integers \(H, W\), got \(1, 2, 3\)$'):
        data_config(nn.Conv2d(3, 3, 1), img_size=(1, 2, 3))
    with pytest.raises(TcnnError, match=r'^crop_pct must be <= 1, got 1.5$'):
        data_config(nn.Conv2d(3, 3, 1), crop_pct=1.5)
