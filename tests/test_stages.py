"""Stages of any timm / torchvision CNN: resolution (names, paths, patterns, levels, defaults), ``list_stages`` and
``tcnn convert --list-stages``, and exact conversions of RegNet, ConvNeXt, EfficientNet, MobileNetV3, ResNeXt
(random weights with non-trivial normalisation statistics and layer scales, so that the checks are not vacuous)."""
import time
from collections import OrderedDict

import pytest
import timm
import torch
import torch.nn as nn
import torchvision

import tcnn
from nontrivial import nontrivial
from tcnn.cli import main
from tcnn.convert.stages import ConversionError, default_stage, find_convertible_convs, list_stages, resolve_stages


def _timm(name: str) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name)


def _tv(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    model.tcnn_source = {'model': f'torchvision:{name}'}  # the name in messages, as create_cnn sets it
    return model


_BUILT = {}


def _model(name: str) -> nn.Module:
    """A shared random model (``tv:NAME`` for torchvision); callers must not modify it."""
    if name not in _BUILT:
        _BUILT[name] = _tv(name[3:]) if name.startswith('tv:') else _timm(name)
    return _BUILT[name]


# ---------------------------------------------------------------------------------------------- resolution


@pytest.mark.parametrize('name, stages, expected', [
    ('resnet18d', None, ['layer4']),
    ('resnet18d', 3, ['layer3']),
    ('resnet18d', [3, 'layer3.0'], ['layer3']),  # a module inside another selected one adds nothing
    ('resnet18d', 'layer4.1', ['layer4.1']),
    ('resnet18d', 'layer4.*.conv2', ['layer4.0.conv2', 'layer4.1.conv2']),
    ('seresnext26d_32x4d', None, ['layer4']),
    ('resnext26ts', None, ['stages.3']),  # final_conv (feature_info's last entry) is 1x1
    ('resnext26ts', 4, ['stages.3', 'final_conv']),
    ('regnety_002', None, ['s4']),
    ('regnety_002', [1, 's2'], ['s1', 's2']),
    ('convnext_atto', None, ['stages.3']),
    ('convnext_atto', 4, ['stages.3']),
    ('convnext_atto', 'stages.3.blocks.*.conv_dw', ['stages.3.blocks.0.conv_dw', 'stages.3.blocks.1.conv_dw']),
    ('efficientnet_b0', None, ['blocks.6']),
    ('efficientnet_b0', 4, ['blocks.5', 'blocks.6']),  # every stage at 1/32 of the input
    ('efficientnet_b0', 'blocks.5.[12].conv_dw', ['blocks.5.1.conv_dw', 'blocks.5.2.conv_dw']),
    ('mobilenetv3_large_100', None, ['blocks.5']),  # blocks.6 is a 1x1 conv
    ('mobilenetv3_small_050', None, ['blocks.4']),
    ('tv:resnext50_32x4d', None, ['layer4']),
    ('tv:regnet_y_400mf', None, ['trunk_output.block4']),
    ('tv:regnet_y_400mf', 2, ['trunk_output.block2']),
    ('tv:convnext_tiny', None, ['features.7']),
    ('tv:convnext_tiny', 4, ['features.6', 'features.7']),  # measured levels: the downsample and the stage
    ('tv:efficientnet_b0', None, ['features.7']),  # features.8 is 1x1
])
def test_resolve_stages_selects_numbered_named_and_default_stages(name, stages, expected):
    model = _model(name)
    assert resolve_stages(model, stages) == expected
    if stages is None:
        assert default_stage(model) == expected[0]


@pytest.mark.parametrize('name, stages, message', [
    ('resnet18d', 9, "resnet18d has no submodule 'layer9' (stage given as 9); stages of resnet18d: layer1, layer2, "
                     'layer3, layer4'),
    ('convnext_atto', 'stage3', "convnext_atto has no submodule 'stage3'; stages of convnext_atto: stages.0, "
                                'stages.1, stages.2, stages.3'),
    ('regnety_002', 'S4', "regnety_002 has no submodule 'S4'; stages of regnety_002: stem, s1, s2, s3, s4"),
    ('efficientnet_b0', 'blocks.*.conv_pw_typo', "no module of efficientnet_b0 matches 'blocks.*.conv_pw_typo'; "
                                                 'stages of efficientnet_b0: blocks.0, blocks.1'),
    ('efficientnet_b0', 5, 'efficientnet_b0 has no stage at level 5 (an int i is the resolution 1/2**(i+1) of the '
                           "input, as ResNet's layer{i}); stages (level): blocks.0 (0), blocks.1 (1)"),
    ('tv:convnext_tiny', 'features.9', "torchvision:convnext_tiny has no submodule 'features.9'; stages of "
                                       'torchvision:convnext_tiny: features.0, features.1'),
    ('vit_tiny_patch16_224', None, 'vit_tiny_patch16_224 has no stage with a k x k convolution (searched for layer1, '
                                   'layer2, layer3, layer4'),
])
def test_bad_stages_are_one_line_errors_listing_candidates(name, stages, message):
    with pytest.raises(ConversionError) as info:
        resolve_stages(_model(name), stages)
    assert message in str(info.value) and '\n' not in str(info.value)
    assert len(str(info.value)) < 400  # long stage lists are abridged


def test_converted_model_keeps_its_default_stage():
    """A T-CNN's converted stage (GPSA layers, no convs left) stays its default, and converting again is an error
    naming the converted stage, not a silent conversion of the stage before it."""
    model = timm.create_model('t_convnext_atto')
    assert default_stage(model) == 'stages.3' == resolve_stages(model, 4)[0]
    with pytest.raises(ConversionError, match=r'is a T-CNN already: 3 GPSA layers \(stages\.3\).*convert every stage '
                                              r'in one call'):
        tcnn.reparameterize(model, verify=False)


def test_unconvertible_convs_name_the_layer():
    model = _model('tf_efficientnet_b0')
    assert resolve_stages(model) == ['blocks.6']  # stride 1: timm pads it statically, a plain Conv2d
    with pytest.raises(ConversionError, match=r'tf_efficientnet_b0: cannot reproduce blocks\.5\.0\.conv_dw exactly: '
                                              r'Conv2dSame .*asymmetrically') as info:
        find_convertible_convs(model, 4)
    assert '\n' not in str(info.value)
    with pytest.raises(ConversionError, match=r'blocks\.6\.0\.conv_dw exactly: CondConv2d'):
        find_convertible_convs(timm.create_model('efficientnet_cc_b0_4e'))


def test_a_resnet_without_its_last_stage_keeps_its_stage_names():
    """A ResNet cut after ``layer3`` (a backbone) still has ResNet stages: the default is its last, ``layer3``, and
    stage numbers name ``layer{i}``."""
    model = _tv('resnet18')
    del model.layer4
    assert default_stage(model) == 'layer3' and resolve_stages(model, 2) == ['layer2']


def test_stages_of_a_wrong_type_are_refused_word_for_word():
    """``stages`` is None, an int, a string or a non-empty list of ints and strings (no booleans); a module nested
    in another selected one is dropped, and a stage named twice counts once."""
    model = _model('resnet18d')
    for stages in (1.5, [], ['layer4', True], ('layer4', None), {'layer4': 1}):
        with pytest.raises(tcnn.TcnnError) as info:
            resolve_stages(model, stages)
        assert str(info.value) == ('stages must be None, a stage number (1-4), a module name or pattern, or a '
                                   f'non-empty list of those, got {stages!r}')
    with pytest.raises(tcnn.TcnnError, match='^model must be a torch.nn.Module, got str$'):
        resolve_stages('resnet18d', 'layer4')
    assert resolve_stages(model, ('layer4', 3, 'layer4.0', 'layer3.1.conv1', 4)) == ['layer4', 'layer3']


def test_the_default_stage_skips_the_stem_by_level_or_else_by_position():
    """The default stage is the last one with a k x k conv, less the stem: the stages at level 0 where every stage
    has a level (a first stage at level 1 may be the default), else the first stage; without one, the message names
    where it looked (and the stages it found) word for word."""
    model = nn.Module()
    model.a = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1))
    model.b = nn.Sequential(nn.Conv2d(3, 3, 1))
    model.feature_info = [{'module': 'a', 'reduction': 4}, {'module': 'b', 'reduction': 8}]
    assert default_stage(model) == 'a'
    for info in ([{'module': 'a', 'reduction': 2}, {'module': 'b', 'reduction': 8}],  # a at level 0: the stem
                 [{'module': 'a', 'reduction': 4}, {'module': 'b'}]):  # b's level unknown: a, the first, is the stem
        model.feature_info = info
        with pytest.raises(ConversionError, match=r'^Module has no stage with a k x k convolution .*its stages a, b '
                                                  r'have none\)'):
            default_stage(model)
    plain = nn.Module()  # no levels: the stages of a container, the first one the stem
    plain.features = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 3), nn.Conv2d(3, 3, 1))
    assert default_stage(plain) == 'features.1'
    searched = ("has no stage with a k x k convolution (searched for layer1, layer2, layer3, layer4, timm's "
                'feature_info and trunk_output/stages/features/blocks/layers')
    fix = ': pass stages=[...] naming the modules whose k x k convs to replace'
    for model, message in (
            (nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), f'Sequential {searched}){fix}'),
            (timm.create_model('vit_tiny_patch16_224'),
             f'vit_tiny_patch16_224 {searched}; its stages blocks.0, blocks.1, blocks.2, blocks.3, ..., blocks.8, '
             f'blocks.9, blocks.10, blocks.11 (12) have none){fix}')):
        with pytest.raises(ConversionError) as info:
            default_stage(model)
        assert str(info.value) == message


