"""Core ML (coremltools 9, ``pip install 'tcnn[coreml]'``): a T-CNN converts through ``torch.export``.

coremltools installs on Linux but predicts on macOS only, so what is checked here is the converted program: its
input and output shapes and its operations, against the CNN's program and against the exported graph (docs/export.md,
"Core ML", says what that does and does not verify).
"""
import collections
import warnings

import pytest
import torch

import tcnn
from tcnn.layers.geometry import conv_geometry
from tcnn.layers.projections import query_tokens


def _models():
    import timm
    torch.manual_seed(0)
    cnn = timm.create_model('resnet18d').eval()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # random-init resnets: "the replaced layers do not influence the logits"
        return cnn, tcnn.reparameterize(cnn).eval()


def _exported(model, x):
    return torch.export.export(model, (x,)).run_decompositions({})


def _convert(program, **kwargs):
    ct = pytest.importorskip('coremltools', reason="coremltools is not installed: pip install 'tcnn[coreml]'")
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return ct.convert(program, convert_to='mlprogram', minimum_deployment_target=ct.target.iOS17, **kwargs)


def _mil_ops(mlmodel):
    return collections.Counter(op.op_type for f in mlmodel._mil_program.functions.values() for op in f.operations)


def _aten_count(program, name):
    return sum(1 for n in program.graph.nodes if n.op == 'call_function' and str(n.target).startswith(f'aten.{name}.'))


def _shape(feature):
    return list(feature.type.multiArrayType.shape)


def test_export_graph_has_no_alias():
    # coremltools' torch.export frontend has no aten.alias ("Unsupported fx node alias"); a stride-2 GPSA layer made
    # one, a no-op cut of its queries' strided slice
    _, t_cnn = _models()
    program = _exported(t_cnn, torch.randn(1, 3, 64, 64))
    assert _aten_count(program, 'alias') == 0


@pytest.mark.parametrize('kernel, stride, padding, size', [(3, 2, 1, 8), (3, 2, 1, 7), (5, 2, 1, 8), (3, 3, 0, 10),
                                                           (3, 2, 2, 9), (1, 2, 0, 7)])
def test_query_slice_selects_the_same_tokens(kernel, stride, padding, size):
    # the queries as one start:end:stride slice per axis are the tokens the strided slice cut to H_out x W_out took
    geometry = conv_geometry((kernel, kernel), (stride, stride), (padding, padding), (1, 1), 'zeros', 1)
    h_out = (size + 2 * padding - kernel) // stride + 1
    x = torch.randn(2, 4, size, size)
    tokens = x.flatten(2).transpose(1, 2).contiguous()
    got = query_tokens(x, tokens, geometry, out_size=(h_out, h_out), all_tokens=False)
    (ay, ax), (ph, pw) = geometry.anchor, geometry.padding
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph))
    ref = padded[..., ay::stride, ax::stride][..., :h_out, :h_out].flatten(2).transpose(1, 2)
    assert torch.equal(got, ref)


def test_t_cnn_converts_through_torch_export():
    cnn, t_cnn = _models()
    x = torch.randn(1, 3, 64, 64)
    t_program, c_program = _exported(t_cnn, x), _exported(cnn, x)
    t_ml, c_ml = _convert(t_program), _convert(c_program)
    t_ops, c_ops = _mil_ops(t_ml), _mil_ops(c_ml)
    layers = len(tcnn.gpsa_layers(t_cnn))
    assert layers == 4
    for ml in (t_ml, c_ml):
        spec = ml.get_spec().description
        assert [_shape(f) for f in spec.input] == [[1, 3, 64, 64]]
        assert [_shape(f) for f in spec.output] == [[1, 1000]]
    # every conv but the GPSA layers' is a Core ML conv, as in the CNN's program and the exported graph
    assert t_ops['conv'] == c_ops['conv'] - layers == _aten_count(t_program, 'conv2d')
    # one content softmax per GPSA layer; the positional one depends on the parameters only and is folded into a
    # constant (the exported graph computes both)
    assert c_ops['softmax'] == 0 and t_ops['softmax'] == layers
    assert _aten_count(t_program, 'softmax') == 2 * layers
    # the attention's products: content scores and the value product per layer
    assert t_ops['matmul'] == 2 * layers and c_ops['matmul'] == 0


def test_trace_route_fails_only_where_coremltools_fails_on_a_traced_size():
    # torch.jit.trace -> ct.convert: coremltools 9 with NumPy 2 cannot convert a traced x.shape[0] used as a size
    # (int() of a one-element array), which any model with a batch-size reshape has; a GPSA layer reads its input's
    # sizes. The day coremltools converts the plain module, the T-CNN must convert too (then docs/export.md changes)
    _, t_cnn = _models()
    x = torch.randn(1, 3, 64, 64)
    ct = pytest.importorskip('coremltools', reason="coremltools is not installed: pip install 'tcnn[coreml]'")

    class Sized(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t.reshape(t.shape[0], -1) * 2

    def converts(model, example):
        with torch.no_grad():
            traced = torch.jit.trace(model, example)
        try:
            _convert(traced, inputs=[ct.TensorType(name='x', shape=example.shape)])
        except TypeError as e:
            assert 'only 0-dimensional arrays' in str(e)
            return False
        return True

    assert converts(t_cnn, x) == converts(Sized(), torch.randn(2, 3, 4))
