"""``tcnn export --aoti`` (AOTInductor packages) and ``.pte`` (ExecuTorch) end to end, checked in the runtimes that
read them; the floor-mode form of ``ceil_mode`` poolings that makes AOTInductor exact at odd sizes.

AOTInductor compiles C++ (g++): each package costs 1-3 minutes on 2 CPU cores, so the models are tiny (``demo_resnet10``
with ResNet-D's average-pool shortcut and output stride 32, 64 px) and there are two compiles of a network. The
ExecuTorch tests run only where ``executorch`` is installed (``pip install 'tcnn[executorch]'``).
"""
import json
import os

import pytest
import timm
import torch
import torch.nn as nn

import tcnn
import tcnn.export
from tcnn.export.pooling import FloorModePool2d
from tcnn.cli import main

import torch_versions
from helpers import images, rel_err

SIZE = 64


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope='module')
def resnet_d_file(tmp_path_factory):
    """A T-CNN of a tiny ResNet-D (deep stem, 2x2/2 ceil-mode average pooling in the downsampling shortcuts, output
    stride 32): at 48, 56, 65 or 80 px some stage input is odd."""
    torch.manual_seed(0)
    cnn = timm.create_model('demo_resnet10', output_stride=32, stem_type='deep', avg_down=True, num_classes=10)
    model = tcnn.reparameterize(cnn.eval(), verify=False).eval()
    path = str(tmp_path_factory.mktemp('aoti') / 't_resnet_d.pt')
    tcnn.save(model, path)
    return path


# ------------------------------------------------------------------------------------------------- AOTInductor


@pytest.mark.parametrize('ceil_mode', [True, False])
@pytest.mark.parametrize('pool', [nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False),
                                  nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=True),
                                  nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                                  nn.MaxPool2d(3, 2, 1, ceil_mode=True), nn.MaxPool2d(2, 2, ceil_mode=True)],
                         ids=['avg2-s2', 'avg3-s2-p1-incl', 'avg3-s2-p1', 'max3-s2-p1', 'max2-s2'])
def test_floor_mode_pooling_equals_the_ceil_mode_one(pool, ceil_mode):
    pool.ceil_mode = ceil_mode
    assert FloorModePool2d.replaces(pool) == ceil_mode
    if not ceil_mode:
        return
    floor = FloorModePool2d(pool)
    dims = torch.export.Dim.DYNAMIC
    program = torch.export.export(floor, (torch.randn(2, 4, 8, 8),), dynamic_shapes=({2: dims, 3: dims},)).module()
    for h, w in ((8, 8), (5, 7), (9, 4), (3, 3), (12, 11)):
        x = torch.randn(2, 4, h, w)
        torch.testing.assert_close(floor(x), pool(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(program(x), pool(x), rtol=1e-6, atol=1e-6)  # no size fixed by the trace


def test_aoti_sizes_a_ceil_mode_pooling_wrongly_and_the_floor_mode_form_rightly(tmp_path):
    # the torch bug behind garbage at odd sizes: AOTInductor floors a ceil_mode pooling's output size when the size
    # is dynamic (a 5x5 input gives 2x2 instead of 3x3); the form tcnn compiles instead is exact (one small compile
    # each)
    pool = nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)
    dims = torch.export.Dim.DYNAMIC
    shapes = {}
    for name, module in (('ceil', pool), ('floor', FloorModePool2d(pool))):
        program = torch.export.export(module, (torch.randn(2, 4, 8, 8),), dynamic_shapes=({2: dims, 3: dims},))
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / f'{name}.pt2'))
        x = torch.randn(2, 4, 5, 5)
        out = torch._inductor.aoti_load_package(package)(x)
        shapes[name] = tuple(out.shape)
        if name == 'floor':
            torch.testing.assert_close(out, pool(x), rtol=1e-6, atol=1e-6)
    assert shapes == {'ceil': (2, 4, 2, 2), 'floor': (2, 4, 3, 3)}, shapes  # ceil: fixed in torch? then drop the form