def test_model_name_in_messages_is_the_source_then_the_timm_architecture_then_the_class():
    """A model's name in messages: where tcnn made it (``tcnn_source``: the torchvision builder too), else timm's
    architecture, else its class (also when ``pretrained_cfg`` names no architecture)."""
    from tcnn.convert.stages import model_name
    model = timm.create_model('resnet18d', num_classes=3)
    assert model_name(model) == 'resnet18d'
    model.tcnn_source = {'model': 'torchvision:resnet18', 'kwargs': {}}
    assert model_name(model) == 'torchvision:resnet18'
    model.tcnn_source = {}
    assert model_name(model) == 'resnet18d'
    model.pretrained_cfg = {'input_size': (3, 224, 224)}
    assert model_name(model) == 'ResNet'
    assert model_name(torchvision.models.resnet18()) == 'ResNet'


def test_unsupported_convs_are_refused_word_for_word_and_the_others_found():
    """Every kind of conv a GPSA layer cannot reproduce, refused with its reason; a 1 x k conv is a k x k conv
    (found), a 1 x 1 conv is not, and ``padding='same'`` is refused only where it pads asymmetrically."""
    from timm.layers import CondConv2d, Conv2dSame, StdConv2d

    class OwnPadding(nn.Conv2d):
        def _conv_forward(self, x, weight, bias):
            return super()._conv_forward(x, weight, bias)

    def stage(conv):
        model = nn.Module()
        model.layer = nn.Sequential(nn.Conv2d(3, 3, 1), conv)
        return model

    refused = 'Module: cannot reproduce layer.1 exactly: '
    for conv, reason in (
            (Conv2dSame(3, 3, 3), 'Conv2dSame (timm tf_* models) pads TensorFlow-style at run time, asymmetrically '
                                  'for strided convs, and GPSA pads symmetrically; use the model without tf_'),
            (CondConv2d(3, 3, 3), 'CondConv2d (timm *_cc_* models) mixes expert filters per sample; a GPSA layer '
                                  'holds one fixed filter'),
            (StdConv2d(3, 3, 3), 'StdConv2d overrides nn.Conv2d.forward (e.g. weight standardisation or dynamic '
                                 'padding)'),
            (OwnPadding(3, 3, 3), 'OwnPadding overrides nn.Conv2d.forward (e.g. weight standardisation or dynamic '
                                  'padding)'),
            (nn.Conv2d(3, 3, 4, padding='same'), 'padding="same" with an even kernel pads asymmetrically'),
            (nn.Conv2d(3, 3, (3, 2), padding='same'), 'padding="same" with an even kernel pads asymmetrically')):
        with pytest.raises(ConversionError) as info:
            find_convertible_convs(stage(conv), 'layer')
        assert str(info.value) == refused + reason
    for conv in (nn.Conv2d(3, 3, (1, 3)), nn.Conv2d(3, 3, (1, 2)), nn.Conv2d(3, 3, 2, padding='same', dilation=2),
                 nn.Conv2d(3, 3, 3, padding='same')):
        assert find_convertible_convs(stage(conv), 'layer') == [('layer.1', conv)]
    pointwise = stage(nn.Conv2d(3, 3, 1))
    pointwise.head = nn.Conv2d(3, 3, 1)
    with pytest.raises(ConversionError) as info:
        find_convertible_convs(pointwise, ['layer', 'head'])
    assert str(info.value) == 'Module: no k x k convolution (k > 1) in layer, head; nothing to reparameterise'


