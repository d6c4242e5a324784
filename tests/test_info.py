"""``tcnn info`` and what it reads with: the torch-free safetensors reader (``tcnn.files.safetensors_header``) and the
one reading of a GPSA layer's parameters (``tcnn.gpsa_parameters``), held to the layer's own torch computation and to
safetensors' own reader; ``tcnn info FILE.safetensors`` imports no torch."""
import math
import struct

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import tcnn
from tcnn import gpsa_parameters
from tcnn.commands import info
from tcnn.files import tcnn_file
from tcnn.files.safetensors_header import read_floats, read_header, read_tcnn_settings
import tcnn.layers.gpsa

from helpers import fresh_python

# lambda and the raw locality strength of a trained T-CNN's heads, and the extremes a reader must survive
VALUES = [-800.0, -30.0, -4.0, -1.0, -0.25, 0.0, 0.1, 0.5, 1.0, 3.0, 25.0, 40.0, 800.0]


@pytest.fixture(scope='module')
def t_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=4), verify=False)
    with torch.no_grad():  # a different value per head: a mix-up of heads or layers shows
        for i, (_, layer) in enumerate(tcnn.gpsa_layers(model)):
            layer.gating.copy_(torch.linspace(-3, 3, layer.num_heads) + i)
            layer.pos_locality.copy_(torch.linspace(-1, 2, layer.num_heads) * (i + 1))
            layer.pos_centers.add_(torch.randn_like(layer.pos_centers) * 0.1)
    return model


def test_the_parameters_meaning_is_the_layers():
    """gate = sigmoid(lambda), alpha = softplus(raw, beta=5): the torch-free functions compute what the layer does."""
    assert tcnn.layers.gpsa.SOFTPLUS_BETA is gpsa_parameters.SOFTPLUS_BETA  # one copy: the layer imports it
    x = torch.tensor(VALUES, dtype=torch.float64)
    assert [gpsa_parameters.gate(v) for v in VALUES] == pytest.approx(torch.sigmoid(x).tolist(), rel=1e-15, abs=0)
    softplus = F.softplus(x, beta=tcnn.layers.gpsa.SOFTPLUS_BETA).tolist()
    assert [gpsa_parameters.locality_strength(v) for v in VALUES] == pytest.approx(softplus, rel=1e-15, abs=0)
    assert all(0 <= gpsa_parameters.gate(v) <= 1 and gpsa_parameters.locality_strength(v) >= 0 for v in VALUES)
    layer = tcnn.GPSA(8, 8, kernel_size=3)
    with torch.no_grad():
        layer.gating.copy_(torch.linspace(-3, 3, 9))
        layer.pos_locality.copy_(torch.linspace(-2, 2, 9))
    gating, raw = layer.gating.tolist(), layer.pos_locality.tolist()
    assert [gpsa_parameters.gate(g) for g in gating] == pytest.approx(layer.gate().tolist(), rel=1e-6)
    alphas = [gpsa_parameters.locality_strength(r) for r in raw]
    assert alphas == pytest.approx(layer.locality_strength().tolist(), rel=1e-6)
    assert [1 / a for a in alphas] == pytest.approx(layer.span().tolist(), rel=1e-6)


def test_layer_summary_derives_spans_sigmas_and_means_from_the_parameters():
    entry = gpsa_parameters.layer_summary([0.25, 0.75], [0.5, 2.0], [[-1.0, 0.0], [1.0, 1.0]])
    assert entry == {'gate': [0.25, 0.75], 'alpha': [0.5, 2.0], 'span': [2.0, 0.5], 'sigma': [1.0, 0.5],
                     'center': [[-1.0, 0.0], [1.0, 1.0]], 'gate_mean': 0.5, 'span_mean': 1.25, 'sigma_mean': 0.75}
    raw = [0.0, 1.0]
    from_values = gpsa_parameters.summary_of_values([0.0, 1.0], raw, [[0.0, 0.0], [1.0, 0.0]])
    assert from_values['gate'] == [0.5, 1 / (1 + math.exp(-1))]
    assert from_values['alpha'] == [math.log(2) / 5, math.log1p(math.exp(5)) / 5]


def test_gpsa_summary_and_info_read_the_same_values(t_model, tmp_path):
    """tcnn.gpsa_summary (the model's layers, in torch) and tcnn info (a file's numbers, torch-free) agree."""
    expected = tcnn.gpsa_summary(t_model)
    for ext in ('.pt', '.safetensors'):
        path = tcnn.save(t_model, str(tmp_path / f't{ext}'))
        layers = info.collect(path)['layers']
        assert list(layers) == list(expected)
        for name, entry in expected.items():
            assert layers[name]['center'] == entry['center']
            for key in ('gate', 'alpha', 'span', 'sigma'):
                assert layers[name][key] == pytest.approx(entry[key], rel=1e-6), (ext, name, key)
            for key in ('gate_mean', 'span_mean', 'sigma_mean'):
                assert layers[name][key] == pytest.approx(entry[key], rel=1e-6), (ext, name, key)


