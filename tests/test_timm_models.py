"""``t_*`` models in timm's registry, checked the way timm's own suite (``tests/test_models.py`` of timm's sdist)
checks its models: forward/backward, default-cfg consistency, features_only, forward_intermediates, grad
checkpointing, TorchScript, FX; plus what is ours: pretrained conversion, converted files, no_weight_decay.

Inputs are 96-128 px, so the last (GPSA) stage sees 3x3 and 4x4 grids.
"""
import copy
import math
import sys
import time
import types

import pytest
import timm
import torch
import torch.nn as nn
from timm.models import get_notrace_functions, get_notrace_modules
from timm.models.convnext import ConvNeXt
from timm.models.efficientnet import EfficientNet
from timm.models.mobilenetv3 import MobileNetV3
from timm.models.regnet import RegNet
from timm.optim import create_optimizer_v2

import tcnn
import tcnn.models.create
import tcnn.files.sources
from helpers import images, rel_err, script
from nontrivial import nontrivial, varied_heads
from tcnn import GPSA, exact_configuration, gpsa_layers
from tcnn.errors import TcnnError
from tcnn.models.create import TransformedModel, TransformedResNet, transformed_class
from tcnn.models import FAMILIES, SOURCE_MODELS

REQUIRED = ['t_resnet18d', 't_resnet26d', 't_resnet50d', 't_resnet101d', 't_resnet152d', 't_resnet200d',
            't_resnetrs50', 't_resnetrs101', 't_resnetrs152', 't_resnetrs200', 't_resnetrs270', 't_resnetrs350',
            't_resnetrs420']
# BasicBlock, Bottleneck, SE + conv stem pool (RS), grouped 3x3 (ResNeXt)
SMALL = ['t_resnet18d', 't_resnet50d', 't_resnetrs50', 't_seresnext26d_32x4d']
# the other families: grouped 3x3 + SE (RegNetY), 2x2/2 + depthwise 7x7 (ConvNeXt), depthwise 3x3/5x5 (EfficientNet,
# MobileNetV3, whose default stage is blocks.5: blocks.6 is a 1x1 conv), grouped 3x3 in timm's byobnet (ResNeXt-TS)
FAMILY_SMALL = ['t_regnety_002', 't_convnext_atto', 't_efficientnet_b0', 't_mobilenetv3_large_100', 't_resnext26ts']
DATA_KEYS = ('input_size', 'test_input_size', 'interpolation', 'mean', 'std', 'crop_pct', 'test_crop_pct',
             'crop_mode', 'num_classes', 'pool_size', 'first_conv', 'classifier')


def _assert_exact(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-5) -> None:
    """``out`` is ``ref`` to float32 rounding: the largest difference relative to the largest value of ``ref``, the
    bound ``tcnn.reparameterize`` verifies conversions with (the error measured here is ~1e-7)."""
    assert out.shape == ref.shape
    err = rel_err(out, ref)
    assert err <= tol, f'max rel err {err:.2g} > {tol:g}'


# ---------------------------------------------------------------------------------------------- registry


def test_required_models_registered_under_their_own_names():
    registered = set(timm.list_models('t_*'))
    assert set(REQUIRED) <= registered
    for name in REQUIRED:
        assert timm.is_model(name)
        assert timm.models.model_entrypoint(name).__name__ == name
    # one per ResNet of timm's resnet module (ResNet-D/-RS/-T, SE, ECA, ResNeXt, wide, blur/aa), nothing else
    assert registered == {f't_{s}' for s in SOURCE_MODELS} and len(registered) >= 70
    assert {'t_seresnext26d_32x4d', 't_wide_resnet50_2', 't_resnet50', 't_ecaresnet50d'} <= registered


@pytest.mark.parametrize('name', REQUIRED)
def test_pretrained_cfg_inherits_source(name):
    source = name[2:]
    for tagged, src_cfg in timm.models.get_arch_pretrained_cfgs(source).items():
        cfg = timm.models.get_pretrained_cfg('t_' + tagged)
        assert cfg.architecture == name and cfg.tag == src_cfg.tag
        for key in DATA_KEYS:
            assert getattr(cfg, key) == getattr(src_cfg, key), (tagged, key)
        assert not cfg.has_weights  # nothing to download: pretrained=True converts the source's weights (offline)
    assert timm.models.get_pretrained_cfg(name).tag == timm.models.get_pretrained_cfg(source).tag
    assert sorted(timm.list_models(name, include_tags=True)) == \
        sorted('t_' + n for n in timm.list_models(source, include_tags=True))


