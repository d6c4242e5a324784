"""The GPSA layer: the conv in its exact configuration and the papers' formula away from it, its construction,
settings and introspection, its precision, TorchScript, FX and the exporters, and what a forward costs. What it keeps
from call to call: tests/test_kept_values.py; its geometry: tests/test_geometry.py."""
import ast
import math
import pathlib
from math import inf, nan

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from tcnn.errors import InvalidArgumentError, InvalidTypeError, TcnnError
from tcnn.gpsa_parameters import SOFTPLUS_BETA
from tcnn.layers.gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA, check_unsharded, locality_to_raw, softplus_beta_5
from tcnn.layers.projections import upgrade_proj_weight

from benchmarks.measure import OperatorCount
from formulas import gpsa_formula as _reference_gpsa
from helpers import rel_err, script
from nontrivial import away_from_exact


# ---------------------------------------------------------------- the exact configuration is the conv

CASES = [
    # kernel, stride, padding, dilation, bias, groups, padding_mode, (H, W)
    pytest.param(3, 1, 1, 1, False, 1, 'zeros', (7, 7), id='k3-s1'),
    pytest.param(3, 2, 1, 1, True, 1, 'zeros', (14, 14), id='k3-s2-bias'),
    pytest.param(3, 2, 1, 1, False, 1, 'zeros', (11, 9), id='k3-s2-odd-nonsquare'),
    pytest.param(3, 1, 2, 2, False, 1, 'zeros', (10, 13), id='k3-dil2'),
    pytest.param(3, 1, (2, 1), (2, 1), False, 1, 'zeros', (7, 6), id='k3-dil2-rows-only'),
    pytest.param((3, 5), (1, 2), (1, 4), (1, 2), True, 1, 'zeros', (6, 9), id='k3x5-s2-dil2-columns-only'),
    pytest.param(3, 2, 2, 2, True, 1, 'zeros', (9, 12), id='k3-s2-dil2'),
    pytest.param(5, 1, 2, 1, True, 1, 'zeros', (9, 6), id='k5-s1'),
    pytest.param(5, 2, 2, 1, False, 1, 'zeros', (13, 10), id='k5-s2'),
    pytest.param(3, 2, 0, 1, False, 1, 'zeros', (9, 9), id='k3-s2-nopad'),
    pytest.param((3, 5), 1, (1, 2), 1, True, 1, 'zeros', (8, 7), id='k3x5'),
    pytest.param(3, 1, 1, 1, False, 4, 'zeros', (7, 8), id='grouped'),
    pytest.param(3, 2, 1, 1, True, 2, 'zeros', (11, 9), id='grouped-s2-bias'),
    pytest.param(3, 1, 2, 2, False, 8, 'zeros', (10, 13), id='grouped-dil2'),
    pytest.param(5, 2, 2, 1, True, 4, 'reflect', (13, 10), id='grouped-k5-s2-reflect'),
    pytest.param(3, 1, 1, 1, False, 8, 'circular', (6, 6), id='grouped-circular'),
    pytest.param(3, 2, 1, 1, False, 1, 'reflect', (9, 10), id='reflect'),
    pytest.param(3, 1, 1, 1, True, 1, 'circular', (6, 6), id='circular'),
    pytest.param(3, 1, 'same', 1, False, 1, 'zeros', (5, 7), id='same'),
    pytest.param((3, 5), 1, 'same', 1, True, 1, 'zeros', (6, 7), id='same-k3x5'),  # pads (1, 2)
    pytest.param(3, 1, 'valid', 1, False, 1, 'zeros', (5, 7), id='valid'),
]


@pytest.mark.parametrize('kernel,stride,padding,dilation,bias,groups,mode,size', CASES)
def test_exact_configuration_equals_conv(kernel, stride, padding, dilation, bias, groups, mode, size):
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 24, kernel, stride, padding, dilation, groups=groups, bias=bias, padding_mode=mode)
    x = torch.randn(3, 16, *size)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    ref, out = conv(x), gpsa(x)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize('kernel,dilation', [(4, 1), ((3, 2), (2, 3))], ids=['even-kernel', 'dilated-even-axis'])
def test_same_padding_of_an_even_effective_kernel_is_refused(kernel, dilation):
    """``padding='same'`` pads an even effective kernel (``d * (k - 1)`` odd) asymmetrically, which the layer's
    symmetric padding cannot do: ``from_conv`` refuses it, saying so."""
    conv = nn.Conv2d(4, 4, kernel, padding='same', dilation=dilation)
    with pytest.raises(ValueError) as err:
        GPSA.from_conv(conv)
    assert str(err.value) == 'padding="same" with an even effective kernel pads asymmetrically; not supported'


def test_a_single_tap_filter_shifts_the_input_by_its_tap():
    # A filter with one non-zero tap at (row 0, col 2) is a pure shift: catches a transposed head order, which a
    # symmetric filter would hide.
    conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[:, :, 0, 2] = torch.eye(4)
    x = torch.randn(2, 4, 6, 7)
    out = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)(x)
    shifted = F.pad(x, (1, 1, 1, 1))[:, :, 0:6, 2:9]  # out[i, j] = x[i - 1, j + 1]
    torch.testing.assert_close(out, shifted, atol=1e-6, rtol=0)
    transposed = F.pad(x, (1, 1, 1, 1))[:, :, 2:8, 0:7]
    assert (out - transposed).abs().max() > 0.1


def test_the_input_size_may_change_between_calls():
    conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    for size in [(10, 10), (5, 5), (12, 7), (3, 4)]:
        x = torch.randn(1, 8, *size)
        assert rel_err(gpsa(x), conv(x)) < 1e-5


def test_a_layer_cast_after_its_first_forward_computes_in_its_new_dtype():
    conv = nn.Conv2d(8, 8, 3, padding=1).double()
    gpsa = GPSA.from_conv(conv.float(), EXACT_LOCALITY, EXACT_GATING)
    gpsa(torch.randn(1, 8, 5, 5))
    gpsa = gpsa.double()
    x = torch.randn(2, 8, 6, 5, dtype=torch.float64)
    out = gpsa(x)
    assert out.dtype == torch.float64
    assert rel_err(out, conv.double()(x)) < 1e-12  # float64 all the way: exact to double precision