# ---------------------------------------------------------------------------------------------- list_stages


def test_list_stages_describes_every_stage():
    rows = list_stages(_model('convnext_atto'), input_size=(3, 64, 64))
    assert [r.name for r in rows] == ['stages.0', 'stages.1', 'stages.2', 'stages.3']
    assert [r.default for r in rows] == [False, False, False, True] and [r.level for r in rows] == [1, 2, 3, 4]
    last = rows[-1]
    assert last.convs == 3 and last.conv_kinds == {'2x2/2 dense': 1, '7x7 depthwise': 2}
    assert (last.in_chs, last.out_chs, last.in_grid, last.out_grid) == (160, 320, (4, 4), (2, 2))
    assert last.tokens == (8, 8) and last.exact and last.unsupported == {}  # 2x2 grid padded by 3 for the 7x7
    rows = {r.name: r for r in list_stages(_model('mobilenetv3_large_100'), input_size=(3, 96, 96))}
    assert rows['blocks.6'].convs == 0 and not rows['blocks.6'].exact and rows['blocks.5'].default
    assert rows['blocks.0'].level == 0 and rows['blocks.5'].level == 4 and rows['blocks.5'].out_grid == (3, 3)
    rows = {r.name: r for r in list_stages(_model('tf_efficientnet_b0'), input_size=(3, 64, 64))}
    assert not rows['blocks.5'].exact and list(rows['blocks.5'].unsupported) == ['blocks.5.0.conv_dw']
    assert 'Conv2dSame' in rows['blocks.5'].unsupported['blocks.5.0.conv_dw'] and rows['blocks.6'].exact
    rows = list_stages(_model('tv:regnet_y_400mf'), input_size=(3, 64, 64))
    assert [r.level for r in rows] == [1, 2, 3, 4] and rows[-1].conv_kinds == {'3x3/2 grouped g55': 1,
                                                                               '3x3 grouped g55': 5}


