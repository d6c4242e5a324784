"""The depthwise GPSA product (tcnn.layers.depthwise): both orders (folded and chunked, attending first) against the
written-out sum, with gradients in float64 (gradcheck) for every chunking (one chunk; images and channels in chunks
with a partial last one; heads in chunks), channel multipliers, autocast, which order each shape gets, and whole
depthwise layers against their TorchScript form, which attends first."""
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from tcnn.layers import depthwise
import tcnn.layers.gpsa
from tcnn.layers.gpsa import GPSA

from helpers import rel_err, script
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


@pytest.mark.filterwarnings('error')  # e.g. a GEMM resizing a workspace tensor of the wrong shape
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


def test_chunk_plan_fits_the_devices_budget():
    """The folded product's chunks (``_plan``): the most channels whose folded values ``U`` for the whole batch fit
    the device's budget (a CPU's cache share; a GPU's transient memory, far larger), but at least ``MIN_CHUNK`` and at
    most all of them; then, if even that is too large, the batch in the fewest equal parts whose ``U`` fits twice the
    budget. Against a brute-force search over the chunk sizes and part counts; an empty batch still steps by one."""
    budgets = {'cpu': depthwise.CPU_CHUNK_ELEMENTS, 'cuda': depthwise.ACCELERATOR_CHUNK_ELEMENTS}
    assert budgets['cuda'] > 100 * budgets['cpu']
    for device, budget in budgets.items():
        for batch in (0, 1, 2, 3, 8, 64, 256):
            for row in (9 * 9, 25 * 25, 49 * 49, 9 * 49, 49 * 196):  # 49 * 196: one image's U over 2 CPU budgets
                for channels in (8, 40, 64, 768):
                    fits = [c for c in range(1, channels + 1) if batch * row * c <= budget]
                    chunk = min(channels, max([depthwise.MIN_CHUNK, *fits]))
                    cap = max([1, *(i for i in range(1, batch + 1) if i * row * chunk <= 2 * budget)])
                    parts = min([p for p in range(1, batch + 1) if -(-batch // p) <= cap], default=1)
                    images = max(1, -(-batch // parts))
                    got = depthwise._plan(batch, row, channels, torch.device(device))
                    assert got == (images, chunk), (device, batch, row, channels)


def test_attention_gradient_takes_as_many_heads_as_the_budget_holds():
    """The attention's gradient is computed a few heads at a time: the most heads whose folded values ``U`` (images x
    heads x keys x channels) fit the device's budget, but enough for ``MIN_GEMM_COLUMNS`` columns of each GEMM, and
    never more than the kernel's heads (a brute-force search over the head counts)."""
    cpu = torch.device('cpu')
    for images, n_k, channels, num_heads in [(2, 49, 64, 25), (1, 196, 32, 9), (8, 49, 256, 49), (4, 9, 16, 9),
                                             (1, 49, 512, 49), (3, 25, 40, 25)]:
        fits = [h for h in range(1, num_heads + 1) if h * images * n_k * channels <= depthwise.CPU_CHUNK_ELEMENTS]
        enough = -(-depthwise.MIN_GEMM_COLUMNS // n_k)
        expected = min(num_heads, max([enough, *fits]))
        got = depthwise._heads_per_chunk(images, n_k, channels, num_heads, cpu)
        assert type(got) is int and got == expected, (images, n_k, channels, num_heads)


def test_folding_pays_for_long_attention_rows_or_large_attended_values():
    # (batch, N_q, N_h, N_k, channels) of depthwise last stages at 224 px; docs/benchmarks.md has the timings
    assert depthwise.folding_pays(1, 49, 49, 49, 768)  # ConvNeXt 7x7: long attention rows
    assert depthwise.folding_pays(1, 49, 25, 49, 960)  # MobileNetV3 5x5
    assert not depthwise.folding_pays(4, 49, 9, 49, 1152)  # EfficientNet 3x3 at batch 4: attended values fit in cache
    assert depthwise.folding_pays(16, 49, 9, 49, 1152)  # ... at batch 16 they do not
    # the two thresholds, each reached exactly (and missed by one) with the other far off
    row, elements = depthwise.FOLD_MIN_ROW, depthwise.FOLD_MIN_HEADS_ELEMENTS
    assert depthwise.folding_pays(1, 1, 16, row // 16, 1) and not depthwise.folding_pays(1, 1, 1, row - 1, 1)
    assert depthwise.folding_pays(4, 64, 16, elements // (4 * 64 * 16), 1)
    assert depthwise.folding_pays(1, 1, 1, 1, elements) and not depthwise.folding_pays(1, 1, 1, 1, elements - 1)


@pytest.mark.parametrize('batch,n_q,num_heads,n_k,channels,folds', [
    (1, 49, 9, 49, 256, False),  # B * N_q * N_h * C = 112896: attending first
    (4, 49, 9, 49, 512, False),  # 903168
    (16, 49, 9, 49, 1152, True),  # 8.1M: folded
    (1, 49, 25, 49, 8, True)])  # a 1225-term attention row: folded
def test_the_product_takes_the_order_its_shape_gets(monkeypatch, batch, n_q, num_heads, n_k, channels, folds):
    """``attend_depthwise`` decides from its inputs' shapes as ``folding_pays`` says for (batch, queries, heads, keys,
    channels): on the meta device (shapes only), the order taken recorded."""
    taken = []
    monkeypatch.setattr(depthwise, 'attend_folded', lambda *args: taken.append(True))
    monkeypatch.setattr(depthwise, 'attend_heads_first', lambda *args: taken.append(False))
    attn = torch.empty(batch, n_q, num_heads * n_k, device='meta')
    depthwise.attend_depthwise(attn, torch.empty(batch, n_k, channels, device='meta'),
                               torch.empty(num_heads, channels, device='meta'))
    assert taken == [folds] and depthwise.folding_pays(batch, n_q, num_heads, n_k, channels) == folds


class _Overloads(TorchDispatchMode):
    """The ATen overloads called, in order (``aten.bmm.out``: a GEMM written into a given tensor)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def test_chunks_write_into_the_reused_workspace(folded, small_chunks):
    """Forward and backward, every chunk's GEMM and product writes into the call's workspace (``out=``), which holds
    one buffer per kind (forward: the folded values and the product, beside the output; backward: the folded values,
    the attention's and the folded values' gradients and the products): a fresh chunk-sized tensor per chunk pays page
    faults on a CPU (``_Workspace``)."""
    attn, values, taps = (t.requires_grad_() for t in _inputs(2, 6, 9, 5, 20, 20, dtype=torch.float32))
    with _Overloads() as forward:
        out = depthwise.attend_depthwise(attn, values, taps)
    with _Overloads() as backward:
        out.backward(torch.ones_like(out))
    for calls, buffers in ((forward.calls, 1 + 2), (backward.calls, 4)):
        products = [c for c in calls if c.startswith(('aten.bmm', 'aten.mul'))]
        assert len(products) > 10 and all(c.endswith('.out') for c in products), calls
        assert calls.count('aten.new_empty.default') == buffers, calls


def test_folded_product_runs_on_the_meta_device(folded):
    """Shape inference (a model built on 'meta', e.g. to count its FLOPs): the folded product and its backward run on
    the meta device, which has no autocast to switch off."""
    attn, values, taps = (torch.empty(*shape, device='meta', requires_grad=True)
                          for shape in ((2, 5, 9 * 5), (2, 5, 8), (9, 16)))  # multiplier 2
    out = depthwise.attend_depthwise(attn, values, taps)
    out.sum().backward()
    assert out.shape == (2, 5, 16) and out.device.type == 'meta'
    assert [t.grad.shape for t in (attn, values, taps)] == [attn.shape, values.shape, taps.shape]


def test_the_backward_computes_only_the_gradients_asked_for(folded, small_chunks, monkeypatch):
    """A frozen attention (no grad) and frozen values: only the taps' gradient, equal to the definition's; the backward
    computes (and returns) only the gradients asked for, and plans its chunks for the batch it is given (here more
    images than queries)."""
    plans = []
    plan = depthwise._plan
    monkeypatch.setattr(depthwise, '_plan', lambda *args: plans.append(args) or plan(*args))
    attn, values, taps = _inputs(5, 2, 9, 4, 24, 24)
    taps.requires_grad_()
    grad = torch.randn(5, 2, 24, dtype=torch.float64)
    (got,) = torch.autograd.grad(depthwise.attend_depthwise(attn, values, taps), taps, grad)
    (want,) = torch.autograd.grad(_definition(attn, values, taps), taps, grad)
    torch.testing.assert_close(got, want)
    assert plans and all(args[:3] == (5, 9 * 4, 24) for args in plans), plans
    backward = depthwise._AttendDepthwiseBackward.apply
    with torch.no_grad():
        only_attn, only_values_taps = (backward(grad, attn, values, taps, True, False),
                                       backward(grad, attn, values, taps, False, True))
    assert only_attn[0].shape == attn.shape and only_attn[1:] == (None, None)
    assert only_values_taps[0] is None and only_values_taps[2].shape == taps.shape


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



@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason='no CUDA device: CUDA autocast runs the sums in float32'))])
def test_autocast_casts_every_input_once(folded, small_chunks, monkeypatch, device):
    """Under autocast the folded product is the one of its three inputs cast to the autocast dtype (bfloat16 here), bit
    for bit, forward and backward, also when the backward runs inside the autocast context: the chunks compute in
    that one dtype with autocast off inside (no float32 taps against bfloat16 values; no sum that CUDA's autocast
    would run in float32 and add to the taps' gradient chunk by chunk)."""
    monkeypatch.setattr(depthwise, 'ACCELERATOR_CHUNK_ELEMENTS', 1)  # chunks on a GPU too
    attn, values, taps = (t.to(device).requires_grad_() for t in _inputs(3, 5, 9, 5, 24, 24, dtype=torch.float32))
    grad = torch.randn(3, 5, 24, dtype=torch.bfloat16, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = depthwise.attend_depthwise(attn, values, taps)
        grads = torch.autograd.grad(out, (attn, values, taps), grad)
    cast = [t.detach().bfloat16().requires_grad_() for t in (attn, values, taps)]
    ref = depthwise.attend_depthwise(*cast)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref, cast, grad)):
        assert got.dtype == torch.float32 and torch.equal(got, want.float())


@pytest.mark.parametrize('product', ['attend_traceable', 'attend_heads_first'])
def test_plain_products_are_in_the_values_dtype(product):
    """``attend_traceable`` (exporters, tracers) and ``attend_heads_first`` (TorchScript, small shapes) cast to the
    values' dtype, as ``attend_depthwise`` does outside autocast: a float32 attention (a bfloat16 layer computes it in
    float32) and float32 taps (a layer traced under autocast) with bfloat16 values give a bfloat16 product equal to
    the written-out sum in float64. Max error relative to the largest output: 4.1e-3 for both at these inputs (seed 0),
    2.1e-3 to 1.13e-2 over inputs of seeds 0-19 (2026-11-27); tolerance 1.5e-2."""
    attn, values, taps = _inputs(2, 5, 9, 6, 8, 16, dtype=torch.float32)  # multiplier 2
    values = values.bfloat16()
    out = getattr(depthwise, product)(attn, values, taps)
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
    scripted = script(layer)
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


def test_per_sample_gradients_with_torch_func_equal_one_backward_per_sample(folded, small_chunks):
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
def test_the_per_sample_gradient_of_one_input_equals_its_own_backward(folded, small_chunks, argnum):
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


def test_vmap_over_some_inputs_at_any_dimension_is_the_sum_per_sample(folded, small_chunks):
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
def test_double_backward_with_frozen_inputs_matches_finite_differences(folded, small_chunks, frozen):
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