@pytest.mark.parametrize('groups', [1, 8], ids=['dense', 'depthwise'])
def test_an_unbatched_input_is_a_batch_of_one_as_for_the_conv(groups):
    """An unbatched ``(C_in, H, W)`` input gives the conv's unbatched output: the layer's output for the batch of one
    without its batch dimension, bit for bit and contiguous (as the conv's); scripted and FX-traced layers too, and
    the gradient reaches the input."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=groups)
    layer = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    x = torch.randn(8, 9, 7, requires_grad=True)
    out, ref = layer(x), conv(x)
    assert out.shape == ref.shape == (16, 5, 4) and out.is_contiguous() and ref.is_contiguous()
    assert rel_err(out, ref) < 1e-5  # as test_exact_configuration_equals_conv
    assert torch.equal(out, layer(x[None])[0])
    assert torch.equal(script(layer)(x), out) and torch.equal(torch.fx.symbolic_trace(layer)(x), out)
    assert layer.attention(x)['mixed'].shape == (1, 9, 20, 99)  # a batch of one: 9 heads, 5 x 4 queries, 11 x 9 keys
    out.sum().backward()
    assert x.grad.shape == x.shape and x.grad.abs().sum() > 0


@pytest.mark.parametrize('shape,message', [
    ((2, 5, 7, 7), 'GPSA expected input[2, 5, 7, 7] to have 8 channels, but got 5 channels instead'),
    ((5, 7, 7), 'GPSA expected input[5, 7, 7] to have 8 channels, but got 5 channels instead'),
    ((1, 2, 8, 7, 7), 'Expected 3D (unbatched) or 4D (batched) input to GPSA, but got input of size: [1, 2, 8, 7, 7]'),
    ((8, 7), 'Expected 3D (unbatched) or 4D (batched) input to GPSA, but got input of size: [8, 7]'),
], ids=['channels', 'unbatched-channels', '5d', '2d'])
def test_an_input_the_conv_refuses_is_refused_with_its_message(shape, message):
    """What ``nn.Conv2d`` refuses (another number of channels, a rank other than 3 or 4), the layer refuses with
    the conv's error type and message (its name for the conv's), not a GEMM's shape error; ``attention`` too."""
    conv = nn.Conv2d(8, 16, 3, padding=1)
    layer, x = GPSA.from_conv(conv), torch.randn(shape)
    with pytest.raises(RuntimeError, match='channels instead' if 'channels' in message else 'input of size'):
        conv(x)
    for call in (layer, layer.attention, torch.fx.symbolic_trace(layer)):
        with pytest.raises(RuntimeError) as err:
            call(x)
        assert str(err.value) == message


def test_batch_shared_attention_does_not_mix_samples():
    gpsa = GPSA(16, 16, 3, padding=1)
    x = torch.randn(4, 16, 6, 6)
    torch.testing.assert_close(gpsa(x)[1:2], gpsa(x[1:2]), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- away from it: the papers' formula

@pytest.mark.parametrize('kernel,stride,padding,dilation,mode,size,channels_last', [
    pytest.param(3, 1, 1, 1, 'zeros', (7, 6), False, id='k3-s1'),
    pytest.param(3, 2, 1, 1, 'zeros', (11, 9), False, id='k3-s2-odd'),
    pytest.param(3, 1, 1, 1, 'zeros', (6, 7), True, id='k3-s1-channels-last'),
    pytest.param(3, 2, 1, 1, 'zeros', (10, 10), True, id='k3-s2-channels-last'),
    pytest.param(3, 1, 2, 1, 'zeros', (5, 6), False, id='padding-beyond-anchor'),
    pytest.param(3, 2, 3, 2, 'zeros', (9, 8), False, id='s2-dil2-padding-beyond-anchor'),
    pytest.param(3, 2, 0, 1, 'zeros', (9, 8), False, id='no-padding'),
    pytest.param(4, 1, 1, 1, 'zeros', (6, 7), False, id='even-kernel'),
    pytest.param((3, 5), 2, (1, 2), 1, 'zeros', (9, 10), False, id='k3x5-s2'),
    pytest.param(3, 1, 1, 1, 'reflect', (6, 5), False, id='reflect'),
    pytest.param(3, 2, 1, 1, 'replicate', (9, 7), True, id='replicate-s2-channels-last'),
    pytest.param(3, 1, 2, 1, 'circular', (6, 6), False, id='circular-padding-beyond-anchor'),
    # one axis at a time: padding, stride and dilation each on the rows or the columns only
    pytest.param((3, 1), 1, (1, 0), 1, 'zeros', (6, 5), False, id='k3x1-padding-rows-only'),
    pytest.param((1, 3), 1, (0, 1), 1, 'zeros', (5, 6), False, id='k1x3-padding-columns-only'),
    pytest.param((3, 1), 1, (1, 0), 1, 'reflect', (6, 5), False, id='k3x1-reflect-rows-only'),
    pytest.param((1, 3), 1, (0, 1), 1, 'replicate', (5, 6), False, id='k1x3-replicate-columns-only'),
    pytest.param(3, (2, 1), 1, 1, 'zeros', (9, 6), False, id='stride-rows-only'),
    pytest.param(3, (1, 2), 1, 1, 'zeros', (6, 9), False, id='stride-columns-only'),
    pytest.param(3, 1, (2, 1), (2, 1), 'zeros', (7, 6), False, id='dilation-rows-only'),
])
def test_general_parameters_match_the_naive_definition(kernel, stride, padding, dilation, mode, size, channels_last):
    # Away from the exact configuration every branch matters: content attention, gates, shifted centres, values.
    torch.manual_seed(0)
    gpsa = GPSA(12, 10, kernel, stride, padding, dilation, bias=True, padding_mode=mode, qk_dim=5,
                locality_strength=0.7)
    away_from_exact(gpsa, value_noise=0.2)
    x = torch.randn(2, 12, *size)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out = gpsa(x)
    expected = _reference_gpsa(gpsa, x).float()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    content = gpsa.attention(x)['content']
    assert content.shape[-1] == (size[0] + 2 * gpsa.padding[0]) * (size[1] + 2 * gpsa.padding[1])
    torch.testing.assert_close(content.sum(-1), torch.ones(content.shape[:-1]))


def test_paper_init_is_not_the_conv_but_close_to_it():
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 32, 3, padding=1, bias=False)
    x = torch.randn(2, 32, 8, 8)
    gpsa = GPSA.from_conv(conv, 1.0, 1.0)
    out = gpsa(x)
    # the paper's init computes the obvious GPSA's function at alpha = lambda = 1 (float64 oracle) ...
    assert rel_err(out, _reference_gpsa(gpsa, x).float()) < 1e-5
    # ... which is "on the verge of locality" (T-CNN section 2): a real deviation from the conv, of the order of the
    # ~60% per layer of a ResNet-50's layer4 (three quarters of the positional mass off the tap, a quarter content)
    assert 0.3 < rel_err(out, conv(x)) < 1.0