def test_convert_list_stages_prints_the_stage_table(capsys):
    start = time.perf_counter()
    assert main(['convert', '--list-stages', 'convnext_tiny']) == 0  # random init, offline, nothing written
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'convnext_tiny: 4 stages at 3x224x224 (random init); default stages.3 (*)'
    assert out[1].split() == ['stage', 'level', 'channels', 'grid', 'tokens', 'k', 'x', 'k', 'convs', 'exact']
    assert out[5].split() == ['stages.3', '*', '4', '384->768', '7x7', '14x14', '1', '2x2/2', 'dense,', '3', '7x7',
                              'depthwise', 'yes']
    assert elapsed < 60, elapsed  # about 1 s in process; a guard against a hang, not a speed goal (see benchmarks/)
    assert main(['convert', '--list-stages', 'torchvision:efficientnet_b0', '--img-size', '64']) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:11]}
    assert 'default features.7 (*)' in out and list(rows) == [f'features.{i}' for i in range(9)]
    assert rows['features.7'][0] == '*' and rows['features.8'] == ['4', '320->1280', '2x2', '-', 'none', '(1x1',
                                                                   'only)', '-']
    assert main(['convert', '--list-stages', 'tf_efficientnet_b0', '--img-size', '64']) == 0
    out = capsys.readouterr().out
    assert 'no (1)' in out and '(1) blocks.1.0.conv_dw, blocks.2.0.conv_dw, blocks.3.0.conv_dw, blocks.5.0.conv_dw: ' \
                               'Conv2dSame' in out