def test_the_header_reader_reads_what_safetensors_reads(t_model, tmp_path):
    path = tcnn.save(t_model, str(tmp_path / 't.safetensors'))
    full = tcnn_file.read(path)
    light = read_tcnn_settings(path, gpsa_parameters.HEAD_PARAMETERS)
    assert {k: v for k, v in light.items() if k != 'tensor_values'} == {k: v for k, v in full.items()
                                                                        if k != 'state_dict'}
    names = [k for k in full['state_dict'] if k.endswith(gpsa_parameters.HEAD_PARAMETERS)]
    assert sorted(light['tensor_values']) == sorted(names) and len(names) == 3 * len(tcnn.gpsa_layers(t_model))
    for name in names:
        assert light['tensor_values'][name] == full['state_dict'][name].tolist(), name
    assert read_tcnn_settings(path)['tensor_values'] == {}


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_read_floats_reads_every_float_dtype(tmp_path, dtype):
    tensors = {'flat': torch.tensor(VALUES[1:-1]).to(dtype), 'rows': torch.randn(9, 2).to(dtype),
               'other': torch.arange(5, dtype=torch.int64)}
    path = str(tmp_path / 'x.safetensors')
    save_file(tensors, path, metadata={'note': 'not a T-CNN file'})
    with open(path, 'rb') as f:
        header, start = read_header(f)
        assert header['__metadata__'] == {'note': 'not a T-CNN file'}
        for name in ('flat', 'rows'):
            assert read_floats(f, start, header[name]) == tensors[name].double().tolist()
        with pytest.raises(KeyError):
            read_floats(f, start, header['other'])
    assert read_tcnn_settings(path) is None  # safetensors, but no T-CNN settings: the full path says what it is


def test_what_is_no_t_cnn_file_goes_the_full_way(t_model, tmp_path):
    """None for anything the reader does not vouch for: tcnn info then reads the file the full way, which names the
    problem (or reads a file the light path cannot)."""
    good = tcnn.save(t_model, str(tmp_path / 'good.safetensors'))
    data = open(good, 'rb').read()
    (size,) = struct.unpack('<Q', data[:8])
    cases = {'empty': b'', 'short': data[:5], 'truncated header': data[:8 + size // 2],
             'huge header': struct.pack('<Q', 2 ** 40) + data[8:], 'not JSON': data[:8] + b'x' * size + data[8 + size:],
             'truncated tensors': data[:8 + size + 10]}
    for name, content in cases.items():
        path = tmp_path / f'{name}.safetensors'
        path.write_bytes(content)
        assert read_tcnn_settings(str(path), gpsa_parameters.HEAD_PARAMETERS) is None, name
    assert read_tcnn_settings(str(tmp_path / 'missing.safetensors')) is None


def test_info_on_a_safetensors_file_imports_no_torch(t_model, tmp_path):
    path = tcnn.save(t_model, str(tmp_path / 't.safetensors'))
    out = fresh_python('import sys\nfrom tcnn.cli import main\nrc = main(["info", "--heads", ' + repr(path) + '])\n'
                       'print(rc, sorted(m for m in ("torch", "timm", "torchvision", "safetensors", "numpy")\n'
                       '                 if m in sys.modules))\n')
    assert out.strip().splitlines()[-1] == '0 []', out
    assert 'layer4.1.conv2' in out and 'head 8: gate' in out, out


def test_info_reads_stored_counts_without_building_the_model(tmp_path):
    import math
    import warnings
    import tcnn
    from tcnn.commands import info
    from tcnn.files.sources import create_cnn
    cnn = create_cnn('resnet26d', pretrained=False, num_classes=5, cardinality=4, base_width=16)  # grouped convs
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        t_cnn = tcnn.reparameterize(cnn, verify=False, locality_strength=3.0, gating_init=-2.0)
    for ext in ('.pt', '.safetensors'):
        path = tcnn.save(t_cnn, str(tmp_path / f't{ext}'))
        fast, rebuilt = info.collect(path), info._collect_by_rebuilding(path)
        assert fast['parameters'] == rebuilt['parameters']
        assert fast['parameters']['cnn'] == sum(p.numel() for p in cnn.parameters())
        assert {k: v for k, v in fast.items() if k != 'layers'} == {k: v for k, v in rebuilt.items() if k != 'layers'}
        for name, layer in rebuilt['layers'].items():
            assert fast['layers'][name]['center'] == layer['center']
            for key in ('gate', 'alpha', 'span', 'sigma', 'gate_mean', 'span_mean', 'sigma_mean'):
                a, b = fast['layers'][name][key], layer[key]
                assert all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(*(([a], [b]) if isinstance(a, float)
                                                                            else (a, b)))), (name, key)
    out = fresh_python('import sys\nfrom tcnn.cli import main\nmain(["info", ' + repr(path) + '])\n'
                       'print(sorted(m for m in ("torch", "timm") if m in sys.modules))\n')
    assert out.strip().splitlines()[-1] == '[]' and 'self-attention' in out, out