def test_exact_positional_attention_is_one_hot_on_each_heads_tap():
    conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    h, w = 9, 6
    pos = gpsa.positional_attention(h, w, torch.device('cpu'))
    h_out, w_out = gpsa.output_size(h, w)
    assert pos.shape == (9, h_out * w_out, (h + 2) * (w + 2))
    assert pos.dtype == torch.float32
    torch.testing.assert_close(pos.sum(-1), torch.ones(9, h_out * w_out))
    # one-hot on key = query + centre, in padded coordinates
    for head, (dy, dx) in enumerate(gpsa.kernel_centers().int().tolist()):
        for i in range(h_out):
            for j in range(w_out):
                key = (2 * i + 1 + dy) * (w + 2) + (2 * j + 1 + dx)
                assert pos[head, i * w_out + j, key] > 1 - 1e-6


def test_paper_init_puts_32_percent_of_the_positional_mass_on_the_own_tap():
    gpsa = GPSA(8, 8, 3, padding=1, locality_strength=1.0)
    pos = gpsa.positional_attention(7, 7, torch.device('cpu'))
    centre_query = 3 * 7 + 3
    own_tap = pos[4, centre_query, (3 + 1) * 9 + (3 + 1)].item()
    # at alpha = 1 the centre head's positional logits are -|delta|^2 over the 9x9 padded grid around the query, so its
    # own tap holds 1 / (sum_k exp(-k^2), k = -4..4)^2 = 0.318244 of the mass (T-CNN section 2: "about 32%")
    closed_form = 1 / sum(math.exp(-k * k) for k in range(-4, 5)) ** 2
    assert closed_form == pytest.approx(0.318244, abs=1e-6)
    assert own_tap == pytest.approx(closed_form, rel=1e-6)


def test_every_parameter_gets_a_gradient():
    gpsa = GPSA.from_conv(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=True))
    gpsa.train()
    gpsa(torch.randn(2, 16, 9, 9)).square().mean().backward()
    for name, p in gpsa.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_attention_maps_have_the_grids_shapes_and_sum_to_one():
    gpsa = GPSA(8, 8, 3, stride=2, padding=1)
    maps = gpsa.attention(torch.randn(2, 8, 8, 6))
    assert maps['content'].shape == (2, 9, 12, 80) and maps['positional'].shape == (9, 12, 80)
    torch.testing.assert_close(maps['mixed'].sum(-1), torch.ones(2, 9, 12))
    assert maps['out_size'].tolist() == [4, 3] and maps['key_size'].tolist() == [10, 8]
    # unequal paddings, on the input's device (meta: shapes only)
    gpsa = GPSA(8, 8, (3, 5), stride=2, padding=(1, 2), device='meta')
    maps = gpsa.attention(torch.empty(2, 8, 8, 6, device='meta'))
    assert all(maps[k].device.type == 'meta' for k in ('content', 'positional', 'mixed'))
    assert maps['content'].shape == (2, 15, 12, 100) and maps['positional'].shape == (15, 12, 100)
    assert maps['out_size'].tolist() == [4, 3] and maps['key_size'].tolist() == [10, 10]


# ---------------------------------------------------------------- construction, settings and introspection

@pytest.mark.filterwarnings('error')  # e.g. torch.meshgrid's without its indexing
def test_a_new_layer_is_initialised_as_convit_and_nn_conv2d():
    """From scratch (the constructor's defaults, ``reset_parameters``): queries and keys truncated normal with std 0.02
    (ConViT's init), the filter as ``nn.Conv2d`` initialises its weight (kaiming uniform with a = sqrt(5): uniform in
    +-1/sqrt(fan_in), fan_in = N_h * C_in / g). Seeds 0-4: sample std 0.01989 to 0.02022, largest filter entry
    0.99991 to 0.999995 of the bound (2026-11-27)."""
    torch.manual_seed(0)
    layer = GPSA(64, 64, 3, padding=1, qk_dim=16)
    for weight in (layer.q_weight, layer.k_weight):
        assert abs(weight.std().item() - 0.02) < 5e-4
    bound = 1 / math.sqrt(9 * 64)
    assert 0.999 * bound < layer.proj_weight.abs().max().item() <= bound
    # by default the paper's fine-tuning init of the positional part: alpha = lambda = 1, centres on the taps
    torch.testing.assert_close(layer.locality_strength(), torch.ones(9))
    torch.testing.assert_close(layer.gating, torch.ones(9))
    torch.testing.assert_close(layer.pos_centers, layer.kernel_centers())