# ---------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize('name, stages, layers', [
    ('regnety_002', None, 7),  # grouped 3x3 + SE
    ('convnext_atto', None, 3),  # 2x2 stride-2 downsample + depthwise 7x7
    ('convnext_atto', 'stages.2.blocks.*.conv_dw', 6),
    ('efficientnet_b0', 4, 5),  # depthwise 5x5 (strided) and 3x3
    ('mobilenetv3_large_100', None, 3),  # depthwise 5x5, hard-swish, SE
    ('resnext26ts', None, 2),
    ('seresnext26d_32x4d', None, 2),
    ('tv:resnext50_32x4d', None, 3),
    ('tv:regnet_y_400mf', None, 6),
    ('tv:convnext_tiny', None, 3),
    ('tv:efficientnet_b0', None, 1),
])
def test_every_family_converts_exactly(name, stages, layers):
    cnn = nontrivial(_model(name))
    t_cnn = tcnn.reparameterize(cnn, stages=stages, input_size=(3, 64, 64))
    report = t_cnn.tcnn_report
    assert len(tcnn.gpsa_layers(t_cnn)) == layers == len(t_cnn.tcnn_config['layers'])
    assert report.max_rel_err < 1e-5 and report.sensitivity > 1e-3, report  # exact, and the check can see it
    odd = tcnn.check_equivalence(cnn, t_cnn, input_size=(3, 80, 72))
    assert odd.max_rel_err < 1e-5 and odd.init_max_rel_err > 1e-3, odd  # the paper init is another function


def test_convert_command_rebuilds_another_family_as_its_registry_model(tmp_path, capsys):
    """A ConvNeXt through the command with a pattern: the file rebuilds as the t_* registry model."""
    path = str(tmp_path / 't.pt')
    assert main(['convert', 'convnext_atto', '--no-pretrained', '--out', path, '--img-size', '64',
                 '--stages', 'stages.3.blocks.*.conv_dw']) == 0
    out = capsys.readouterr().out
    assert '2 convs in stages.3.blocks.0.conv_dw, stages.3.blocks.1.conv_dw' in out
    assert 'tiny layer scales' in out  # random-init ConvNeXt blocks are scaled by 1e-6: the check is vacuous
    model = tcnn.load(path)
    assert type(model).__name__ == 'TransformedConvNeXt'
    assert [n for n, _ in tcnn.gpsa_layers(model)] == ['stages.3.blocks.0.conv_dw', 'stages.3.blocks.1.conv_dw']


