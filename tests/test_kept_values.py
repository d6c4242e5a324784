"""What a GPSA layer keeps from call to call in eager inference (``tcnn.layers.kept_values``): the kept terms follow
every change of the parameters they come from, stay few, graph-free and off the state dict, and give the outputs and
gradients of terms computed afresh; nothing is kept where a tracer, an exporter or a functorch transform records or
wraps the forward."""
import copy
import os

import pytest
import torch
import torch.nn as nn

from tcnn.layers.gpsa import GPSA
from tcnn.layers.kept_values import is_exporting, may_keep

from formulas import gpsa_formula as _reference_gpsa
from helpers import rel_err
from nontrivial import away_from_exact


# ---------------------------------------------------------------- kept terms follow what they are made of

def _recomputed(layer: GPSA, x: torch.Tensor) -> torch.Tensor:
    """The layer's output with its positional terms computed afresh: with gradients on, nothing is taken from the
    layer's kept values except the parameter-free offsets."""
    with torch.enable_grad():
        return layer(x).detach()


def _changes():
    """In-place changes of the positional and gating parameters that a kept value must follow."""
    def setters(layer):
        layer.set_gating(-2.0)
        layer.set_locality_strength(torch.linspace(0.3, 3.0, layer.num_heads))

    def optimizer_step(layer):
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        layer(torch.randn(2, layer.in_chs, 7, 7)).square().mean().backward()
        opt.step()

    def load_state_dict(layer):
        other = GPSA(layer.in_chs, layer.out_chs, 3, padding=1, locality_strength=0.4, gating_init=-1.0)
        layer.load_state_dict(other.state_dict())

    def indexed_write(layer):
        with torch.no_grad():
            layer.pos_centers[0, 1] = 0.7

    def data_assignment(layer):  # replaces the storage without a version bump (torch.nn.utils.vector_to_parameters)
        torch.nn.utils.vector_to_parameters(torch.linspace(-1, 1, layer.num_heads), [layer.gating])

    def data_write_then_eval(layer):  # an in-place write through .data is not versioned: a mode switch drops them
        layer.gating.data.fill_(3.0)
        layer.eval()
    return [setters, optimizer_step, load_state_dict, indexed_write, data_assignment, data_write_then_eval]


@pytest.mark.parametrize('change', _changes(), ids=lambda f: f.__name__)
@pytest.mark.parametrize('mode', ['no_grad', 'inference_mode'])
def test_kept_positional_terms_follow_every_parameter_change(change, mode):
    layer = GPSA(16, 16, 3, padding=1, locality_strength=2.0, gating_init=0.5).eval()
    x = torch.randn(2, 16, 7, 7)
    context = torch.no_grad if mode == 'no_grad' else torch.inference_mode
    with context():
        before = layer(x)
    assert any(key[0] == 'positional_and_gate' for key in layer._kept_values), 'inference should keep them'
    change(layer)
    with context():
        after = layer(x)
    assert not torch.equal(after, before)
    torch.testing.assert_close(after, _recomputed(layer, x), rtol=0, atol=0)


def test_kept_values_follow_replaced_parameters_dtype_and_size():
    layer = GPSA(8, 8, 3, padding=1, locality_strength=2.0).eval()
    with torch.no_grad():
        layer(torch.randn(1, 8, 6, 6))
        layer.gating = nn.Parameter(torch.full((9,), -3.0))  # a new tensor, version 0 like the old one
        x = torch.randn(1, 8, 6, 6)
        torch.testing.assert_close(layer(x), _recomputed(layer, x), rtol=0, atol=0)
        layer.double()
        x64 = torch.randn(1, 8, 5, 9, dtype=torch.float64)
        out = layer(x64)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _recomputed(layer, x64), rtol=0, atol=0)