def test_from_conv_keeps_the_conv_device_and_the_settings_given():
    """``from_conv``: by default the paper's fine-tuning init (alpha = lambda = 1, T-CNN section 3), else the
    ``locality_strength``, ``gating_init`` and ``qk_dim`` given; the layer is made on the conv's device and dtype
    (here 'meta': no data, every parameter there)."""
    conv = nn.Conv2d(6, 4, 3, padding=1)
    layer = GPSA.from_conv(conv)
    torch.testing.assert_close(layer.locality_strength(), torch.ones(9))
    torch.testing.assert_close(layer.gating, torch.ones(9))
    assert layer.qk_dim == GPSA(6, 4, 3, padding=1).qk_dim
    layer = GPSA.from_conv(conv, locality_strength=2.5, gating_init=-1.0, qk_dim=5)
    torch.testing.assert_close(layer.locality_strength(), torch.full((9,), 2.5))
    torch.testing.assert_close(layer.gating, torch.full((9,), -1.0))
    assert layer.qk_dim == 5 and layer.q_weight.shape == (9 * 5, 6)
    meta = GPSA.from_conv(nn.Conv2d(6, 4, 3, padding=1, device='meta', dtype=torch.float64))
    assert {(p.device.type, p.dtype) for p in meta.parameters()} == {('meta', torch.float64)}


def test_the_setters_and_reset_parameters_set_what_introspection_reads():
    gpsa = GPSA(8, 8, 5, padding=2, locality_strength=3.0, gating_init=-2.0)
    assert gpsa.num_heads == 25 and gpsa.qk_dim == 1
    torch.testing.assert_close(gpsa.locality_strength(), torch.full((25,), 3.0))
    torch.testing.assert_close(gpsa.span(), torch.full((25,), 1 / 3.0))
    torch.testing.assert_close(gpsa.gate(), torch.sigmoid(torch.full((25,), -2.0)))
    assert gpsa.kernel_centers()[0].tolist() == [-2.0, -2.0] and gpsa.kernel_centers()[7].tolist() == [-1.0, 0.0]
    gpsa.set_locality_strength(torch.linspace(0.5, 5, 25))
    torch.testing.assert_close(gpsa.locality_strength(), torch.linspace(0.5, 5, 25))
    gpsa.reset_parameters()  # by default the paper's fine-tuning init, alpha = lambda = 1
    torch.testing.assert_close(gpsa.locality_strength(), torch.ones(25))
    torch.testing.assert_close(gpsa.gating, torch.ones(25))
    assert abs(locality_to_raw(1.0) - 0.99865) < 1e-4
    with pytest.raises(ValueError):
        locality_to_raw(0.0)


def test_conv_filter_is_the_convs_weight_and_the_old_2d_filter_layout_loads():
    conv = nn.Conv2d(6, 5, (3, 2), padding=1, bias=True)
    x = torch.randn(2, 6, 7, 6)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    assert gpsa.proj_weight.shape == (5, 6, 6)  # (C_out, N_h, C_in): per head its tap
    torch.testing.assert_close(gpsa.conv_filter(), conv.weight)
    torch.testing.assert_close(gpsa.proj_weight[:, 3], conv.weight[:, :, 1, 1])  # head 3 = tap (1, 1)
    # tcnn 0.1.0 stored conv.weight.reshape(C_out, -1); such state dicts still load, also onto the meta device.
    state = dict(gpsa.state_dict(), proj_weight=conv.weight.detach().reshape(5, -1))
    for device, assign in (('cpu', False), ('meta', True)):
        old = GPSA(6, 5, (3, 2), padding=1, bias=True, device=device)
        old.load_state_dict(state, assign=assign)
        torch.testing.assert_close(old(x), conv(x), rtol=1e-5, atol=1e-5)
    assert state['proj_weight'].shape == (5, 36)  # the caller's dict is left alone


@pytest.mark.parametrize('cin,cout,kernel,groups', [(4, 6, 3, 1), (8, 6, (1, 3), 2)], ids=['dense', 'grouped'])
def test_old_2d_filter_layout_loads_where_heads_and_channels_differ(cin, cout, kernel, groups):
    """tcnn 0.1.0's filter ``conv.weight.reshape(C_out, -1)`` (index ``c * N_h + h``) loads into the ``(C_out, N_h,
    C_in // g)`` layout where ``N_h`` and ``C_in // g`` differ (9 heads of 4 channels; 3 heads of 4 channels per
    group), so a swapped pair of them cannot pass: the layer's filter is the conv's again, tap by tap, and its
    exact configuration is the conv. A filter already in the current layout loads as it is; ``upgrade_proj_weight``
    leaves any other shape alone."""
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, kernel, padding=1, groups=groups)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    taps = conv.weight.detach().flatten(2).transpose(1, 2)  # (C_out, N_h, C_in // g): head h is tap h
    for stored in (conv.weight.detach().reshape(cout, -1), taps.clone()):
        layer = GPSA(cin, cout, kernel, padding=1, groups=groups, bias=True)
        layer.load_state_dict(dict(gpsa.state_dict(), proj_weight=stored))
        assert torch.equal(layer.proj_weight, taps) and torch.equal(layer.conv_filter(), conv.weight)
        x = torch.randn(2, cin, 5, 6)
        assert rel_err(layer(x), conv(x)) < 1e-5
    other = torch.randn(cout, 3 * cin)
    assert upgrade_proj_weight(other, taps.shape) is other


def test_conv_parameters_is_the_convs_parameter_count():
    """``conv_parameters``: the parameter count of the conv the layer stands for, an ``int`` as ``numel`` is."""
    for conv in (nn.Conv2d(8, 12, 3), nn.Conv2d(8, 12, (3, 5), groups=4, bias=False), nn.Conv2d(6, 12, 3, groups=6)):
        count = GPSA.from_conv(conv).conv_parameters()
        assert type(count) is int and count == sum(p.numel() for p in conv.parameters())


def test_a_layers_repr_gives_its_settings():
    """``repr``: the conv's settings, heads and qk_dim, and what differs from the defaults (padding mode, groups,
    no bias; a grouped conv stored dense, as tcnn <= 0.2.0 files load)."""
    assert repr(GPSA(8, 16, 3)) == ('GPSA(8, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), '
                                    'heads=9, qk_dim=1, bias=False)')
    assert repr(GPSA(8, 8, (5, 3), stride=2, padding=(2, 1), dilation=(1, 2), bias=True, padding_mode='reflect',
                     groups=4, qk_dim=2)) == (
        'GPSA(8, 8, kernel_size=(5, 3), stride=(2, 2), padding=(2, 1), dilation=(1, 2), heads=15, qk_dim=2, '
        'padding_mode=reflect, groups=4)')
    dense = GPSA(8, 8, 3, bias=True)
    dense.conv_groups = 4
    assert repr(dense) == ('GPSA(8, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), heads=9, '
                           'qk_dim=1, conv_groups=4 (stored dense))')