def test_a_torchvision_t_cnn_other_than_a_resnet_round_trips():
    """A torchvision T-CNN other than a ResNet (classifier.1, not fc) saves with its class count and rebuilds."""
    from tcnn.files.sources import classifier_layer, create_cnn
    cnn = nontrivial(create_cnn('torchvision:efficientnet_b0', pretrained=False, num_classes=7))
    name, head = classifier_layer(cnn)
    assert name == 'classifier.1' and head.out_features == 7
    t_cnn = tcnn.reparameterize(cnn, input_size=(3, 64, 64))
    d = tcnn.files.tcnn_file.model_to_dict(t_cnn)
    assert d['num_classes'] == 7 and d['conversion']['stages'] == ['features.7']
    rebuilt = tcnn.files.tcnn_file.model_from_dict(d)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), t_cnn(x), rtol=0, atol=0)


@pytest.mark.parametrize('name, stages, message', [
    # eight stages are listed in full, more by their four first and four last with the count
    ('tv:convnext_tiny', 'nope', "torchvision:convnext_tiny has no submodule 'nope'; stages of "
                                 'torchvision:convnext_tiny: features.0, features.1, features.2, features.3, '
                                 'features.4, features.5, features.6, features.7'),
    ('tv:efficientnet_b0', 'nope', "torchvision:efficientnet_b0 has no submodule 'nope'; stages of "
                                   'torchvision:efficientnet_b0: features.0, features.1, features.2, features.3, ..., '
                                   'features.5, features.6, features.7, features.8 (9)'),
    ('tv:mobilenet_v2', 'nope', "torchvision:mobilenet_v2 has no submodule 'nope'; stages of torchvision:mobilenet_v2: "
                                'features.0, features.1, features.2, features.3, ..., features.15, features.16, '
                                'features.17, features.18 (19)'),
    ('plain', 'nope', "Sequential has no submodule 'nope'; it has no known stages; name any module path or pattern"),
])
def test_bad_stage_messages_word_for_word(name, stages, message):
    model = nn.Sequential(nn.Flatten(), nn.Linear(10, 2)) if name == 'plain' else _model(name)
    with pytest.raises(ConversionError) as info:
        resolve_stages(model, stages)
    assert str(info.value) == message


def test_stage_levels_are_measured_with_the_models_input_channels():
    """A torchvision model (no ``feature_info``) has its stage levels measured by a forward pass, on an image with
    the channels its first conv takes (here 1: a grey-scale model); a model without a conv has no levels to measure."""
    from tcnn.convert.stages import stage_levels
    model = _tv('mobilenet_v3_small')
    model.features[0][0] = nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False)
    levels = dict(stage_levels(model))
    assert [levels[f'features.{i}'] for i in (0, 1, 3, 8, 12)] == [0, 1, 2, 3, 4]
    assert resolve_stages(model, 4) == ['features.9', 'features.10', 'features.11', 'features.12']

    class NoConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    assert stage_levels(NoConv()) == [('features.0', None), ('features.1', None)]


def test_conv_kinds_name_their_kernel_stride_and_groups():
    """``list_stages``' conv kinds: kernel, stride (both when they differ), and dense / depthwise / grouped."""
    from tcnn.convert.stages import _conv_kind
    assert _conv_kind(nn.Conv2d(8, 8, 3)) == '3x3 dense'
    assert _conv_kind(nn.Conv2d(8, 8, (3, 5), stride=2, groups=8)) == '3x5/2 depthwise'
    assert _conv_kind(nn.Conv2d(8, 16, 3, stride=(2, 1), groups=4)) == '3x3/2x1 grouped g4'
    assert _conv_kind(nn.Conv2d(8, 16, 3, stride=(1, 2))) == '3x3/1x2 dense'


def test_list_stages_refuses_bad_arguments_word_for_word():
    with pytest.raises(TypeError) as info:
        list_stages('resnet18d')
    assert str(info.value) == 'model must be a torch.nn.Module, got str'
    with pytest.raises(TypeError) as info:
        list_stages(_model('resnet18d'), input_size=(3, 64))
    assert str(info.value) == 'input_size must be 3 positive integers (C, H, W), got (3, 64)'