def test_values_kept_in_inference_mode_serve_a_later_training_step():
    """Values made during an inference-mode forward are ordinary tensors: a later training step can use them."""
    layer = GPSA(8, 8, 3, padding=1)
    fresh = copy.deepcopy(layer)  # the same parameters, never run in inference mode
    x = torch.randn(2, 8, 6, 6)
    with torch.inference_mode():
        layer.eval()(x)
    layer.train()(x).square().mean().backward()
    fresh.train()(x).square().mean().backward()
    for (name, p), q in zip(layer.named_parameters(), fresh.parameters()):
        assert p.grad is not None and p.grad.abs().max() > 0, name
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


@pytest.mark.parametrize('mode', ['no_grad', 'inference_mode', 'grad'])
def test_kept_values_are_graph_free_and_the_layer_deep_copies(mode):
    layer = GPSA(8, 8, 3, padding=1).eval()
    x = torch.randn(1, 8, 6, 6)
    context = {'no_grad': torch.no_grad, 'inference_mode': torch.inference_mode, 'grad': torch.enable_grad}[mode]
    with context():
        layer(x)
    kept = [t for _, value in layer._kept_values.values() for t in (value if isinstance(value, tuple) else (value,))
            if isinstance(t, torch.Tensor)]
    assert kept and not any(t.requires_grad or t.grad_fn is not None for t in kept)
    twin = copy.deepcopy(layer)  # what ModelEmaV3 and tcnn.save's checks do
    with torch.no_grad():
        torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
        twin.set_gating(-2.0)  # a copy, not a view of the same parameters or kept values
        assert not torch.allclose(twin(x), layer(x))


def test_kept_values_stay_few_and_off_the_state_dict():
    layer = GPSA(4, 4, 3, padding=1).eval()
    with torch.no_grad():
        for size in range(3, 23):
            layer(torch.randn(1, 4, size, size + 1))
    assert 0 < len(layer._kept_values) <= 8
    assert set(layer.state_dict()) == {n for n, _ in layer.named_parameters()}


def test_keep_holds_the_newest_eight_and_remakes_stale_ones():
    """``keep``'s bookkeeping against a hand-run least-recently-made list: a value is made once while its parameters
    keep their version, made again (and counted newest) when one changes, and the 9th new key drops the oldest."""
    from tcnn.layers.kept_values import MAX_KEPT, keep
    assert MAX_KEPT == 8
    layer, param = nn.Module(), nn.Parameter(torch.zeros(1))
    made = []

    def make(key):
        made.append(key)
        return torch.full((1,), float(len(made)))
    for k in range(8):
        keep(layer, (k,), (param,), lambda k=k: make(k))
    assert list(layer._kept_values) == [(k,) for k in range(8)]
    assert keep(layer, (0,), (param,), lambda: make('again')).item() == 1.0 and len(made) == 8  # kept: not made
    with torch.no_grad():
        param.add_(1)  # a new version: every value is stale
    assert keep(layer, (0,), (param,), lambda: make(0)).item() == 9.0  # made again, now the newest
    keep(layer, (8,), (param,), lambda: make(8))
    assert list(layer._kept_values) == [(k,) for k in (2, 3, 4, 5, 6, 7, 0, 8)]  # (1,) was the oldest


def test_frozen_layer_gives_input_gradients_after_inference_mode():
    """A frozen layer (no parameter requires grad: a feature extractor, saliency maps) keeps its positional terms in
    eval mode also when its input requires grad; kept after a call under ``torch.inference_mode``, they must be
    ordinary tensors, which autograd may save (an inference tensor cannot be), and the input gradient the float64
    formulas' (``tests/formulas.py``)."""
    torch.manual_seed(0)
    layer = away_from_exact(GPSA(4, 4, 3, padding=1), value_noise=0.2).eval().requires_grad_(False)
    x = torch.randn(2, 4, 5, 5)
    with torch.inference_mode():
        layer(x)
    x.requires_grad_(True)
    layer(x).square().sum().backward()
    x64 = x.detach().double().requires_grad_(True)
    _reference_gpsa(layer, x64).square().sum().backward()
    # relative to the largest component: 2.8e-7 to 5.2e-7 over seeds 0-4 (float32 against float64), 2x that here
    assert rel_err(x.grad, x64.grad) < 1.1e-6


