"""The depthwise GPSA product (tcnn.layers.depthwise): both orders (folded and chunked, attending first) against the
written-out sum, with gradients in float64 (gradcheck) for every chunking (one chunk; images and channels in chunks
with a partial last one; heads in chunks), channel multipliers, autocast, which order each shape gets, and whole
depthwise layers against their TorchScript form, which attends first."""
import pytest
import torch
import torch.nn as nn

from tcnn.layers import depthwise
import tcnn.layers.gpsa
from tcnn.layers.gpsa import GPSA

from helpers import rel_err
from nontrivial import away_from_exact


def _definition(attn: torch.Tensor, values: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """out[b, q, c] = sum_h taps[h, c] sum_k attn[b, q, h, k] values[b, k, c // m], written out."""
    b, n_q = attn.shape[:2]
    num_heads = taps.shape[0]
    multiplier = taps.shape[1] // values.shape[-1]
    a = attn.view(b, n_q, num_heads, -1)
    return torch.einsum('bqhk,hc,bkc->bqc', a, taps, values.repeat_interleave(multiplier, dim=-1))


def _inputs(b: int, n_q: int, num_heads: int, n_k: int, c_in: int, c_out: int, dtype=torch.float64):
    torch.manual_seed(0)
    attn = torch.rand(b, n_q, num_heads, n_k, dtype=dtype).softmax(-1).view(b, n_q, -1)
    values = torch.randn(b, n_k, c_in, dtype=dtype)
    taps = torch.randn(num_heads, c_out, dtype=dtype)
    return attn, values, taps


@pytest.fixture
def folded(monkeypatch):
    """The folded product at any shape (the tests' shapes are small enough to attend first)."""
    monkeypatch.setattr(depthwise, 'FOLD_MIN_ROW', 0)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of one image, 8 channels and single heads, as a CPU takes them at large batch or width."""
    monkeypatch.setattr(depthwise, 'CPU_CHUNK_ELEMENTS', 1)
    monkeypatch.setattr(depthwise, 'MIN_CHUNK', 8)
    monkeypatch.setattr(depthwise, 'MIN_GEMM_COLUMNS', 1)


@pytest.mark.parametrize('order', ['heads-first', 'folded', 'folded-chunks'])
@pytest.mark.parametrize('c_in,c_out', [(20, 20), (10, 30)], ids=['depthwise', 'multiplier3'])
def test_product_and_gradients_match_the_definition(request, order, c_in, c_out):
    if order == 'heads-first':
        assert not depthwise.folding_pays(2, 6, 9, 5, c_out)  # shapes this small attend first
    else:
        request.getfixturevalue('folded')
    if order == 'folded-chunks':
        request.getfixturevalue('small_chunks')
        # one image, 8 channels: 8 + 8 + 4 (30: +6)
        assert depthwise._plan(2, 9 * 5, c_out, torch.device('cpu')) == (1, 8)
    attn, values, taps = (t.requires_grad_() for t in _inputs(2, 6, 9, 5, c_in, c_out))
    torch.testing.assert_close(depthwise.attend_depthwise(attn, values, taps), _definition(attn, values, taps))
    assert torch.autograd.gradcheck(depthwise.attend_depthwise, (attn, values, taps))


def test_which_order_each_shape_gets():
    # (batch, N_q, N_h, N_k, channels) of depthwise last stages at 224 px; docs/benchmarks.md has the timings
    assert depthwise.folding_pays(1, 49, 49, 49, 768)  # ConvNeXt 7x7: long attention rows
    assert depthwise.folding_pays(1, 49, 25, 49, 960)  # MobileNetV3 5x5
    assert not depthwise.folding_pays(4, 49, 9, 49, 1152)  # EfficientNet 3x3 at batch 4: attended values fit in cache
    assert depthwise.folding_pays(16, 49, 9, 49, 1152)  # ... at batch 16 they do not


def test_only_the_gradients_asked_for(folded, small_chunks):
    # a frozen attention (no grad) and frozen values: only the taps' gradient, equal to the definition's
    attn, values, taps = _inputs(3, 4, 9, 4, 24, 24)
    taps.requires_grad_()
    grad = torch.randn(3, 4, 24, dtype=torch.float64)
    (got,) = torch.autograd.grad(depthwise.attend_depthwise(attn, values, taps), taps, grad)
    (want,) = torch.autograd.grad(_definition(attn, values, taps), taps, grad)
    torch.testing.assert_close(got, want)


def test_autocast_computes_in_the_autocast_dtype(folded):
    attn, values, taps = (t.requires_grad_() for t in _inputs(2, 5, 9, 5, 40, 40, dtype=torch.float32))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = depthwise.attend_depthwise(attn, values, taps)
    assert out.dtype == torch.bfloat16
    ref = _definition(attn, values, taps)
    # max error relative to the largest output, these shapes at seeds 0-19: 2.5e-3 to 7.6e-3 folded (attending
    # first: 3.2e-3 to 1.01e-2; 2026-11-26); tolerance 1.5x
    assert rel_err(out, ref) < 1.15e-2
    out.float().square().sum().backward()
    assert attn.grad.dtype == values.grad.dtype == taps.grad.dtype == torch.float32  # back in the inputs' dtype



def test_traceable_product_is_in_the_values_dtype():
    """``attend_traceable`` (exporters, tracers) casts to the values' dtype, as ``attend_depthwise`` does outside
    autocast: a float32 attention (a bfloat16 layer computes it in float32) and float32 taps (a layer traced under
    autocast) with bfloat16 values give a bfloat16 product equal to the written-out sum in float64. Max error relative
    to the largest output at seeds 0-9: 2.4e-3 to 7.7e-3 (2026-11-27); tolerance 1.5e-2."""
    attn, values, taps = _inputs(2, 5, 9, 6, 8, 16, dtype=torch.float32)  # multiplier 2
    values = values.bfloat16()
    out = depthwise.attend_traceable(attn, values, taps)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, _definition(attn.double(), values.double(), taps.double())) < 1.5e-2


def _not_here(*args):
    raise AssertionError('attended first where folding was expected')


@pytest.mark.parametrize('mode', ['zeros', 'reflect'])
@pytest.mark.parametrize('cin,cout,stride', [(40, 40, 1), (20, 40, 2)], ids=['depthwise', 'multiplier2-s2'])
def test_depthwise_layer_matches_its_torchscript_form(monkeypatch, small_chunks, cin, cout, stride, mode):
    # TorchScript cannot call the autograd function and evaluates the heads first (attention times values, then the
    # per-channel sum over the heads): the same layer computed the other way round, forward and backward
    torch.manual_seed(0)
    layer = GPSA.from_conv(nn.Conv2d(cin, cout, 5, stride, 2, groups=cin, bias=True, padding_mode=mode))
    away_from_exact(layer, value_noise=0.3)
    scripted = torch.jit.script(layer)
    # eager mode folds (25 heads x 72 keys); script cannot
    monkeypatch.setattr(depthwise, 'attend_heads_first', _not_here)
    x = torch.randn(3, cin, 9, 8, requires_grad=True)
    out, ref = layer(x), scripted(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    grad = torch.randn_like(out)
    params = [x] + list(layer.parameters())
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(ref, params, grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)



@pytest.mark.parametrize('kernel,size,order', [(7, 7, 'folded'), (3, 5, 'heads-first')], ids=['k7', 'k3'])
def test_eager_layer_takes_the_order_that_pays(monkeypatch, kernel, size, order):
    """In eager mode a depthwise layer's product is ``attend_depthwise``'s choice for the shape: folded for a 7x7
    kernel (49 heads x 49 keys per attention row), attending first for a 3x3 kernel at batch 2; never TorchScript's
    form nor the exporters' (``attend_heads_first``, ``attend_traceable`` called by the layer itself)."""
    calls = []

    def recording(name, fn):
        return lambda *args: calls.append(name) or fn(*args)

    monkeypatch.setattr(depthwise, 'attend_folded', recording('folded', depthwise.attend_folded))
    monkeypatch.setattr(depthwise, 'attend_heads_first', recording('heads-first', depthwise.attend_heads_first))
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_heads_first', recording('scripted', depthwise.attend_heads_first))
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_traceable', recording('exported', depthwise.attend_traceable))
    layer = GPSA.from_conv(nn.Conv2d(8, 8, kernel, padding=kernel // 2, groups=8))
    layer(torch.randn(2, 8, size, size))
    assert calls == [order]


def test_folded_layer_compiles_without_graph_breaks(small_chunks):
    # torch.compile(fullgraph=True) traces the autograd function and its chunk loops (aot_eager: no C++ toolchain)
    torch.manual_seed(0)
    layer = GPSA.from_conv(nn.Conv2d(32, 32, 7, 1, 3, groups=32))
    away_from_exact(layer, value_noise=0.3)
    compiled = torch.compile(layer, fullgraph=True, backend='aot_eager')
    x = torch.randn(2, 32, 7, 7, requires_grad=True)
    out, ref = compiled(x), layer(x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out.square().sum(), x)[0],
                               torch.autograd.grad(ref.square().sum(), x)[0])


def test_per_sample_gradients_with_torch_func(folded, small_chunks):
    """torch.func's per-sample gradients (vmap(grad(...))) through the folded product equal one backward per sample;
    the taps shared by the samples, as a layer's filter is."""
    attn, values, taps = _inputs(4, 5, 9, 6, 16, 16)

    def loss(a, v, w):  # one sample: a batch of one image
        return depthwise.attend_folded(a[None], v[None], w).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=(0, 0, None))(attn, values, taps)
    for i in range(4):
        a, v, w = (t.clone().requires_grad_() for t in (attn[i], values[i], taps))
        expected = torch.autograd.grad(_definition(a[None], v[None], w).square().sum(), (a, v, w))
        for got, want in zip(per_sample, expected):
            torch.testing.assert_close(got[i], want)
    # per-sample taps too (vmapped over every input), and the forward alone under vmap
    out = torch.func.vmap(lambda a, v, w: depthwise.attend_folded(a[None], v[None], w)[0])(
        attn, values, taps[None].repeat(4, 1, 1))
    torch.testing.assert_close(out, _definition(attn, values, taps))



@pytest.mark.parametrize('argnum', [0, 1, 2], ids=['attention', 'values', 'taps'])
def test_per_sample_gradient_of_one_input(folded, small_chunks, argnum):
    """``vmap(grad(...))`` asked for the gradient of one input only (e.g. a filter's per-sample gradient, DP-SGD's):
    the backward then computes only some of the three gradients, and each sample's equals its own backward through
    the written-out sum."""
    attn, values, taps = _inputs(3, 5, 9, 6, 16, 16)

    def loss(a, v, w):  # one sample: a batch of one image
        return depthwise.attend_folded(a[None], v[None], w).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss, argnums=argnum), in_dims=(0, 0, None))(attn, values, taps)
    for i in range(3):
        inputs = [attn[i], values[i], taps]
        inputs[argnum] = inputs[argnum].clone().requires_grad_()
        a, v, w = inputs
        (want,) = torch.autograd.grad(_definition(a[None], v[None], w).square().sum(), inputs[argnum])
        torch.testing.assert_close(per_sample[i], want)


