"""reparameterize / check_equivalence on whole timm and torchvision ResNets (random weights, no network)."""
import warnings

import pytest
import timm
import torch
import torch.nn as nn
import torchvision
from timm.layers import StdConv2d
from timm.models.resnet import Bottleneck, ResNet

import tcnn
from tcnn.convert.stages import ConversionError, find_convertible_convs

from nontrivial import nontrivial as _nontrivial_batchnorm


MODELS = {
    'resnet18d': lambda: timm.create_model('resnet18d'),
    'resnet50d': lambda: timm.create_model('resnet50d'),
    'resnetrs50': lambda: timm.create_model('resnetrs50', drop_path_rate=0.1),
    'torchvision-resnet50': lambda: torchvision.models.resnet50(),
}


@pytest.mark.parametrize('name', list(MODELS))
def test_whole_model_equivalence_at_two_sizes(name):
    torch.manual_seed(0)
    cnn = _nontrivial_batchnorm(MODELS[name]())
    before = {k: v.clone() for k, v in cnn.state_dict().items()}
    t_cnn = tcnn.reparameterize(cnn)  # verify=True: raises above 1e-4
    assert t_cnn.tcnn_report.max_rel_err <= 1e-5
    for size in [(3, 160, 160), (3, 97, 131)]:
        report = tcnn.check_equivalence(cnn, t_cnn, input_size=size)
        assert report.max_rel_err <= 1e-5, report
        assert report.init_max_rel_err > 1e-3, report  # the paper init is a different function
    # the original is untouched
    assert not tcnn.gpsa_layers(cnn)
    for k, v in cnn.state_dict().items():
        assert torch.equal(v, before[k]), k
    layers = [n for n, _ in tcnn.gpsa_layers(t_cnn)]
    assert layers == t_cnn.tcnn_config['layers'] and all(n.startswith('layer4.') for n in layers)
    assert len(layers) == (4 if name == 'resnet18d' else 3)


def test_exact_init_is_the_cnn_without_temporary_configuration():
    cnn = _nontrivial_batchnorm(timm.create_model('resnet26d'))
    t_cnn = tcnn.reparameterize(cnn, locality_strength=50, gating_init=25)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        ref, out = cnn(x), t_cnn(x)
    assert ((out - ref).abs().max() / ref.abs().max()) < 1e-5
    assert t_cnn.tcnn_report.init_max_rel_err < 1e-5


def test_paper_table2_parameter_counts():
    # T-CNN (arXiv:2106.05795) Table 2 (millions, rounded): built on the meta device, no memory or weights needed
    expected = {'resnetrs50': (36, 38), 'resnetrs101': (64, 66), 'resnetrs152': (87, 89), 'resnetrs200': (93, 96),
                'resnetrs270': (130, 133), 'resnetrs350': (164, 167)}
    for name, (cnn_m, t_m) in expected.items():
        with torch.device('meta'):
            cnn = timm.create_model(name)
            t_cnn = tcnn.reparameterize(cnn, verify=False)
        count = lambda m: round(sum(p.numel() for p in m.parameters()) / 1e6)  # noqa: E731
        assert (count(cnn), count(t_cnn)) == (cnn_m, t_m), name


