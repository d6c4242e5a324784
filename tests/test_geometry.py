"""A GPSA layer's geometry (``tcnn.layers.geometry``): one frozen value, made once and the only one the computation
reads, passed whole to the layer's functions; and its pure functions against the conv itself (``F.conv2d`` on the
padded grid's own coordinates)."""
import ast
import copy
import math
import pathlib

import pytest
import torch
import torch.nn.functional as F

from tcnn.layers.content import padded_keys_logit
from tcnn.layers.geometry import Geometry, conv_geometry, queries_are_tokens
from tcnn.layers.gpsa import GPSA
from tcnn.layers.positional import axis_offsets

from helpers import script


# ---------------------------------------------------------------- one value, made once and read whole

def test_geometry_is_made_once_and_matches_the_attributes():
    """``GPSA.geometry`` is the layer's one frozen ``Geometry``, its fields the layer's attributes of the same names;
    TorchScript keeps it with its field names (the class annotates the attribute)."""
    layer = GPSA(8, 16, (5, 3), stride=(2, 1), padding=(2, 1), dilation=(1, 2), padding_mode='reflect', groups=4)
    geometry = layer.geometry
    assert isinstance(geometry, Geometry)
    assert geometry == Geometry(kernel_size=(5, 3), stride=(2, 1), padding=(2, 1), dilation=(1, 2), anchor=(2, 2),
                                padding_mode='reflect', groups=4, num_heads=15)
    assert all(getattr(layer, name) == value for name, value in geometry._asdict().items())
    with pytest.raises(AttributeError):
        geometry.stride = (1, 1)  # frozen
    scripted = script(layer)
    assert scripted.geometry == geometry and scripted.stride == (2, 1)
    assert copy.deepcopy(layer).geometry == geometry


def test_layer_functions_name_their_arguments():
    """The layer reads by named calls: no function or method of ``tcnn.layers`` takes more than six positional
    arguments, nor, a constructor aside, more than eight in all (``self``, ``cls`` excluded): a layer's geometry travels
    as one ``Geometry`` (``project(x, ..., geometry, qk_dim=...)``), not as loose arguments (issue 48).
    """
    folder = pathlib.Path(__file__).resolve().parents[1] / 'tcnn' / 'layers'
    too_many = []
    for path in sorted(folder.glob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args if a.arg not in ('self', 'cls')]
                every = names + [a.arg for a in args.kwonlyargs] + [a.arg for a in (args.vararg, args.kwarg) if a]
                if len(names) > 6 or (len(every) > 8 and node.name != '__init__'):
                    too_many.append(f'{path.name}:{node.lineno} {node.name}({", ".join(every)})')
    assert len(list(folder.glob('*.py'))) >= 7 and not too_many, too_many


def test_the_layer_reads_its_conv_settings_through_the_geometry_value_only():
    """The layer's methods read the conv's settings through ``self.geometry`` only, never through the attributes that
    repeat its fields for readers (``self.stride``, ``self.groups``...), so that the computation reads one value. The
    constructor, which sets those attributes, aside; the check sees a read it should refuse."""
    path = pathlib.Path(__file__).resolve().parents[1] / 'tcnn' / 'layers' / 'gpsa.py'

    def reads(source: str):
        layer = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == 'GPSA')
        return [f'{method.name}:{node.lineno} self.{node.attr}' for method in layer.body
                if isinstance(method, ast.FunctionDef) and method.name != '__init__' for node in ast.walk(method)
                if isinstance(node, ast.Attribute) and node.attr in Geometry._fields
                and isinstance(node.value, ast.Name) and node.value.id == 'self']
    assert not reads(path.read_text())
    assert reads('class GPSA:\n    def output_size(self):\n        return self.stride\n') == \
        ['output_size:3 self.stride']


# ---------------------------------------------------------------- the geometry's pure functions against the conv itself

def _geometries(height: int, width: int):
    """Conv geometries (kernel, stride, padding, dilation) of every kind along each axis on its own, that an input of
    ``height x width`` fits: odd and even kernels, strides 1 and 2, no, 'same', smaller and larger padding, dilations
    1 and 2."""
    for kernel in ((1, 1), (3, 3), (3, 1), (1, 3), (5, 3), (2, 3), (4, 4), (2, 2), (3, 4)):
        for stride in ((1, 1), (2, 1), (1, 2), (2, 2)):
            for padding in ((0, 0), (1, 0), (0, 1), (1, 1), (2, 1), (2, 2), (3, 1)):
                for dilation in ((1, 1), (2, 1), (1, 2)):
                    if all(size + 2 * p >= d * (k - 1) + 1
                           for size, p, d, k in zip((height, width), padding, dilation, kernel)):
                        yield kernel, stride, padding, dilation