_FIX = ('call it on the unsharded model (before fully_shard, or on a copy that loaded the full state dict of '
        'torch.distributed.checkpoint.state_dict.get_model_state_dict(model, '
        'options=StateDictOptions(full_state_dict=True)))')


def test_sharded_per_head_parameters_are_refused_in_one_line():
    """A layer whose positional or gating parameter (each in turn) is a DTensor (FSDP2's ``fully_shard``: one shard
    per rank) refuses what reads or sets the per-head values, in one line naming the layer where it has a name and
    the fix, word for word, changing nothing; plain parameters pass. A one-rank gloo group on the CPU, no network."""
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip('this torch has no torch.distributed')
    tensor = pytest.importorskip('torch.distributed.tensor')
    from torch.distributed.device_mesh import init_device_mesh
    check_unsharded(GPSA(4, 4, 3), 'gpsa_summary', 'stem.conv')  # plain tensors: nothing to refuse
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh('cpu', (1,))
        for name in ('pos_centers', 'pos_locality', 'gating'):
            layer = GPSA(4, 4, 3)
            setattr(layer, name, nn.Parameter(tensor.distribute_tensor(getattr(layer, name).detach(), mesh,
                                                                       [tensor.Replicate()])))
            with pytest.raises(TcnnError) as err:
                check_unsharded(layer, 'gpsa_summary', 'stem.conv')
            assert str(err.value) == ('gpsa_summary does not take FSDP2-sharded (DTensor) parameters, as the GPSA '
                                      f'layer (stem.conv) has: {_FIX}'), name
            values = lambda: {k: v.full_tensor() if k == name else v.clone()  # noqa: E731
                              for k, v in layer.state_dict().items()}
            before = values()
            for what, call in (('set_gating', lambda: layer.set_gating(3.0)),
                               ('set_locality_strength', lambda: layer.set_locality_strength(3.0))):
                with pytest.raises(TcnnError) as err:
                    call()
                assert str(err.value) == (f'{what} does not take FSDP2-sharded (DTensor) parameters, as the GPSA '
                                          f'layer has: {_FIX}'), name
            assert all(torch.equal(value, before[key]) for key, value in values().items()), name
    finally:
        dist.destroy_process_group()


BAD_SETTINGS = {  # id: (call, exception, message)
    'in-chs-0': (lambda: GPSA(0, 4), InvalidArgumentError, 'in_chs must be >= 1, got 0'),
    'in-chs-float': (lambda: GPSA(4.5, 4), InvalidTypeError, 'in_chs must be an integer, got 4.5 (float)'),
    'out-chs-0': (lambda: GPSA(4, 0), InvalidArgumentError, 'out_chs must be >= 1, got 0'),
    'out-chs-float': (lambda: GPSA(4, 4.5), InvalidTypeError, 'out_chs must be an integer, got 4.5 (float)'),
    'kernel-size-0': (lambda: GPSA(4, 4, kernel_size=0), InvalidArgumentError, 'kernel_size must be >= 1, got 0'),
    'kernel-size-triple': (lambda: GPSA(4, 4, kernel_size=(3,)), InvalidTypeError,
                           'kernel_size must be an int or a pair of ints, got (3,)'),
    'kernel-size-0-first': (lambda: GPSA(4, 4, kernel_size=(0, 3)), InvalidArgumentError,
                            'kernel_size must be >= 1, got 0'),
    'kernel-size-0-second': (lambda: GPSA(4, 4, kernel_size=(3, 0)), InvalidArgumentError,
                             'kernel_size must be >= 1, got 0'),
    'kernel-size-float-first': (lambda: GPSA(4, 4, kernel_size=(2.5, 3)), InvalidTypeError,
                                'kernel_size must be an integer, got 2.5 (float)'),
    'kernel-size-float-second': (lambda: GPSA(4, 4, kernel_size=(3, 2.5)), InvalidTypeError,
                                 'kernel_size must be an integer, got 2.5 (float)'),
    'stride-list-of-3': (lambda: GPSA(4, 4, stride=[1, 2, 1]), InvalidTypeError,
                         'stride must be an int or a pair of ints, got [1, 2, 1]'),
    'stride-float': (lambda: GPSA(4, 4, stride=1.5), InvalidTypeError, 'stride must be an integer, got 1.5 (float)'),
    'stride-0-second': (lambda: GPSA(4, 4, stride=(1, 0)), InvalidArgumentError, 'stride must be >= 1, got 0'),
    'padding-negative': (lambda: GPSA(4, 4, padding=-2), InvalidArgumentError, 'padding must be >= 0, got -2'),
    'padding-negative-second': (lambda: GPSA(4, 4, padding=(0, -1)), InvalidArgumentError,
                                'padding must be >= 0, got -1'),
    'conv-padding-negative': (lambda: GPSA.from_conv(nn.Conv2d(4, 4, 3, padding=(1, -1))), InvalidArgumentError,
                              'padding must be >= 0, got -1'),
    'dilation-0': (lambda: GPSA(4, 4, dilation=0), InvalidArgumentError, 'dilation must be >= 1, got 0'),
    'dilation-float-second': (lambda: GPSA(4, 4, dilation=(1, 1.5)), InvalidTypeError,
                              'dilation must be an integer, got 1.5 (float)'),
    'groups-0': (lambda: GPSA(4, 4, groups=0), InvalidArgumentError, 'groups must be >= 1, got 0'),
    'groups-float': (lambda: GPSA(4, 4, groups=2.5), InvalidTypeError, 'groups must be an integer, got 2.5 (float)'),
    'groups-in': (lambda: GPSA(16, 24, groups=3), InvalidArgumentError,
                  'in_chs (16) and out_chs (24) must be divisible by groups (3)'),
    'groups-out': (lambda: GPSA(16, 20, groups=8), InvalidArgumentError,
                   'in_chs (16) and out_chs (20) must be divisible by groups (8)'),
    'padding-mode': (lambda: GPSA(4, 4, padding_mode='same'), InvalidArgumentError,
                     "padding_mode must be zeros, reflect, replicate or circular, got 'same'"),
    'qk-dim-0': (lambda: GPSA(4, 4, qk_dim=0), InvalidArgumentError, 'qk_dim must be >= 1, got 0'),
    'qk-dim-float': (lambda: GPSA(4, 4, qk_dim=2.5), InvalidTypeError, 'qk_dim must be an integer, got 2.5 (float)'),
    'alpha-0': (lambda: GPSA(4, 4, locality_strength=0.0), InvalidArgumentError,
                'locality_strength must be > 0, got 0.0'),
    'alpha-to-raw-0': (lambda: locality_to_raw(0.0), InvalidArgumentError, 'locality_strength must be > 0, got 0.0'),
    'alpha-tensor-0': (lambda: GPSA(4, 4, kernel_size=(1, 2), padding=0).set_locality_strength(torch.tensor([1., 0.])),
                       InvalidArgumentError, 'locality_strength must be > 0, got 0.0'),
    'lambda-nan': (lambda: GPSA(4, 4, gating_init=float('nan')), InvalidArgumentError,
                   'gating_init must be a finite number, got nan'),
    'alpha-0-then-lambda-nan': (lambda: GPSA(4, 4, locality_strength=0.0, gating_init=nan), InvalidArgumentError,
                                'locality_strength must be > 0, got 0.0'),  # in the order of the arguments
    'alpha-count': (lambda: GPSA(4, 4).set_locality_strength(torch.ones(3)), InvalidArgumentError,
                    'locality_strength must be a number or 9 values (one per head), got a tensor of shape (3,)'),
    'alpha-inf': (lambda: GPSA(4, 4, kernel_size=(1, 2), padding=0).set_locality_strength(torch.tensor([inf, 1.0])),
                  InvalidArgumentError, 'locality_strength must be finite, got [inf, 1.0]'),
    'gating-nan': (lambda: GPSA(4, 4, kernel_size=(1, 2), padding=0).set_gating(torch.tensor([1.0, nan])),
                   InvalidArgumentError, 'gating must be finite, got [1.0, nan]'),
    'gating-inf': (lambda: GPSA(4, 4).set_gating(inf), InvalidArgumentError, 'gating must be a finite number, got inf'),
    'from-a-linear': (lambda: GPSA.from_conv(nn.Linear(4, 4)), InvalidTypeError,
                      'conv must be a torch.nn.Conv2d, got Linear'),
}