def test_every_parameter_gets_a_gradient_in_train_mode():
    # non-trivial BN: timm zero-inits each block's last BN gamma, which would block the branch gradients
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d', num_classes=10))
    t_cnn = tcnn.reparameterize(cnn, verify=False).train()
    t_cnn(torch.randn(2, 3, 64, 64)).logsumexp(-1).mean().backward()
    missing = [n for n, p in t_cnn.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_size_change_and_dtype_change_after_first_forward():
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    t_cnn = tcnn.reparameterize(cnn)
    with torch.no_grad():
        assert t_cnn(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
        assert t_cnn(torch.randn(1, 3, 75, 50)).shape == (1, 1000)
    report = tcnn.check_equivalence(cnn.double(), t_cnn.double(), input_size=(3, 70, 90))
    assert report.dtype == 'float64' and report.max_rel_err < 1e-12


def test_several_stages_and_stage_names():
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    t_cnn = tcnn.reparameterize(cnn, stages=[3, 'layer4'], input_size=(3, 96, 96))
    layers = [n for n, _ in tcnn.gpsa_layers(t_cnn)]
    assert len(layers) == 8 and layers[0].startswith('layer3.')
    assert t_cnn.tcnn_report.max_rel_err < 1e-5


def test_grouped_convs_resnext_are_exact():
    cnn = _nontrivial_batchnorm(ResNet(Bottleneck, [1, 1, 1, 1], cardinality=8, base_width=4, num_classes=10))
    t_cnn = tcnn.reparameterize(cnn, input_size=(3, 64, 64))
    assert t_cnn.tcnn_report.max_rel_err < 1e-5


def test_vit_gets_a_clear_error():
    vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8)
    with pytest.raises(ConversionError, match=r'vit_tiny_patch16_224.*layer4'):
        tcnn.reparameterize(vit)
    with pytest.raises(ConversionError, match='no k x k convolution'):
        tcnn.reparameterize(vit, stages=['blocks.0'])


def test_unsupported_conv_names_the_layer():
    cnn = timm.create_model('resnet18d')
    cnn.layer4[1].conv2 = StdConv2d(512, 512, 3, padding=1, bias=False)
    with pytest.raises(ConversionError, match=r'layer4\.1\.conv2.*StdConv2d'):
        tcnn.reparameterize(cnn)
    with pytest.raises(ConversionError, match="no submodule 'layer9'"):
        find_convertible_convs(timm.create_model('resnet18d'), stages=9)


@pytest.fixture
def transposed_taps(monkeypatch):
    """A conversion bug: every GPSA layer's filter taps transposed (3x3 convs)."""
    from_conv = tcnn.GPSA.from_conv.__func__

    def transposed_from_conv(cls, conv, *args, **kwargs):
        layer = from_conv(cls, conv, *args, **kwargs)
        with torch.no_grad():
            w = layer.proj_weight.view(conv.out_channels, 3, 3, conv.in_channels)  # taps (ky, kx)
            layer.proj_weight.copy_(w.transpose(1, 2).reshape_as(layer.proj_weight))
        return layer

    monkeypatch.setattr(tcnn.GPSA, 'from_conv', classmethod(transposed_from_conv))


def test_verification_catches_a_wrong_conversion(transposed_taps):
    # a conversion bug (filter taps transposed) must be caught by verify=True, not silently returned
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    with pytest.raises(ConversionError, match='does not reproduce.*in float64'):
        tcnn.reparameterize(cnn, input_size=(3, 64, 64))


def test_float32_miss_is_rechecked_in_float64():
    # A tolerance below float32 rounding stands in for an ill-conditioned network: the float64 check tells rounding
    # from a wrong conversion, and the model comes back in float32 with the same parameter objects.
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    params = dict(cnn.named_parameters())
    with pytest.warns(UserWarning, match='amplifies float32 rounding'):
        model = tcnn.reparameterize_(cnn, input_size=(3, 64, 64), tol=1e-10)
    report = model.tcnn_report
    assert report.max_rel_err > 1e-10 > report.float64_max_rel_err and report.passed(1e-10)
    assert 'float64' in str(report)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    kept = [(params[name], p) for name, p in model.named_parameters() if name in params]
    assert len(kept) > 50 and all(old is new for old, new in kept)  # every parameter but the replaced convs'


def test_vacuous_check_is_flagged():
    # timm's random init zeroes the last BN of every residual block: layer4's convs then do not reach the logits
    with pytest.warns(UserWarning, match='proves nothing'):
        report = tcnn.reparameterize(timm.create_model('resnet18d'), input_size=(3, 64, 64)).tcnn_report
    assert report.vacuous and 'vacuous' in str(report)
    report = tcnn.reparameterize(_nontrivial_batchnorm(timm.create_model('resnet18d')),
                                 input_size=(3, 64, 64)).tcnn_report
    assert not report.vacuous and report.sensitivity > 1e-3


def test_in_place_reparameterization_keeps_other_parameters():
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    reference = tcnn.reparameterize(cnn, input_size=(3, 64, 64))
    kept = {n: p for n, p in cnn.named_parameters() if not n.startswith(('layer4.0.conv', 'layer4.1.conv'))}
    out = tcnn.reparameterize_(cnn, input_size=(3, 64, 64))
    assert out is cnn and len(tcnn.gpsa_layers(cnn)) == 4
    assert cnn.tcnn_report.max_rel_err < 1e-5
    params = dict(cnn.named_parameters())
    assert all(params[n] is p for n, p in kept.items())  # same objects: an optimiser keeps its state
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), tcnn.exact_configuration(cnn), tcnn.exact_configuration(reference):
        torch.testing.assert_close(cnn.eval()(x), reference.eval()(x))  # q/k are random: compare the conv function