def test_float64_positional_parameters_of_a_float32_layer_give_one_input_gradient_on_every_path():
    """A float32 layer may keep its positional and gating parameters in float64 (a full-precision copy): its attention
    terms are cast to the scores' dtype on every path, the kept terms of eager mode and the recomputed ones (here under
    ``torch.func.grad``, which keeps nothing), to the same input gradient, bit for bit."""
    torch.manual_seed(0)
    layer = away_from_exact(GPSA(4, 4, 3, padding=1), 0.3)
    for name in ('pos_locality', 'pos_centers', 'gating'):
        getattr(layer, name).data = getattr(layer, name).data.double()
    x = torch.randn(2, 4, 5, 5)
    grad = torch.func.grad(lambda inp: layer(inp).square().sum())(x)
    x.requires_grad_(True)
    out = layer(x)
    out.square().sum().backward()
    assert out.dtype == grad.dtype == torch.float32 and layer.gating.grad.dtype == torch.float64
    assert torch.equal(grad, x.grad)


def test_functional_call_uses_its_own_parameters():
    """torch.func.functional_call swaps the parameters for one call: nothing kept for the layer's own is used."""
    layer = GPSA(8, 8, 3, padding=1, gating_init=0.0).eval()
    x = torch.randn(1, 8, 6, 6)
    with torch.no_grad():
        layer(x)
        params = {n: p.detach().clone() for n, p in layer.named_parameters()}
        params['gating'] = torch.full((9,), 4.0)
        out = torch.func.functional_call(layer, params, (x,))
    other = GPSA(8, 8, 3, padding=1).eval()
    other.load_state_dict(params)
    torch.testing.assert_close(out, _recomputed(other, x), rtol=0, atol=0)


def test_train_without_an_argument_is_training_mode():
    """``GPSA.train()`` with no argument switches training on, as ``nn.Module.train`` does (and drops what was kept)."""
    layer = GPSA(4, 4, 3, padding=1).eval()
    with torch.no_grad():
        layer(torch.randn(1, 4, 5, 5))
    assert layer._kept_values
    assert layer.train() is layer and layer.training and not getattr(layer, '_kept_values', None)


# ---------------------------------------------------------------- nothing kept where the forward is recorded

@pytest.mark.skipif(os.environ.get('PYTORCH_JIT') == '0', reason='TorchScript off: torch.jit.trace returns the '
                                                                   'function itself, untraced')
def test_tracing_counts_as_exporting_and_keeps_nothing():
    """``torch.jit.trace`` (also what the TorchScript ONNX exporter runs) records the forward: ``is_exporting`` says
    so, and a traced layer keeps nothing (a kept tensor would become a constant of the trace)."""
    seen = []

    def record(x):
        seen.append((is_exporting(), may_keep(5)))
        return x * 2
    torch.jit.trace(record, torch.randn(2), check_trace=False)
    assert seen == [(True, False)] and (is_exporting(), may_keep(5)) == (False, True)
    layer = GPSA(4, 4, 3, padding=1, groups=4).eval()
    with torch.no_grad():
        torch.jit.trace(layer, torch.randn(1, 4, 5, 5), check_trace=False)
    assert not getattr(layer, '_kept_values', None)


def test_nothing_is_kept_inside_functorch_transforms():
    """A kept tensor would escape the transform (``may_keep``): under ``torch.func.grad`` the layer keeps nothing, in
    eval mode too, and gives autograd's input gradient."""
    layer = GPSA(4, 4, 3, padding=1).eval()
    x = torch.randn(2, 4, 5, 5)
    grad = torch.func.grad(lambda inp: layer(inp).square().sum())(x)
    assert not layer.__dict__.get('_kept_values')
    x.requires_grad_(True)
    layer(x).square().sum().backward()
    torch.testing.assert_close(grad, x.grad)