@pytest.mark.parametrize('make,error,message', BAD_SETTINGS.values(), ids=BAD_SETTINGS.keys())
def test_bad_settings_are_refused_word_for_word(make, error, message):
    """A layer's settings outside their domain are refused, with the type (also a ``TypeError`` or ``ValueError``)
    and the message saying what was wrong, word for word."""
    with pytest.raises(error) as err:
        make()
    assert str(err.value) == message


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_locality_strength_is_softplus_beta_5_to_the_bit(dtype):
    """alpha = softplus(raw, beta=5) (T-CNN footnote 1). What exporters and tracers record is written without
    softplus's beta, which OpenVINO's TorchScript front end drops: its outputs are torch's bitwise, its gradients within
    3 ulp (measured: float32 2.8e-7, float64 5.0e-16 relative, over 400k values of raw in [-30, 60] and around the
    threshold 5 * raw = 20; 2026-11-26). Eager mode keeps F.softplus itself (the layer's locality strength here)."""
    raw = torch.cat([torch.linspace(-30, 60, 200001, dtype=dtype), torch.randn(200000, dtype=dtype) * 3,
                     torch.tensor([locality_to_raw(1.0), locality_to_raw(EXACT_LOCALITY), 4.0, 3.9999, 4.0001],
                                  dtype=dtype)])
    ours_raw, ref_raw = raw.clone().requires_grad_(), raw.clone().requires_grad_()
    ours, ref = softplus_beta_5(ours_raw), F.softplus(ref_raw, beta=SOFTPLUS_BETA)  # its literal 5.0 is the beta
    assert torch.equal(ours, ref)
    grad = torch.randn_like(ref)
    ours.backward(grad)
    ref.backward(grad)
    # atol: subnormal gradients (raw < -17) round to other subnormals
    torch.testing.assert_close(ours_raw.grad, ref_raw.grad, rtol=3 * torch.finfo(dtype).eps,
                               atol=torch.finfo(dtype).tiny)
    gpsa = GPSA(4, 4, 3, padding=1).to(dtype)
    with torch.no_grad():
        gpsa.pos_locality.copy_(raw[::50000][:9])
    assert torch.equal(gpsa.locality_strength(), F.softplus(gpsa.pos_locality, beta=5.0))


def test_traced_and_scripted_layers_write_softplus_without_beta():
    """What OpenVINO (and any tool that ignores beta) reads: every softplus of the traced or scripted layer has beta 1
    (its values: the test above)."""
    layer = GPSA(4, 4, 3, padding=1).eval()
    for graph in (torch.jit.trace(layer, torch.randn(1, 4, 5, 5)).inlined_graph, script(layer).inlined_graph):
        softplus = [n for n in graph.nodes() if n.kind() == 'aten::softplus']
        assert softplus and all(n.inputsAt(1).toIValue() == 1 for n in softplus)


# ---------------------------------------------------------------- precision

def test_autocast_bf16_keeps_positional_softmax_in_float32():
    # The exact configuration under bf16 autocast is the conv up to bf16 rounding; its positional attention is
    # one-hot, so this says nothing of the softmax's precision: tests/test_precision.py observes where it computes.
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1)
    gpsa = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    x = torch.randn(2, 16, 7, 7)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = gpsa(x)
    assert out.dtype == torch.bfloat16
    # max error relative to the largest output, seeds 0-19: 2.6e-3 to 3.96e-3 (2026-11-26); tolerance 1.5x
    assert rel_err(out.float(), conv(x)) < 6e-3
    assert gpsa.bfloat16().positional_attention(7, 7, torch.device('cpu')).dtype == torch.float32