def test_list_stages_probes_at_the_models_own_input_size_by_default():
    """Without ``input_size``, the grids are those of the model's pretrained input size (here 96 px), or of 224 px
    for a model without one (torchvision's)."""
    model = timm.create_model('resnet18d', pretrained_cfg_overlay=dict(input_size=(3, 96, 96)))
    assert [(r.in_grid, r.out_grid) for r in list_stages(model)] == [
        ((24, 24), (24, 24)), ((24, 24), (12, 12)), ((12, 12), (6, 6)), ((6, 6), (3, 3))]
    assert [r.out_grid for r in list_stages(_model('tv:regnet_y_400mf'))] == [(56, 56), (28, 28), (14, 14), (7, 7)]


def test_a_stage_the_forward_pass_does_not_reach_is_listed_without_measures():
    """``list_stages`` measures channels and grids with hooks: a candidate stage that the model's forward skips is
    still listed, its measures unknown (None), not an error."""
    class Skips(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*(nn.Conv2d(c, 8, 3, stride=s, padding=1)
                                            for c, s in ((3, 2), (8, 2), (8, 1))))

        def forward(self, x):
            return self.features[:2](x)

    from tcnn.convert.stages import stage_levels
    assert stage_levels(Skips()) == [('features.0', 0), ('features.1', 1), ('features.2', None)]
    rows = list_stages(Skips(), input_size=(3, 32, 32))
    assert [(r.name, r.level, r.in_chs, r.out_grid, r.tokens) for r in rows] == [
        ('features.0', 0, 3, (16, 16), (34, 34)), ('features.1', 1, 8, (8, 8), (18, 18)),
        ('features.2', None, None, None, None)]
    # a ResNet's levels are known without a forward pass: its skipped layer4 keeps level 4
    resnet = timm.create_model('resnet18d')
    resnet.forward = lambda x: resnet.layer3(resnet.layer2(resnet.layer1(resnet.maxpool(resnet.act1(resnet.bn1(
        resnet.conv1(x)))))))
    rows = list_stages(resnet, input_size=(3, 64, 64))
    assert [(r.level, r.out_grid) for r in rows] == [(1, (16, 16)), (2, (8, 8)), (3, (4, 4)), (4, None)]


def test_a_stages_tokens_are_its_largest_padded_conv_input():
    """``tokens``: the largest grid (by area) that a k x k conv of the stage sees once padded, a string padding
    resolved ('valid': none; 'same': half the dilated kernel). The first stage's convs see 3x14 ('valid'), 4x6 ('same',
    dilation 2: padded to 8x10) and 14x4: 8x10 has the most tokens, not the greatest height or width."""
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 3, 3, padding='valid')
            self.b = nn.Conv2d(3, 3, 3, padding='same', dilation=2)
            self.c = nn.Conv2d(3, 3, 3)

        def forward(self, x):  # x: 14x14, passed on
            return x + self.a(x[..., :3, :]).sum() + self.b(x[..., :4, :6]).sum() + self.c(x[..., :, :4]).sum()

    model = nn.Module()
    model.features = nn.Sequential(Branches(), nn.Conv2d(3, 3, 3, padding='valid'))
    model.forward = model.features.forward
    rows = list_stages(model, input_size=(3, 14, 14))
    assert [(r.convs, r.tokens) for r in rows] == [(3, (8, 10)), (1, (14, 14))]
    assert all(type(t) is int for r in rows for t in r.tokens)


def test_a_stage_at_the_inputs_resolution_is_level_minus_one():
    """Level i is the resolution 1/2**(i+1) of the input: a stage that keeps the input's resolution is level -1,
    then 0 and 1 after each stride 2."""
    from tcnn.convert.stages import stage_levels
    model = nn.Module()
    model.features = nn.Sequential(*(nn.Conv2d(3, 3, 3, stride=s, padding=1) for s in (1, 2, 2)))
    model.forward = model.features.forward
    assert stage_levels(model) == [('features.0', -1), ('features.1', 0), ('features.2', 1)]