def test_t_resnets_leave_timms_tresnet_alone():
    """timm has an unrelated TResNet (``tresnet_m``...): with tcnn's models registered, its ``tresnet*`` names still
    build timm's class, none of tcnn's names is one of them, and no class of tcnn's model modules is named
    ``TResNet`` (a T-ResNet is a ``TransformedResNet``, a timm ``ResNet``)."""
    from timm.models import model_entrypoint
    ours = [n for n in timm.list_models() if model_entrypoint(n).__module__.startswith('tcnn.')]
    tresnets = timm.list_models('tresnet*')
    assert 't_resnet50d' in ours and tresnets and not set(ours) & set(tresnets)
    assert {model_entrypoint(n).__module__ for n in tresnets} == {'timm.models.tresnet'}
    with torch.device('meta'):
        model = timm.create_model('tresnet_m')
    assert type(model) is timm.models.tresnet.TResNet and not isinstance(model, TransformedModel)
    classes = {v.__name__ for module in (tcnn.models.create, tcnn.models) for v in vars(module).values()
               if isinstance(v, type) and v.__module__.startswith('tcnn.')}
    assert 'TransformedResNet' in classes and 'TResNet' not in classes


def test_entrypoints_are_found_by_name():
    # each t_* entrypoint is tcnn.models' attribute of its name, as timm's are of their model modules
    from tcnn.models import t_resnet50d
    assert t_resnet50d is timm.models.model_entrypoint('t_resnet50d') and t_resnet50d.__name__ == 't_resnet50d'
    assert set(tcnn.models.__all__) >= {f't_{s}' for s in SOURCE_MODELS} and 't_convnext_tiny' in tcnn.models.__all__
    assert issubclass(TransformedResNet, timm.models.resnet.ResNet)


# ---------------------------------------------------------------------------------------------- timm's checks


@pytest.mark.parametrize('name', REQUIRED)
def test_required_models_build(name):
    """Every required t_* model builds (on the meta device: no memory, no init) with GPSA layers in its last stage,
    and its unpooled features match the pool size of its pretrained config."""
    with torch.device('meta'):
        model = timm.create_model(name, device='meta').eval()
    assert isinstance(model, TransformedResNet)
    assert [n.split('.')[0] for n, _ in gpsa_layers(model)] == ['layer4'] * len(gpsa_layers(model)) != []
    cfg = model.pretrained_cfg
    features = model.forward_features(torch.randn(1, *cfg['input_size'], device='meta'))
    assert features.shape[1:] == (model.num_features, *cfg['pool_size'])


@pytest.mark.parametrize('name', SMALL + FAMILY_SMALL)
def test_default_cfgs_pass_timms_checks(name):
    """timm's test_model_default_cfgs (on the meta device, at the default input size)."""
    with torch.device('meta'):
        model = timm.create_model(name, device='meta', dtype=torch.float32).eval()
    cfg, state_dict = model.pretrained_cfg, model.state_dict()
    assert model.in_chans == cfg['input_size'][0] and model.num_classes == cfg['num_classes']
    x = torch.randn(1, *cfg['input_size'], device='meta')
    features = model.forward_features(x)
    pre = model.forward_head(features, pre_logits=True)
    assert features.shape[1:] == (model.num_features, *cfg['pool_size'])
    assert pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre.shape
    model.reset_classifier(0, '')
    assert model(x).shape[-2:] == tuple(cfg['pool_size'])
    assert timm.create_model(name, device='meta', num_classes=0)(x).shape == pre.shape
    if not isinstance(model, MobileNetV3):  # timm's exception too: its head conv comes after the pooling
        assert timm.create_model(name, device='meta', num_classes=0, global_pool='')(x).shape == features.shape
    assert cfg['classifier'] + '.weight' in state_dict and cfg['first_conv'] + '.weight' in state_dict
    assert all(t.device.type == 'meta' for t in state_dict.values())  # factory device honoured (GPSA too)
    with pytest.raises(TypeError):
        timm.create_model(name, device='meta', not_a_model_arg=1)
    # timm's _assert_dtype_change_after_forward
    model.to(torch.bfloat16)
    assert model(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize('name', ['t_resnet18d', 't_resnetrs50'])
def test_models_keep_timms_api_contract(name):
    """timm's _assert_model_api_contract and the optimizer factory's use of no_weight_decay()."""
    model = timm.create_model(name, num_classes=10)
    names = {n for n, _ in model.named_parameters()}
    nwd = model.no_weight_decay()
    expected = {f'{layer}.{p}' for layer, _ in gpsa_layers(model) for p in ('pos_centers', 'pos_locality', 'gating')}
    assert nwd == expected and nwd <= names
    groups = timm.models.group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    assert len(set(groups.values())) > 1
    optimizer = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05)
    params = {id(p): n for n, p in model.named_parameters()}
    no_decay = {params[id(p)] for g in optimizer.param_groups if g['weight_decay'] == 0 for p in g['params']}
    decay = {params[id(p)] for g in optimizer.param_groups if g['weight_decay'] > 0 for p in g['params']}
    assert nwd <= no_decay  # pos_centers is 2-D: only no_weight_decay() keeps it out of the decayed group
    assert any(n.endswith('q_weight') for n in decay) and any(n.endswith('proj_weight') for n in decay)