def test_failed_in_place_verification_restores_the_cnn(monkeypatch):
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d'))
    with pytest.raises(ConversionError):
        tcnn.reparameterize_(cnn, tol=1e-30, input_size=(3, 64, 64))  # a tolerance float64 cannot meet
    assert not tcnn.gpsa_layers(cnn) and not hasattr(cnn, 'tcnn_config')
    assert isinstance(cnn.layer4[0].conv1, nn.Conv2d)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_conversion_is_rechecked_in_float64(dtype, request):
    """A right float16 conversion misses 1e-4 by rounding alone and passes on its float64 re-check (with a warning
    naming the amplified rounding); a right bfloat16 one on the CPU mostly matches in its own dtype (the conv and the
    GPSA layer both accumulate in float32 and round once to bfloat16; where one output rounds the other way, the
    float64 re-check decides as for float16). Both stay in their own dtype with the same
    parameter objects; a wrong conversion is refused in float64 too."""
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d')).to(dtype)
    params = dict(cnn.named_parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = tcnn.reparameterize_(cnn, input_size=(3, 64, 64))
    report = model.tcnn_report
    amplified = [w for w in caught if f'amplifies {str(dtype)[6:]} rounding' in str(w.message)]
    assert report.dtype == str(dtype)[6:]
    if dtype == torch.float16 or report.max_rel_err > 1e-4:  # bfloat16 too where a layer4 output rounds otherwise
        assert amplified and report.max_rel_err > 1e-4 > 1e-10 > report.float64_max_rel_err
    else:
        assert not amplified and report.float64_max_rel_err is None
    assert all(p.dtype == dtype for p in model.parameters()) and all(b.dtype == dtype for b in model.buffers()
                                                                     if b.is_floating_point())
    assert all(params[n] is p for n, p in model.named_parameters() if n in params)
    request.getfixturevalue('transposed_taps')  # a conversion bug: filter taps transposed
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d')).to(dtype)
    with pytest.raises(ConversionError, match='does not reproduce.*in float64'):
        tcnn.reparameterize(cnn, input_size=(3, 64, 64))


def _small_detector() -> nn.Module:
    """torchvision's Faster R-CNN on a ResNet-18 FPN: random weights, small images, few proposals (fast)."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name='resnet18', weights=None, trainable_layers=5)
    return FasterRCNN(backbone, num_classes=3, min_size=64, max_size=64, rpn_pre_nms_top_n_test=100,
                      rpn_post_nms_top_n_test=50, box_detections_per_img=20).eval()


def test_detection_model_nested_outputs_and_example_inputs():
    """A detection model returns a list of dicts of tensors: compared leaf by leaf, on random images or on the
    caller's list of images (the model's own input type)."""
    detector = _small_detector()
    t_model = tcnn.reparameterize(detector, stages='backbone.body.layer4', input_size=(3, 64, 64))
    report = t_model.tcnn_report
    assert report.passed() and report.output.startswith('[') and not report.vacuous
    images = [torch.rand(3, 64, 56, generator=torch.Generator().manual_seed(1)), torch.rand(3, 48, 64)]
    for example in (images, (images,)):  # the list itself, or a tuple of forward arguments holding it
        report = tcnn.check_equivalence(detector, t_model, example_inputs=example)
        assert report.passed() and 'example tensors (3x64x56, 3x48x64)' in str(report)
    with torch.no_grad(), tcnn.exact_configuration(t_model):
        ref, out = detector(images), t_model(images)
    assert len(ref) == len(out) == 2 and ref[0]['boxes'].shape == out[0]['boxes'].shape
    assert tcnn.reparameterize(detector, stages='backbone.body.layer4', example_inputs=(images,)).tcnn_report.passed()


def test_segmentation_model_and_features_only_backbone():
    """A segmentation model's dict of maps and a timm features_only backbone's list of feature maps."""
    torch.manual_seed(0)
    seg = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=3,
                                                        aux_loss=False).eval()
    report = tcnn.reparameterize(seg, stages='backbone.layer4', input_size=(3, 48, 48)).tcnn_report
    assert report.output == "['out']" and report.max_rel_err < 1e-5 and report.init_max_rel_err > 1e-3
    backbone = _nontrivial_batchnorm(timm.create_model('resnet18d', features_only=True))
    t_backbone = tcnn.reparameterize(backbone, stages='layer4', input_size=(3, 64, 64))
    report = t_backbone.tcnn_report
    assert report.max_rel_err < 1e-5 and not report.vacuous and report.output.startswith('[')
    with torch.no_grad():
        features = t_backbone(torch.randn(1, 3, 64, 64))
    assert isinstance(features, list) and len(features) == 5


def test_a_model_that_cannot_take_the_random_input_is_one_line():
    class Masked(nn.Module):  # a forward that needs a second argument
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.head = nn.Linear(8, 2)

        def forward(self, x, mask):
            return self.head((self.conv(x) * mask).mean((2, 3)))

    model = Masked().eval()
    with pytest.raises(tcnn.TcnnError, match=r'input_size \(3, 16, 16\) does not fit the model \(Masked\): '
                                             r'TypeError: .*mask.*example_inputs') as info:
        tcnn.reparameterize(model, stages='conv', input_size=(3, 16, 16))
    assert '\n' not in str(info.value)
    x, mask = torch.randn(2, 3, 16, 16), torch.rand(2, 1, 16, 16)
    t_model = tcnn.reparameterize(model, stages='conv', example_inputs=(x, mask))
    assert t_model.tcnn_report.max_rel_err < 1e-5 and t_model.tcnn_report.output == ''
    for kwargs, message in (({'example_inputs': (x, mask), 'input_size': (3, 16, 16)}, 'not both'),
                            ({'example_inputs': 'an image'}, 'at least one tensor')):
        with pytest.raises(tcnn.TcnnError, match=message):
            tcnn.check_equivalence(model, t_model, **kwargs)


def test_a_second_conversion_is_refused_at_once():
    """Converting a T-CNN again fails on the call (not at tcnn.save), names the fix, and changes nothing."""
    cnn = timm.create_model('resnet18d')
    t_cnn = tcnn.reparameterize(cnn, verify=False)
    before = [n for n, _ in tcnn.gpsa_layers(t_cnn)]
    for convert in (tcnn.reparameterize, tcnn.reparameterize_):
        with pytest.raises(ConversionError, match=r"T-CNN already: 4 GPSA layers \(layer4\).*stages=\['layer3', "
                                                  r"'layer4'\]") as info:
            convert(t_cnn, stages='layer3', verify=False)
        assert '\n' not in str(info.value)
    assert [n for n, _ in tcnn.gpsa_layers(t_cnn)] == before and t_cnn.tcnn_config['stages'] == ['layer4']
    both = tcnn.reparameterize(cnn, stages=['layer3', 'layer4'], verify=False)  # the way that works
    assert both.tcnn_config['stages'] == ['layer3', 'layer4'] and len(tcnn.gpsa_layers(both)) == 8