FLOAT64_LAYERS = [
    # in, out, kernel, stride, padding, dilation, groups, padding_mode, (H, W)
    pytest.param(6, 8, 3, 1, 1, 1, 1, 'zeros', (5, 6), id='dense'),
    pytest.param(6, 8, 3, 2, 1, 1, 1, 'zeros', (7, 6), id='dense-s2'),
    pytest.param(8, 8, 3, 1, 2, 2, 2, 'reflect', (6, 5), id='grouped-dil2-reflect'),
    pytest.param(8, 8, 3, 1, 1, 1, 8, 'zeros', (5, 5), id='depthwise'),
    pytest.param(4, 8, 5, 2, 2, 1, 4, 'zeros', (7, 6), id='depthwise-k5-s2-multiplier2'),
]


def _float64_layer(in_chs, out_chs, kernel, stride, padding, dilation, groups, mode, init: str) -> GPSA:
    torch.manual_seed(0)
    conv = nn.Conv2d(in_chs, out_chs, kernel, stride, padding, dilation, groups=groups, bias=True,
                     padding_mode=mode).double()
    gpsa = GPSA.from_conv(conv)  # the paper's init, alpha = lambda = 1
    if init == 'random':  # per-head alpha, lambda and centres, content attention and values off the identity
        away_from_exact(gpsa, value_noise=0.3)
        with torch.no_grad():
            gpsa.pos_locality.uniform_(-0.5, 2.0)
    return gpsa


@pytest.mark.parametrize('init', ['paper', 'random'])
@pytest.mark.parametrize('in_chs,out_chs,kernel,stride,padding,dilation,groups,mode,size', FLOAT64_LAYERS)
def test_float64_layer_is_the_papers_formula_in_float64(in_chs, out_chs, kernel, stride, padding, dilation, groups,
                                                         mode, size, init):
    """Away from the exact configuration, where no rounding hides: a float64 layer equals the independent float64
    reference to float64 precision (a layer that computed its gate or softmaxes in float32 would miss by ~1e-7)."""
    gpsa = _float64_layer(in_chs, out_chs, kernel, stride, padding, dilation, groups, mode, init)
    x = torch.randn(2, in_chs, *size, dtype=torch.float64)
    out = gpsa(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _reference_gpsa(gpsa, x), rtol=1e-11, atol=1e-12)
    maps = gpsa.attention(x)
    assert maps['content'].dtype == maps['positional'].dtype == maps['mixed'].dtype == torch.float64


@pytest.mark.parametrize('init', ['paper', 'random'])
@pytest.mark.parametrize('in_chs,out_chs,kernel,stride,padding,dilation,groups,mode,size', FLOAT64_LAYERS)
def test_float64_gradients_match_finite_differences(in_chs, out_chs, kernel, stride, padding, dilation, groups, mode,
                                                    size, init):
    """Gradients of the input and of every parameter against finite differences, in float64 (both depthwise orders:
    the small shapes attend first, the folded one is checked in tests/test_depthwise.py)."""
    gpsa = _float64_layer(in_chs, out_chs, kernel, stride, padding, dilation, groups, mode, init)
    names = [n for n, _ in gpsa.named_parameters()]
    x = torch.randn(1, in_chs, *size, dtype=torch.float64, requires_grad=True)

    def layer(x, *params):
        return torch.func.functional_call(gpsa, dict(zip(names, params)), (x,))

    params = tuple(p.detach().clone().requires_grad_() for p in gpsa.parameters())
    assert torch.autograd.gradcheck(layer, (x, *params), fast_mode=True)


def test_half_precision_layers_compute_attention_in_float32():
    """float16 / bfloat16 layers (no autocast) compute scores, softmaxes and gates in float32, as under autocast."""
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(2, 16, 7, 7)
    ref = GPSA.from_conv(conv)
    away_from_exact(ref, value_noise=0.2)
    for dtype in (torch.float16, torch.bfloat16):
        layer = GPSA.from_conv(conv)
        layer.load_state_dict(ref.state_dict())
        layer = layer.to(dtype)
        assert layer.positional_attention(7, 7, torch.device('cpu')).dtype == torch.float32
        assert layer.gate().dtype == torch.float32
        out = layer(x.to(dtype))
        # relative RMS error, seeds 0-19: float16 4.2e-4 to 1.08e-3, bf16 3.5e-3 to 1.01e-2 (2026-11-26; the largest
        # error relative to the largest output ranges over 10x, one near-tie of a sharp content softmax sets it);
        # tolerance 1.5x. Where each step computes: tests/test_precision.py.
        err = ((out.float() - ref(x)).norm() / ref(x).norm()).item()
        assert out.dtype == dtype and err < (1.6e-3 if dtype == torch.float16 else 1.5e-2)


# ---------------------------------------------------------------- TorchScript, FX and the exporters

def test_scripted_and_fx_traced_layers_give_the_eager_output():
    gpsa = GPSA.from_conv(nn.Conv2d(8, 12, 3, stride=2, padding=1))
    x = torch.randn(2, 8, 9, 7)
    ref = gpsa(x)
    torch.testing.assert_close(script(gpsa)(x), ref)
    torch.testing.assert_close(torch.fx.symbolic_trace(gpsa)(x), ref)


@pytest.mark.parametrize('groups', [1, 8], ids=['dense', 'depthwise'])
def test_scripted_layer_runs_eager_modes_operations(groups):
    """TorchScript's path runs the operations of eager mode (``torch.lerp``; for a depthwise layer the product
    attending first, which eager mode also takes for a 3x3 kernel at batch 2), not the exporters' plain forms:
    outputs equal to the bit, call after call (eager mode keeps terms from call to call, TorchScript recomputes
    them)."""
    torch.manual_seed(0)
    layer = away_from_exact(GPSA(8, 8, 3, padding=1, groups=groups, qk_dim=3), 0.3)
    scripted = script(layer)
    x = torch.randn(2, 8, 5, 6)
    for _ in range(2):
        assert torch.equal(scripted(x), layer(x))