_MODELS = {}


def _model(name: str) -> nn.Module:
    """A fresh copy of a shared eval-mode model (creation dominates these tests' runtime)."""
    if name not in _MODELS:
        torch.manual_seed(0)
        _MODELS[name] = nontrivial(timm.create_model(name))
    return copy.deepcopy(_MODELS[name])


@pytest.mark.parametrize('name', SMALL + FAMILY_SMALL)
def test_models_pass_timms_forward_test_and_keep_it_with_checkpointing(name):
    """timm's test_model_forward at 96 and 128 px (3x3 and 4x4 GPSA grids; 160-px RS-50 sees 5x5 by default),
    plus: grad checkpointing leaves the output unchanged."""
    model = _model(name)
    with torch.no_grad():
        for size in (96, 128):
            x = images(1, size)
            model.set_grad_checkpointing(False)
            out = model(x)
            assert out.shape == (1, 1000) and not torch.isnan(out).any()
            model.set_grad_checkpointing()
            torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['t_resnet18d', 't_seresnext26d_32x4d', 't_convnext_atto', 't_mobilenetv3_large_100'])
def test_every_parameter_of_a_t_model_gets_a_gradient(name):
    """timm's test_model_backward: every parameter (GPSA q/k/v, centres, locality, gating too) gets a gradient."""
    model = timm.create_model(name, num_classes=42).train()
    out = model(images(2, 96))
    out.mean().backward()
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_timms_keyword_arguments_reach_the_model():
    """num_classes, drop_path_rate, in_chans, global_pool and our conversion kwargs reach the model."""
    model = timm.create_model('t_resnet18d', num_classes=7, drop_path_rate=0.1, in_chans=1, global_pool='catavgmax',
                              stages=[3, 4], qk_dim=8, locality_strength=2.0, gating_init=-1.0)
    assert model.num_classes == 7 and model.head_hidden_size == 2 * model.num_features
    assert [m.drop_prob for m in model.modules() if type(m).__name__ == 'DropPath'][-1] == pytest.approx(0.1)
    layers = gpsa_layers(model)
    assert {n.split('.')[0] for n, _ in layers} == {'layer3', 'layer4'}
    assert all(layer.qk_dim == 8 for _, layer in layers)
    layer = layers[0][1]
    torch.testing.assert_close(layer.locality_strength(), torch.full((9,), 2.0))
    torch.testing.assert_close(layer.gate(), torch.sigmoid(torch.full((9,), -1.0)))
    assert model.tcnn_config['stages'] == ['layer3', 'layer4']
    assert model.eval()(images(2, 96, chans=1)).shape == (2, 7)


def test_features_only_models_pass_timms_features_test():
    """timm's test_model_forward_features (+ out_indices and the getter wrapper)."""
    name, size = 't_resnet50d', 96
    model = timm.create_model(name, features_only=True).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) == 5 and reductions == [2, 4, 8, 16, 32]
    with torch.no_grad():
        outputs = model(images(1, size))
    assert len(outputs) == len(channels)
    for c, r, o in zip(channels, reductions, outputs):
        assert o.shape[1] == c and size / (2 * r) < o.shape[-1] <= math.ceil(size / r) + 1
        assert not torch.isnan(o).any()
    assert isinstance(dict(model.named_modules())['layer4.0.conv2'], GPSA)
    picked = timm.create_model('t_resnet18d', features_only=True, out_indices=(3, 4))
    assert picked.feature_info.channels() == [256, 512] and len(gpsa_layers(picked)) == 4
    getter = timm.create_model('t_resnet18d', features_only=True, feature_cls='getter').eval()
    with torch.no_grad():
        assert [o.shape[-1] for o in getter(images(1, size))] == [48, 24, 12, 6, 3]