def test_vmap_over_some_inputs_at_any_dimension(folded, small_chunks):
    """``torch.vmap`` of the folded product over the attention only (the values shared, as they are by every query
    of a sample), at its second dimension, and over the values only: each equals the written-out sum per sample."""
    attn, values, taps = _inputs(3, 5, 9, 6, 16, 16)
    one = lambda a, v: depthwise.attend_folded(a[None], v[None], taps)[0]  # noqa: E731
    out = torch.func.vmap(one, in_dims=(1, None))(attn.movedim(0, 1), values[0])
    torch.testing.assert_close(out, _definition(attn, values[:1].expand_as(values), taps))
    out = torch.func.vmap(one, in_dims=(None, 2))(attn[0], values.movedim(0, 2))
    torch.testing.assert_close(out, _definition(attn[:1].expand_as(attn), values, taps))


@pytest.mark.parametrize('c_in,c_out', [(12, 12), (6, 18)], ids=['depthwise', 'multiplier3'])
def test_folded_product_is_twice_differentiable(folded, small_chunks, c_in, c_out, monkeypatch):
    """Double backward (gradient penalties, Hessian-vector products) against finite differences in float64, in chunks
    of one image and 8 channels."""
    attn, values, taps = (t.requires_grad_() for t in _inputs(2, 3, 9, 2, c_in, c_out))
    assert torch.autograd.gradgradcheck(depthwise.attend_folded, (attn, values, taps), fast_mode=True)
    # a gradient penalty through a whole depthwise layer
    layer = GPSA.from_conv(nn.Conv2d(8, 8, 3, padding=1, groups=8)).double()
    x = torch.randn(2, 8, 5, 5, dtype=torch.float64, requires_grad=True)

    def penalty_gradients():
        layer.zero_grad()
        (grad_x,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        grad_x.square().sum().backward()
        return [p.grad.clone() for p in layer.parameters()]

    folded_grads = penalty_gradients()
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_depthwise', depthwise.attend_traceable)  # plain ops, autograd
    plain_grads = penalty_gradients()
    for (name, _), a, b in zip(layer.named_parameters(), folded_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize('frozen', ['attention', 'values', 'taps', 'values-taps'])
def test_double_backward_with_frozen_inputs(folded, small_chunks, frozen):
    """Double backward against finite differences in float64 with some inputs constant (a frozen attention, a frozen
    filter): the first backward then returns no gradient for them, and the second must still sum the contributions
    of the others and reach the first backward's incoming gradient."""
    attn, values, taps = _inputs(2, 3, 9, 2, 12, 12)
    inputs = {'attention': attn, 'values': values, 'taps': taps}
    varying = [name for name in inputs if name not in frozen.split('-')]

    def product(*args):
        given = {**inputs, **dict(zip(varying, args))}
        return depthwise.attend_folded(given['attention'], given['values'], given['taps'])

    assert torch.autograd.gradgradcheck(product, tuple(inputs[n].requires_grad_() for n in varying), fast_mode=True)