@pytest.mark.parametrize('groups,out_chs', [(1, 12), (8, 16)], ids=['dense', 'depthwise-multiplier2'])
def test_exported_layer_is_the_formula(groups, out_chs):
    """What ``torch.export`` records (the exporters' path: the mixture written ``start + weight * (end - start)``,
    the depthwise product in plain ops, ``attend_traceable``) computes the papers' formula, away from the exact
    configuration. Max error relative to the largest output, seeds 0-4: 9.6e-8 to 3.7e-7 (2026-11-27); tolerance
    1e-6."""
    torch.manual_seed(0)
    layer = away_from_exact(GPSA(8, out_chs, 3, stride=2, padding=1, groups=groups, bias=True, qk_dim=3), 0.3)
    x = torch.randn(2, 8, 7, 6)
    program = torch.export.export(layer, (x,))
    assert rel_err(program.module()(x), _reference_gpsa(layer, x)) < 1e-6
    # no lerp: ExecuTorch has no out variant of its core-ATen decomposition (_lerp); no vecdot (the depthwise product
    # attending first, ``attend_heads_first``): the TorchScript ONNX exporter has no form of it (attend_traceable)
    assert not [n for n in program.graph.nodes if 'lerp' in str(n.target) or 'vecdot' in str(n.target)]


def test_exported_layer_keeps_its_device():
    """Eager mode and ``torch.export`` compute every term on the layer's device (the positional offsets and the
    padded keys' ``log(n_pad)`` included): a layer on the meta device runs and exports there (shapes only; a GPU
    alike)."""
    layer = GPSA(8, 12, 3, stride=2, padding=1, device='meta')
    x = torch.empty(2, 8, 7, 6, device='meta')
    for out in (layer(x), torch.export.export(layer, (x,)).module()(x)):
        assert out.device.type == 'meta' and out.shape == (2, 12, 4, 3)


def test_exported_float64_layer_is_the_float64_formula():
    """``torch.export`` of a float64 layer computes every term in float64 (the padded keys' ``log(n_pad)``
    included): its output is the formula in float64. Error relative to the largest output: 8.5e-16 (seed 0,
    2026-11-27); tolerance 1e-14, which a float32 ``log(n_pad)`` exceeds."""
    torch.manual_seed(0)
    layer = away_from_exact(GPSA(8, 8, 3, padding=1, dtype=torch.float64), 0.3)
    x = torch.randn(2, 8, 5, 6, dtype=torch.float64)
    out = torch.export.export(layer, (x,)).module()(x)
    assert out.dtype == torch.float64 and rel_err(out, _reference_gpsa(layer, x)) < 1e-14


# ---------------------------------------------------------------- what a forward costs: kernel launches and copies

@pytest.mark.parametrize('stride', [1, 2])
def test_forward_launches_few_kernels(stride):
    """A GPU waits on the host at small batches: every operator of the forward is a kernel launch. tcnn 0.3.1 ran 37
    (stride 1) / 38 (stride 2) operators per float32 forward, training or not; one GEMM for Q, K and V, one softmax
    for both positional factors, the scale inside the score GEMM and the kept inference terms bring it to 18 / 20
    (training) and 10 / 12 (inference). The budgets leave two operators of slack for another torch's decompositions;
    the GEMMs are counted exactly."""
    layer = GPSA(64, 64, 3, stride=stride, padding=1)
    x = torch.randn(2, 64, 7 * stride, 7 * stride).to(memory_format=torch.channels_last)
    budgets = {1: (20, 12), 2: (22, 14)}[stride]  # (training, inference)
    for training, budget in zip((True, False), budgets):
        layer.train(training)
        with torch.set_grad_enabled(training):
            layer(x)  # fills the kept values
            with OperatorCount() as counter:
                layer(x)
        assert len(counter.ops) <= budget, (training, counter.ops)
        # GEMMs: Q, K and V in one where every pixel is a query (stride 1), Q apart from K and V at stride 2; then the
        # output projection
        assert counter.ops.count('mm') == {1: 2, 2: 3}[stride], counter.ops


@pytest.mark.parametrize('kernel,stride,padding,pads', [
    pytest.param(3, 1, 1, False, id='k3-s1'), pytest.param(3, 2, 1, False, id='k3-s2'),
    pytest.param((3, 5), 2, (1, 2), False, id='k3x5-s2'), pytest.param(3, 2, 0, False, id='k3-s2-no-padding'),
    pytest.param(3, 1, 2, True, id='padding-beyond-anchor'),
    pytest.param(3, (2, 1), (1, 2), True, id='columns-padded-beyond-anchor')])
def test_zero_padded_layers_copy_no_padded_input(kernel, stride, padding, pads):
    """With zero padding a layer reads its keys and values on the real pixels and its queries in place where they
    all lie on real pixels (the anchor not inside the padding, as for every conv of a ResNet): its forward (training
    and inference) pads nothing; only a padding beyond the anchor (queries in the padding) pads the input."""
    layer = GPSA(8, 8, kernel, stride=stride, padding=padding)
    x = torch.randn(2, 8, 9, 8)
    for training in (True, False):
        layer.train(training)
        with torch.set_grad_enabled(training), OperatorCount() as counter:
            layer(x)
        assert any('pad' in op for op in counter.ops) == pads, counter.ops


# ---------------------------------------------------------------- how the layer reads

def test_the_layer_reads_top_down_with_forward_among_its_first_five_methods():
    """``GPSA`` reads as torch's ``nn.Conv2d`` does: its construction first, then ``forward`` (among the class's first
    five methods, properties included) and its steps in call order, then introspection and settings; the state dict's
    load hook (old filter layouts) last."""
    path = pathlib.Path(__file__).resolve().parents[1] / 'tcnn' / 'layers' / 'gpsa.py'
    layer = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == 'GPSA')
    methods = [n.name for n in layer.body if isinstance(n, ast.FunctionDef)]
    assert methods.index('forward') < 5 and methods[-1] == '_load_from_state_dict', methods