def test_a_features_only_backbone_whose_wrapper_flattens_its_stages_converts():
    """timm's FeatureListNet flattens nested Sequentials (ConvNeXt's ``stages.3`` becomes ``stages_3``) while its
    ``feature_info`` keeps the model's names: the stages are found under the wrapper's names, the default converts,
    and the feature maps stay (measured max rel err 8.7e-7)."""
    backbone = nontrivial(timm.create_model('convnext_atto', features_only=True))
    assert resolve_stages(backbone, None) == ['stages_3'] and resolve_stages(backbone, 3) == ['stages_2']
    report = tcnn.reparameterize(backbone, input_size=(3, 64, 64)).tcnn_report
    assert report.passed() and not report.vacuous and report.num_gpsa == 3 and report.max_rel_err < 3e-6


def test_stage_candidates_add_siblings_only_to_numbered_entries_of_a_sequential():
    """Only an entry numbered inside a Sequential / ModuleList brings its siblings (the blocks of its stage): not
    one named inside a Sequential (DenseNet's ``features.denseblock1``), not one numbered inside another container,
    not a child of a Sequential model itself; an entry without a reduction has no level (None)."""
    from tcnn.convert.stages import stage_candidates

    def conv():
        return nn.Conv2d(3, 3, 3, padding=1)

    named = nn.Module()
    named.features = nn.Sequential(OrderedDict(conv0=conv(), block1=conv(), pool1=nn.Identity(), block2=conv()))
    named.feature_info = [{'module': 'features.block1', 'reduction': 4}, {'module': 'features.block2', 'reduction': 8}]
    assert stage_candidates(named) == [('features.block1', 1), ('features.block2', 2)]

    keyed = nn.Module()
    keyed.blocks = nn.ModuleDict({'0': conv(), '1': conv(), '2': conv()})
    keyed.feature_info = [{'module': 'blocks.1', 'reduction': 16}]
    assert stage_candidates(keyed) == [('blocks.1', 3)]

    root = nn.Sequential(conv(), conv(), conv())
    root.feature_info = [{'module': '1', 'reduction': 2}, {'module': '2'}]
    assert stage_candidates(root) == [('1', 0), ('2', None)]


def test_stage_candidates_read_their_levels_from_feature_info():
    """A model's ``feature_info`` (timm's list of dicts: module and reduction) gives its stages without a forward
    pass: each entry and its Sequential siblings, at the level of the next entry (feature_info names the last module
    of each resolution), those after the last entry at its level; entries the model does not have are left out."""
    from tcnn.convert.stages import stage_candidates

    def convs(*strides):
        return nn.Sequential(*(nn.Conv2d(3, 3, 3, stride=s, padding=1) for s in strides))

    model = nn.Module()
    model.features = nn.Sequential(convs(2, 1), convs(2), convs(2, 1, 1))
    model.feature_info = [{'module': 'features.0.1', 'reduction': 2}, {'module': 'features.1', 'reduction': 4},
                          {'module': 'features.2.0', 'reduction': 8}, {'module': 'head', 'reduction': 32},
                          {'module': '', 'reduction': 1}, {'module': 7, 'reduction': 16}, 'not an entry']
    assert stage_candidates(model) == [
        ('features.0', 0), ('features.0.0', 0), ('features.0.1', 0), ('features.1', 1), ('features.2', 2),
        ('features.2.0', 2), ('features.2.1', 2), ('features.2.2', 2)]
    # timm's own models, levels and all, before any forward pass
    assert stage_candidates(_model('mobilenetv3_large_100')) == [
        ('blocks.0', 0), ('blocks.1', 1), ('blocks.2', 2), ('blocks.3', 3), ('blocks.4', 3), ('blocks.5', 4),
        ('blocks.6', 4)]