@torch_versions.AOTI
@torch_versions.DYNAMIC_SIZE
def test_aoti_package_with_a_dynamic_size_is_exact_at_odd_sizes(resnet_d_file, tmp_path, capsys):
    out_path = str(tmp_path / 'model.pt2')
    rc, out, err = _run(['export', resnet_d_file, '--out', out_path, '--aoti', '--img-size', str(SIZE),
                         '--dynamic-size'], capsys)
    assert rc == 0, err
    assert 'torch.export + AOTInductor' in out and 'checked     AOTInductor (input checks on) against PyTorch' in out
    for size in (96, 48, 56, 65, 80):  # 48 px: stage inputs 24, 12, 6, 3 (odd); 65: 33, 17, 9, 5, 3
        assert f'batch 2 {size}x{size}' in out, out
    # our own check, at sizes and a batch the command did not use: what a user gets from torch's loader
    model = tcnn.load(resnet_d_file)
    compiled = tcnn.export.load_aoti(out_path)
    for size in (40, 72, 33):
        x = images(3, size, seed=3)
        with torch.no_grad():
            assert rel_err(compiled(x), model(x)) < 1e-4, size
    with pytest.raises(Exception, match='expected: 3, but got: 4'):  # a wrong channel count is refused
        compiled(torch.randn(1, 4, SIZE, SIZE))
    meta = json.loads(compiled.get_metadata()[tcnn.export.METADATA_KEY])  # the metadata travels in the package
    assert meta['source'] == 'demo_resnet10' and meta['data_config']['input_size'] == [3, 96, 96]


@torch_versions.AOTI
def test_aoti_package_with_a_static_size_refuses_another_size(resnet_d_file, tmp_path):
    model = tcnn.load(resnet_d_file)
    report = tcnn.export.export(model, tmp_path / 'model.pt2', input_size=(3, SIZE, SIZE), aoti=True)
    assert report.format == 'aoti' and report.input_shape == ('batch', 3, SIZE, SIZE)
    assert [(c.batch, c.height) for c in report.checks] == [(1, SIZE), (5, SIZE)] and report.max_rel_err < 1e-5
    compiled = tcnn.export.load_aoti(tmp_path / 'model.pt2')
    with torch.no_grad():
        assert rel_err(compiled(images(3, SIZE, seed=3)), model(images(3, SIZE, seed=3))) < 1e-5
    with pytest.raises(Exception, match='unmatched dim value at 2, expected: 64, but got: 96'):
        compiled(images(1, 96, seed=3))  # without input checks the package runs it and returns wrong logits


def test_aoti_options_refused_in_one_line(resnet_d_file, tmp_path, capsys):
    for argv, message in ((['--out', str(tmp_path / 'm.onnx'), '--aoti'], '--aoti compiles an AOTInductor package, '
                                                                          'a .pt2 file: give --out NAME.pt2'),
                          (['--out', str(tmp_path / 'm.pte'), '--dynamic-size'], '--dynamic-size: a .pte program')):
        rc, _, err = _run(['export', resnet_d_file] + argv, capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------- ExecuTorch


def test_missing_executorch_names_the_extra(resnet_d_file, tmp_path, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, 'executorch.runtime', None)
    rc, _, err = _run(['export', resnet_d_file, '--out', str(tmp_path / 'm.pte')], capsys)
    assert rc == 2 and "needs executorch" in err and "pip install 'tcnn[executorch]'" in err, err


def test_pte_runs_in_executorch_as_in_pytorch(resnet_d_file, tmp_path, capsys):
    pytest.importorskip('executorch.runtime')
    from executorch.runtime import Runtime
    out_path = str(tmp_path / 'model.pte')
    rc, out, err = _run(['export', resnet_d_file, '--out', out_path, '--img-size', str(SIZE)], capsys)
    assert rc == 0, err
    assert 'torch.export + ExecuTorch (XNNPACK)' in out and 'checked     executorch.runtime' in out
    method = Runtime.get().load_program(out_path).load_method('forward')
    model = tcnn.load(resnet_d_file)
    for seed in (5, 6):
        x = images(1, SIZE, seed=seed)
        with torch.no_grad():
            assert rel_err(method.execute([x])[0], model(x)) < 1e-4
