"""Structured pruning of a T-CNN with Torch-Pruning (DepGraph) through ``tcnn.pruning`` (``pip install
'tcnn[pruning]'``).

Without ``tcnn.pruning.pruner_options()``, Torch-Pruning 1.6's ``MetaPruner`` never finishes on a T-CNN (its
dependency graph grows past 20 GB; ``tcnn/pruning.py`` says why), so every test that builds a dependency graph runs in
a subprocess under a memory limit and a timeout: a regression fails in bounded time instead of exhausting the machine.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tcnn
from tcnn.errors import TcnnError
from tcnn.layers.gpsa import EXACT_GATING, EXACT_LOCALITY

tp = pytest.importorskip('torch_pruning', reason="Torch-Pruning is not installed: pip install 'tcnn[pruning]'")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# resnet18d with its BN affine parameters randomised: timm zero-inits the last BN of each block, and then the GPSA
# layers would not influence the logits (an equivalence proving nothing)
_MODELS = '''
import json, time, resource, warnings
import torch, timm, torch_pruning as tp
import tcnn, tcnn.pruning
warnings.filterwarnings('ignore')
torch.manual_seed(0)
cnn = timm.create_model('resnet18d').eval()
for bn in cnn.modules():
    if isinstance(bn, torch.nn.BatchNorm2d):
        torch.nn.init.uniform_(bn.weight, 0.5, 1.5)
        torch.nn.init.uniform_(bn.bias, -0.1, 0.1)
t_cnn = tcnn.reparameterize(cnn).eval()
x = torch.randn(1, 3, 64, 64)
'''


def _run(body: str, timeout: int = 240) -> dict:
    """Run ``_MODELS`` and ``body`` in a fresh interpreter under a 6 GB address-space limit and ``timeout`` seconds;
    ``body`` prints one JSON line last, returned as a dict."""
    script = ('import resource\nresource.setrlimit(resource.RLIMIT_AS, (6 * 2 ** 30, 6 * 2 ** 30))\n' + _MODELS
              + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''), HF_HUB_OFFLINE='1',
               OMP_NUM_THREADS='1')
    try:
        proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=_ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f'Torch-Pruning did not finish within {timeout} s (the dependency-graph blow-up)')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_metapruner_prunes_a_t_cnn_in_bounded_time():
    # the call, with tcnn's options: it finishes (1.5-3.7 s measured; the CNN takes 0.3-1.9 s), prunes the
    # stages around the GPSA layers and their own channels, and the pruned T-CNN runs
    out = _run('''
        before = sum(p.numel() for p in t_cnn.parameters())
        start = time.time()
        pruner = tp.pruner.MetaPruner(t_cnn, x, importance=tp.importance.MagnitudeImportance(p=2), pruning_ratio=0.25,
                                      ignored_layers=[t_cnn.fc], **tcnn.pruning.pruner_options())
        pruner.step()
        seconds = time.time() - start
        layer = t_cnn.layer4[0].conv1
        print(json.dumps({'seconds': seconds, 'before': before, 'after': sum(p.numel() for p in t_cnn.parameters()),
                          'in': layer.in_channels, 'out': layer.out_channels, 'shape': list(t_cnn(x).shape),
                          'layer3': t_cnn.layer3[1].conv2.out_channels}))
    ''')
    assert out['seconds'] < 60
    assert out['shape'] == [1, 1000]
    assert out['in'] == out['layer3'] == 192  # layer3's output channels, which the GPSA layer reads, cut by 25%
    assert out['out'] == 384  # the GPSA layer's own output channels (a root of tcnn's options)
    assert out['after'] < 0.7 * out['before']


def test_same_channels_give_the_pruned_cnn_in_the_exact_configuration():
    # the same channels pruned in the CNN and its T-CNN: layer3's output (the GPSA layer's input and the downsample's),
    # a GPSA layer's output (inside its block) and layer4's output; the pruned T-CNN is the pruned CNN
    out = _run('''
        def prune(model, options):
            graph = tp.DependencyGraph().build_dependency(model, example_inputs=x, verbose=False, **options)
            for name, idxs in (('layer3.1.conv2', list(range(0, 256, 3))), ('layer4.0.conv1', [0, 5, 7, 100, 300]),
                               ('layer4.1.conv2', list(range(10, 60)))):
                layer = model.get_submodule(name)
                graph.get_pruning_group(layer, graph.get_pruner_of_module(layer).prune_out_channels, idxs).prune()
        options = tcnn.pruning.pruner_options()
        del options['root_module_types']  # a MetaPruner argument, not the graph's
        prune(cnn, {})
        prune(t_cnn, options)
        with torch.no_grad():
            ref = cnn(x)
            with tcnn.exact_configuration(t_cnn):
                exact = t_cnn(x)
            init = t_cnn(x)
        rel = lambda a: ((a - ref).abs().max() / ref.abs().max()).item()
        layer = t_cnn.layer4[0].conv1
        print(json.dumps({'exact': rel(exact), 'init': rel(init), 'shape': list(exact.shape),
                          'gpsa': [layer.in_channels, layer.out_channels, layer.v_weight.shape[0]],
                          'conv': [cnn.layer4[0].conv1.in_channels, cnn.layer4[0].conv1.out_channels]}))
    ''')
    assert out['gpsa'] == out['conv'] + [out['conv'][0]] == [170, 507, 170]
    assert out['shape'] == [1, 1000]
    assert out['exact'] < 1e-5  # 2.2e-7 measured
    assert out['init'] > 1e-2  # the fine-tuning init is not the CNN: the comparison sees the GPSA layers


def test_state_dict_round_trip_of_a_pruned_t_cnn():
    # tp.state_dict / tp.load_state_dict set every public attribute back, GPSA's in_channels/out_channels included
    # (they failed before: a property without a setter)
    out = _run('''
        import io
        graph = tp.DependencyGraph().build_dependency(t_cnn, example_inputs=x, verbose=False,
                                                      customized_pruners={tcnn.GPSA: tcnn.pruning.gpsa_pruner()},
                                                      forward_fn=tcnn.pruning.traced_as_one_op)
        layer = t_cnn.layer3[1].conv2
        graph.get_pruning_group(layer, tp.prune_conv_out_channels, list(range(0, 256, 4))).prune()
        buffer = io.BytesIO()
        torch.save(tp.state_dict(t_cnn), buffer)
        buffer.seek(0)
        fresh = tcnn.reparameterize(timm.create_model('resnet18d'), verify=False).eval()
        tp.load_state_dict(fresh, torch.load(buffer, weights_only=False))
        with torch.no_grad():
            same = torch.equal(fresh(x), t_cnn(x))
        print(json.dumps({'same': same, 'in': fresh.layer4[0].conv1.in_channels}))
    ''')
    assert out == {'same': True, 'in': 192}


def test_channel_setters_refuse_another_value():
    layer = tcnn.GPSA(8, 16)
    layer.in_channels, layer.out_channels = 8, 16  # what tp.load_state_dict does
    with pytest.raises(ValueError, match='follows its weights'):
        layer.in_channels = 4
    with pytest.raises(ValueError, match='follows its weights'):
        layer.out_channels = 4
    assert (layer.in_chs, layer.out_chs) == (8, 16)


def test_grouped_layer_is_refused_in_one_line():
    import tcnn.pruning
    pruner = tcnn.pruning.gpsa_pruner()
    layer = tcnn.GPSA(8, 8, groups=2)
    for prune in (pruner.prune_out_channels, pruner.prune_in_channels):
        with pytest.raises(TcnnError, match='ignored_layers') as info:
            prune(layer, [0])
        assert '\n' not in str(info.value)
    assert layer.proj_weight.shape == (8, 9, 4)  # untouched


def test_pruned_dense_layer_keeps_its_function_on_the_kept_channels():
    # without the network: the pruned layer is the layer whose pruned input channels are zero, on the kept outputs
    import tcnn.pruning
    torch.manual_seed(0)
    layer = tcnn.GPSA(8, 6, locality_strength=EXACT_LOCALITY, gating_init=EXACT_GATING)
    x = torch.randn(2, 8, 5, 5)
    pruner = tcnn.pruning.gpsa_pruner()
    with torch.no_grad():
        zeroed = x.clone()
        zeroed[:, [1, 4]] = 0
        ref = layer(zeroed)[:, [0, 2, 3, 4]]
        pruner.prune_in_channels(layer, [1, 4])
        pruner.prune_out_channels(layer, [1, 5])
        out = layer(x[:, [0, 2, 3, 5, 6, 7]])
    assert (layer.in_channels, layer.out_channels) == (6, 4)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_missing_package_is_one_line(monkeypatch):
    import tcnn.pruning
    monkeypatch.setitem(sys.modules, 'torch_pruning', None)
    with pytest.raises(TcnnError, match=r"pip install 'tcnn\[pruning\]'") as info:
        tcnn.pruning.pruner_options()
    assert '\n' not in str(info.value)