def test_features_only_models_backpropagate_with_grad_checkpointing():
    """timm's test_features_only_grad_checkpointing_backward."""
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = timm.create_model('t_resnet18d', features_only=True).train()
        model.set_grad_checkpointing(checkpointing)
        sum(f.pow(2).mean() for f in model(images(2, 64))).backward()
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) == len(list(model.parameters()))
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g1, g0)


@pytest.mark.parametrize('name', ['t_resnet18d', 't_resnetrs50', 't_convnext_atto', 't_regnety_002'])
def test_forward_intermediates_pass_timms_test_and_prune_the_gpsa_stage(name):
    """timm's test_model_forward_intermediates (+ pruning the GPSA stage away)."""
    model = _model(name)
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    x = images(1, 96)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x)
        assert [o.shape[1] for o in intermediates] == info.channels()
        for r, o in zip(info.reduction(), intermediates):
            assert o.shape[-1] <= math.ceil(96 / r) + 1
        torch.testing.assert_close(final, model.forward_features(x), rtol=1e-5, atol=1e-8)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model.forward_intermediates(x)[0], final, rtol=1e-4, atol=1e-5)
        # pruning the GPSA stage away leaves a plain CNN trunk with nothing to exempt from weight decay
        model.prune_intermediate_layers([len(info) - 2])  # keep all but the last stage
        assert not gpsa_layers(model) and model.no_weight_decay() == set()


@pytest.mark.parametrize('name', ['t_resnet18d', 't_resnetrs50', 't_convnext_atto', 't_efficientnet_b0',
                                  't_mobilenetv3_large_100', 't_regnety_002', 't_resnext26ts'])
def test_scripted_models_equal_eager_to_rounding(name):
    """timm's test_model_forward_torchscript, plus equality with eager (to rounding: TorchScript evaluates depthwise
    GPSA layers' sum in another order, see tcnn.layers.depthwise)."""
    model = _model(name)
    scripted = script(model)
    x = images(1, 128)
    with torch.no_grad():
        out, ref = scripted(x), model(x)
    assert rel_err(out, ref) < 1e-5
    assert out.shape == (1, 1000) and not torch.isnan(out).any()


def test_scripting_survives_a_stale_builtin_id():
    """The flake ``helpers.script`` guards against, planted: TorchScript's builtin table holds an entry at the address
    of a conv's padding list (what a freed op leaves behind once that memory is reused). Plain ``torch.jit.script``
    fails on it; the helper drops that entry and only that one (a live op keeps its entry)."""
    conv = nn.Conv2d(3, 4, 3, padding=1)
    table = torch.jit._builtins._get_builtin_table()
    stale = id(conv._reversed_padding_repeated_twice)
    table[stale] = 'aten::add'
    try:
        with pytest.raises(RuntimeError, match='builtin cannot be used as a value'):
            torch.jit.script(nn.Sequential(conv))
        x = images(1, 8)
        torch.testing.assert_close(script(nn.Sequential(conv))(x), conv(x), rtol=0, atol=0)
        assert stale not in table and table[id(torch.add)] == 'aten::add'
    finally:
        table.pop(stale, None)


def _fx_model(model: nn.Module) -> nn.Module:
    """timm's _create_fx_model: torchvision's FX feature extractor with timm's leaf modules / autowrapped fns."""
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=tracer_kwargs)


def _fx_matches_eager(name: str, size: int) -> tuple:
    """timm's test_model_forward_fx: the FX-traced model of ``name`` computes what the model computes (eval mode)."""
    model = _model(name)
    fx_model = _fx_model(model)
    x = images(2, size)
    with torch.no_grad():
        torch.testing.assert_close(list(fx_model.eval()(x).values())[0], model(x), rtol=1e-4, atol=1e-5)
    return fx_model, x