def _query_pixels(geometry: Geometry, height: int, width: int) -> torch.Tensor:
    """The padded-grid position ``(row, col)`` of each output's query, ``(2, H_out, W_out)``, read off ``F.conv2d``:
    a one-hot filter on the layer's anchor tap applied to the padded grid's own coordinates."""
    (ph, pw), (ay, ax), (dy, dx) = geometry.padding, geometry.anchor, geometry.dilation
    rows = torch.arange(height + 2 * ph, dtype=torch.float64)[:, None].expand(-1, width + 2 * pw)
    cols = torch.arange(width + 2 * pw, dtype=torch.float64)[None, :].expand(height + 2 * ph, -1)
    filt = torch.zeros(1, 1, *geometry.kernel_size, dtype=torch.float64)
    filt[0, 0, ay // dy, ax // dx] = 1.0  # the anchor sits on a tap (ay = i * dy)
    grid = torch.stack([rows, cols])[:, None]  # (2, 1, H_pad, W_pad)
    return F.conv2d(grid, filt, stride=geometry.stride, dilation=geometry.dilation)[:, 0]


def test_queries_are_tokens_exactly_when_the_conv_keeps_every_pixel_in_place():
    """``queries_are_tokens`` (every input pixel is a query, in place: Q, K and V in one GEMM) holds exactly where
    the conv's output grid is the input grid, its query ``(i, j)`` on pixel ``(i, j)``: checked against
    ``F.conv2d`` over 748 geometries, 11 of them such."""
    height, width, agree, tokens = 7, 8, 0, 0
    for kernel, stride, padding, dilation in _geometries(height, width):
        geometry = conv_geometry(kernel, stride, padding, dilation, 'zeros', 1)
        ph, pw = padding
        rows, cols = _query_pixels(geometry, height, width)
        in_place = rows.shape == (height, width) and torch.equal(rows - ph, torch.arange(height).double()[:, None]
                                                                 .expand(height, width)) and torch.equal(
            cols - pw, torch.arange(width).double()[None, :].expand(height, width))
        assert queries_are_tokens(geometry) == in_place, (kernel, stride, padding, dilation)
        agree, tokens = agree + 1, tokens + in_place
    assert (agree, tokens) == (748, 11)  # both answers checked, many times


def test_axis_offsets_are_key_minus_query_in_the_dtype_asked():
    """``axis_offsets``: per axis, key position minus the query's (the conv's, ``_query_pixels``) for every key of
    the padded axis, in the dtype asked (the positional softmax's); one tensor for both axes exactly where the input
    is square and the axes' geometry (kernel, stride, padding, dilation) the same."""
    shared = 0
    for height, width in ((7, 6), (7, 7)):
        for kernel, stride, padding, dilation in _geometries(height, width):
            geometry = conv_geometry(kernel, stride, padding, dilation, 'zeros', 1)
            rows, cols = _query_pixels(geometry, height, width)
            key_rows = torch.arange(height + 2 * padding[0], dtype=torch.float64)
            key_cols = torch.arange(width + 2 * padding[1], dtype=torch.float64)
            alike = height == width and all(v[0] == v[1] for v in (kernel, stride, padding, dilation))
            for dtype in (torch.float32, torch.float64):
                dy, dx, same = axis_offsets(height, width, geometry, device=torch.device('cpu'), dtype=dtype)
                where = (height, width, kernel, stride, padding, dilation)
                assert dy.dtype == dx.dtype == dtype and same == alike and (dy is dx) == alike, where
                assert torch.equal(dy.double(), key_rows[None, :] - rows[:, 0, None]), where
                assert torch.equal(dx.double(), key_cols[None, :] - cols[0, :, None]), where
            shared += alike
    assert shared == 24  # both answers checked


@pytest.mark.parametrize('padding,mode', [((0, 0), 'zeros'), ((1, 0), 'zeros'), ((0, 1), 'zeros'), ((1, 2), 'zeros'),
                                          ((2, 2), 'zeros'), ((1, 1), 'reflect'), ((0, 1), 'circular')])
def test_padded_keys_logit_is_the_log_of_the_zero_keys(padding, mode):
    """The one key that stands for the zero-padded keys scores ``log(n_pad)``, ``n_pad`` the zeros ``F.pad`` adds to
    the input, in the dtype asked; there is no such key without zero padding (none added, or another mode)."""
    geometry = conv_geometry((5, 5), (1, 1), padding, (1, 1), mode, 1)
    added = int((F.pad(torch.ones(6, 7), (padding[1], padding[1], padding[0], padding[0])) == 0).sum())
    for dtype in (torch.float32, torch.float64):
        logit = padded_keys_logit(6, 7, geometry, torch.device('cpu'), dtype)
        if mode != 'zeros' or added == 0:
            assert logit is None
        else:
            expected = torch.full((1, 1, 1, 1), math.log(added), dtype=dtype)
            torch.testing.assert_close(logit, expected, rtol=torch.finfo(dtype).eps, atol=0)  # within an ulp