def test_fx_traced_models_pass_timms_forward_backward_and_feature_tests():
    """timm's test_model_forward_fx / test_model_backward_fx and FX feature extraction (feature_cls='fx')."""
    fx_model, x = _fx_matches_eager('t_resnet18d', 96)
    out = list(fx_model.train()(x).values())[0]
    out.mean().backward()
    assert out.shape == (2, 1000)
    assert all(p.grad is not None for p in fx_model.parameters())
    graph = timm.create_model('t_resnet18d', features_only=True, feature_cls='fx', out_indices=(3, 4)).eval()
    with torch.no_grad():
        feats = graph(images(1, 96))
    assert [f.shape[1] for f in feats] == [256, 512] and feats[-1].shape[-1] == 3


# ---------------------------------------------------------------------------------------------- weights


def _source_cnn(name: str = 'resnet18d') -> nn.Module:
    """A CNN whose residual branches all matter (timm zero-initialises the last BN of each block)."""
    torch.manual_seed(0)
    return timm.create_model(name, zero_init_last=False).eval()


def test_pretrained_offline_fails_fast(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr(tcnn.files.sources, '_cached_timm_file', lambda cfg: None)  # whatever this machine has cached
    start = time.perf_counter()
    with pytest.raises(TcnnError, match=r'pretrained=False.*pretrained_cfg_overlay=dict\(file=PATH\)') as info:
        timm.create_model('t_resnet18d', pretrained=True)  # offline: asserts the fast failure, downloads nothing
    assert time.perf_counter() - start < 10
    assert '--weights' not in str(info.value) and '--no-pretrained' not in str(info.value)  # Python, not the CLI


def test_pretrained_converts_source_weights(monkeypatch):
    """Asking for pretrained weights loads the source's (stubbed here: no download) and converts them: in the exact
    configuration the T-CNN is the CNN; a new class count re-initialises the head only."""
    cnn = _source_cnn()
    asked = []

    def fake_create_cnn(name, *, pretrained=True, **kwargs):  # offline: stubbed source weights
        asked.append((name, pretrained, kwargs))
        return cnn

    monkeypatch.setattr(tcnn.models.create, 'create_cnn', fake_create_cnn)
    model = timm.create_model(
        't_resnet18d.ra4_e3600_r224_in1k', pretrained=True).eval()  # offline: stubbed source weights
    assert asked == [('resnet18d.ra4_e3600_r224_in1k', True, {})]
    assert 'state_dict' not in model.pretrained_cfg and model.pretrained_cfg['tag'] == 'ra4_e3600_r224_in1k'
    conv = cnn.layer4[1].conv2
    torch.testing.assert_close(model.layer4[1].conv2.conv_filter(), conv.weight)
    x = images(2, 96)
    with torch.no_grad(), exact_configuration(model):
        _assert_exact(model(x), cnn(x))
    with torch.no_grad():
        assert (model(x) - cnn(x)).abs().max() > 1e-3  # the paper's init (alpha = lambda = 1) is not the CNN
    head = timm.create_model('t_resnet18d', pretrained=True, num_classes=10)  # offline: stubbed source weights
    assert head.fc.out_features == 10
    torch.testing.assert_close(head.layer4[0].conv2.proj_weight, model.layer4[0].conv2.proj_weight)
    feats = timm.create_model(
        't_resnet18d', pretrained=True, features_only=True, out_indices=(4,)).eval()  # offline: stubbed source weights
    with torch.no_grad(), exact_configuration(feats), exact_configuration(model):  # q/k are drawn anew
        _assert_exact(feats(x)[0], model.forward_features(x))


def test_pretrained_cfg_overlay_file_and_checkpoint_path(tmp_path):
    """A converted file loads through pretrained_cfg_overlay=dict(file=...) (its class count and conversion
    settings are adopted) and through timm's checkpoint_path."""
    torch.manual_seed(1)
    model = timm.create_model('t_resnet18d', num_classes=5, stages=[3, 4], qk_dim=16, gating_init=0.5).eval()
    x = images(2, 96)
    with torch.no_grad():
        expected = model(x)
    path, st_path = str(tmp_path / 'model.pt'), str(tmp_path / 'model.safetensors')
    tcnn.save(model, path)
    tcnn.save(model, st_path)
    loaded = timm.create_model(
        't_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=path)).eval()  # offline: a local file
    assert loaded.num_classes == 5 and loaded.tcnn_config['stages'] == ['layer3', 'layer4']
    via_checkpoint = timm.create_model('t_resnet18d', num_classes=5, stages=[3, 4], qk_dim=16,
                                       checkpoint_path=st_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(via_checkpoint(x), expected, rtol=0, atol=0)
    features = timm.create_model('t_resnet18d', pretrained=True, features_only=True,  # offline: a local file
                                 pretrained_cfg_overlay=dict(file=st_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(features(x)[-1], model.forward_features(x), rtol=0, atol=0)
    with pytest.raises(TcnnError, match='qk_dim'):
        timm.create_model(
            't_resnet18d', pretrained=True, qk_dim=8, pretrained_cfg_overlay=dict(file=path))  # offline: a local file
    with pytest.raises(TcnnError, match='t_resnet18d'):
        timm.create_model(
            't_resnet26d', pretrained=True, pretrained_cfg_overlay=dict(file=path))  # offline: a local file


def test_a_plain_cnn_checkpoint_overlaid_on_the_pretrained_cfg_is_converted(tmp_path):
    """A plain checkpoint of the source CNN (wrapped, DDP prefixes) is converted on the fly."""
    cnn = _source_cnn()
    path = tmp_path / 'cnn.pth'
    torch.save({'state_dict': {f'module.{k}': v for k, v in cnn.state_dict().items()}, 'epoch': 3}, path)
    model = timm.create_model(
        't_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=str(path))).eval()  # offline: a local file
    x = images(2, 96)
    with torch.no_grad(), exact_configuration(model):
        _assert_exact(model(x), cnn(x))
    one_channel = timm.create_model('t_resnet18d', pretrained=True, in_chans=1,  # offline: a local file
                                    pretrained_cfg_overlay=dict(file=str(path)))
    assert one_channel.conv1[0].in_channels == 1
    assert isinstance(one_channel.layer4[0].conv2, GPSA)


def test_grouped_source_converts_exactly(monkeypatch):
    """ResNeXt's grouped 3x3 convs become grouped GPSA layers (the filter stored per group, as the conv stores it):
    still the CNN exactly."""
    cnn = _source_cnn('seresnext26d_32x4d')
    monkeypatch.setattr(tcnn.models.create, 'create_cnn', lambda name, **kwargs: cnn)
    model = timm.create_model('t_seresnext26d_32x4d', pretrained=True).eval()  # offline: a local file
    x = images(1, 96)
    with torch.no_grad(), exact_configuration(model):
        _assert_exact(model(x), cnn(x))
    conv, layer = cnn.layer4[0].conv2, model.layer4[0].conv2
    c = conv.out_channels
    assert conv.groups == layer.groups == 32 and layer.proj_weight.shape == (c, 9, c // 32)
    assert torch.equal(layer.conv_filter(), conv.weight)


# ---------------------------------------------------------------------------------------------- other families


def test_families_registered_with_their_own_classes():
    registered = set(timm.list_models('t_*'))
    assert {'t_regnety_002', 't_regnety_040', 't_convnext_atto', 't_convnext_tiny', 't_efficientnet_b0',
            't_efficientnetv2_rw_s', 't_mobilenetv3_large_100', 't_mobilenetv3_small_050', 't_resnext26ts',
            't_seresnext26ts', 't_resnext50_32x4d', 't_seresnext26d_32x4d'} <= registered
    # TensorFlow-padded ports (Conv2dSame) and CondConv models cannot be reproduced: not registered
    assert not {'t_tf_efficientnet_b0', 't_tf_mobilenetv3_large_100', 't_efficientnet_cc_b0_4e'} & registered
    for family in FAMILIES:
        assert {f't_{s}' for s in family.sources()} <= registered, family.module
    for name, source_class in (('t_convnext_atto', ConvNeXt), ('t_efficientnet_b0', EfficientNet),
                               ('t_mobilenetv3_small_050', MobileNetV3), ('t_regnety_002', RegNet)):
        with torch.device('meta'):
            model = timm.create_model(name, device='meta')
        cls = type(model)
        assert cls.__name__ == f'Transformed{source_class.__name__}' and cls.__mro__[1:3] == (TransformedModel,
                                                                                           source_class)
        # pickles by name
        assert transformed_class(source_class) is cls is getattr(tcnn.models.create, cls.__name__)
    assert transformed_class(timm.models.resnet.ResNet) is TransformedResNet
    cfg = timm.models.get_pretrained_cfg('t_convnext_atto')
    source_cfg = timm.models.get_pretrained_cfg('convnext_atto')
    assert all(getattr(cfg, k) == getattr(source_cfg, k) for k in DATA_KEYS) and not cfg.has_weights


@pytest.mark.parametrize('name, size', [('t_convnext_atto', 64), ('t_efficientnet_b0', 64),
                                        ('t_mobilenetv3_large_100', 96), ('t_resnext26ts', 64)])
def test_family_features_only_models_pass_timms_features_test(name, size):
    """timm's test_model_forward_features for the families (their stages are not direct children: flattened)."""
    model = timm.create_model(name, features_only=True).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    with torch.no_grad():
        outputs = model(images(1, size))
    assert len(outputs) == len(channels) >= 4 and reductions[-1] == 32
    for c, r, o in zip(channels, reductions, outputs):
        assert o.shape[1:] == (c, math.ceil(size / r), math.ceil(size / r)) and not torch.isnan(o).any()
    assert gpsa_layers(model)
    last = timm.create_model(name, features_only=True, out_indices=(-1,))
    assert last.feature_info.channels() == channels[-1:] and gpsa_layers(last)


def test_a_family_model_traced_by_fx_matches_eager():
    _fx_matches_eager('t_convnext_atto', 64)


@pytest.mark.parametrize('name', ['convnext_atto', 'efficientnet_b0'])
def test_family_pretrained_converts_source_weights(monkeypatch, name):
    """pretrained=True converts the source's weights (stubbed: no download): in the exact configuration the T-CNN is
    the CNN; a new class count re-initialises the head (ConvNeXt head.fc, EfficientNet classifier) only."""
    cnn = nontrivial(timm.create_model(name))
    monkeypatch.setattr(tcnn.models.create, 'create_cnn', lambda source, **kwargs: cnn)
    model = timm.create_model(f't_{name}', pretrained=True).eval()  # offline: stubbed source weights
    x = images(2, 64)
    with torch.no_grad(), exact_configuration(model):
        exact, ref = model(x), cnn(x)
    _assert_exact(exact, ref)
    with torch.no_grad():
        assert (model(x) - ref).abs().max() > 1e-3 * ref.abs().max()  # the paper init; and the layers matter
    head = timm.create_model(f't_{name}', pretrained=True, num_classes=10).eval()  # offline: stubbed
    assert head.get_classifier().out_features == 10
    with torch.no_grad(), exact_configuration(head), exact_configuration(model):
        _assert_exact(head.forward_features(x), model.forward_features(x))


def test_family_file_round_trip_and_stage_conflicts(tmp_path):
    """A T-CNN file of another family loads through pretrained_cfg_overlay; stages=4 is its stages.3 (compared on
    the built model), stages=3 conflicts."""
    torch.manual_seed(0)
    model = nontrivial(timm.create_model('t_convnext_atto', num_classes=5))
    path = str(tmp_path / 'model.pt')
    tcnn.save(model, path)
    x = images(2, 64)
    with torch.no_grad():
        expected = model(x)
    for stages in (None, 4, ['stages.3']):
        loaded = timm.create_model('t_convnext_atto', pretrained=True, stages=stages,  # offline: a local file
                                   pretrained_cfg_overlay=dict(file=path)).eval()
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    with pytest.raises(TcnnError, match=r"stages=3 conflicts with .*model\.pt \(stages=\['stages\.3'\]\)"):
        timm.create_model('t_convnext_atto', pretrained=True, stages=3,  # offline: a local file
                          pretrained_cfg_overlay=dict(file=path))
    assert type(tcnn.load(path)).__name__ == 'TransformedConvNeXt'


# ------------------------------------------------------------------------------------- timm's reparameterisation

# What timm.models.reparameterize_model calls on a module (timm.utils.reparameterize_model, benchmark.py --reparam,
# onnx_export.py --reparam).
FUSION_METHODS = ('fuse', 'reparameterize', 'switch_to_deploy')
# The t_* models holding such modules (test_reparameterizable_models_enumerated_from_the_registry keeps this list
# true): RepVGG and MobileOne blocks of timm's byobnet, whose k x k conv branches are GPSA layers.
REPARAMETERIZABLE = ['t_mobileone_s0', 't_mobileone_s1', 't_mobileone_s2', 't_mobileone_s3', 't_mobileone_s4',
                     't_repvgg_a0', 't_repvgg_a1', 't_repvgg_a2', 't_repvgg_b0', 't_repvgg_b1', 't_repvgg_b1g4',
                     't_repvgg_b2', 't_repvgg_b2g4', 't_repvgg_b3', 't_repvgg_b3g4', 't_repvgg_d2se']


def _timm_modules_reached(name: str) -> set:
    """The timm modules that timm module ``name`` uses, transitively (through the modules, classes and functions
    its namespace names): the only places a model of ``name`` can take its module classes from."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module in seen or not module.startswith('timm.') or module not in sys.modules:
            continue
        seen.add(module)
        for value in vars(sys.modules[module]).values():
            todo.append(value.__name__ if isinstance(value, types.ModuleType) else getattr(value, '__module__', ''))
    return seen


def test_reparameterizable_models_enumerated_from_the_registry():
    """Every t_* model with a module that timm's reparameterisation calls is in REPARAMETERIZABLE (so all of them
    are checked below). A model can only hold classes of the timm modules its family's module reaches; the families
    reaching a class with a fusion method are built (on the meta device: byobnet's ~50 models, a few seconds) and
    searched, which keeps this complete without building all 300 t_* models."""
    fusing = [family for family in FAMILIES if any(
        isinstance(c, type) and issubclass(c, nn.Module) and any(hasattr(c, m) for m in FUSION_METHODS)
        for module in _timm_modules_reached(f'timm.models.{family.module}')
        for c in vars(sys.modules[module]).values())]
    assert [family.module for family in fusing] == ['byobnet']
    found = []
    for family in fusing:
        for source in family.sources():
            with torch.device('meta'):
                model = timm.create_model(f't_{source}', device='meta')
            if any(hasattr(m, a) for m in model.modules() for a in FUSION_METHODS):
                found.append(f't_{source}')
    assert sorted(found) == REPARAMETERIZABLE


@pytest.mark.parametrize('name', REPARAMETERIZABLE)
def test_timm_reparameterize_model_keeps_the_function_and_the_gpsa_layers(name):
    """timm.utils.reparameterize_model (benchmark.py/onnx_export.py --reparam) on every t_* model that has blocks to
    fuse: the BNs and 1x1/identity branches fuse, the GPSA layers stay GPSA layers (tcnn.convert.fusion), the logits
    stay.

    Random BN statistics and varied heads (so that every branch and head reaches the logits), 48 px (a 2x2 GPSA
    grid), in float64: that checks the fusion's algebra to 1e-9, apart from float32 rounding, which 50 random-BN
    blocks amplify (repvgg_d2se's plain CNN moves ~4e-4 relative under timm's own fusion in float32). Float32, the
    dtype users run, is checked at 1e-5 on the two smallest."""
    torch.manual_seed(0)
    model = varied_heads(nontrivial(timm.create_model(name, num_classes=10)))
    layers = len(gpsa_layers(model))
    dtype = torch.float32 if name in ('t_repvgg_a0', 't_mobileone_s0') else torch.float64
    model.to(dtype)
    x = images(1, 48).to(dtype)
    with torch.no_grad():
        before = model(x)
        fused = timm.utils.reparameterize_model(model, inplace=True)
        after = fused(x)
    rel = rel_err(after, before)
    assert rel < (1e-5 if dtype == torch.float32 else 1e-9), rel
    assert len(gpsa_layers(fused)) == layers and all(n.endswith(('.gpsa.0', '.gpsa.1', '.gpsa.2', '.gpsa.3'))
                                                     for n, _ in gpsa_layers(fused))
    # fused: no BN, no 1x1 branch left in the converted blocks, and timm's own fusion did the other blocks
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.stages.modules())
    assert not any(hasattr(m, 'conv_kxk') for m in fused.modules())


def test_a_fused_t_cnn_is_refused_by_save_with_the_fix(tmp_path):
    """A deploy-form (fused) T-CNN no longer has the layers its tcnn_config names: saving it says to save before
    fusing, in one line."""
    from timm.utils import reparameterize_model
    fused = reparameterize_model(timm.create_model('t_repvgg_a0', num_classes=3))
    with pytest.raises(TcnnError) as info:
        tcnn.save(fused, str(tmp_path / 'fused.pt'))
    assert str(info.value) == ('cannot save a model fused by timm.utils.reparameterize_model (its GPSA layers moved '
                               'into the fused blocks): save the model before fusing, and fuse after tcnn.load')
    assert not (tmp_path / 'fused.pt').exists()
