"""``tcnn export`` (tcnn.export) end to end: every family T-CNNs are made from exports with a dynamic batch, and
onnxruntime (or ``torch.export.load``) reproduces PyTorch's logits; the plain-op depthwise product that exporters
trace equals the eager one; bad input gets one line and writes nothing.

Families at 64 px (the last stage sees 2x2 grids), random weights made non-trivial (every block reaches the logits)
and per-head GPSA settings away from the paper's init, so that a GPSA layer exported wrongly shows in the logits.
"""
import os
import sys

import onnxruntime as ort
import pytest
import timm
import torch
import torch.nn as nn

import tcnn
import tcnn.export
import tcnn.export.pipeline
import tcnn.export.torch_export
from tcnn.files import run_folder
import tcnn.layers.gpsa
import tcnn.layers.kept_values
from tcnn.layers import depthwise
import torch_versions
from helpers import images, rel_err
from nontrivial import away_from_exact, nontrivial, varied_heads
from test_depthwise import _definition
from tcnn.cli import main
from tcnn.layers.gpsa import GPSA
from tcnn.files.sources import create_cnn
from tcnn.files.integrity import check_finite_outputs

SIZE = 64
# one model per family: timm ResNet (from a training checkpoint), byobnet ResNeXt, RegNet (grouped), ConvNeXt
# (depthwise 7x7, 2x2/2 downsample), EfficientNet (depthwise 3x3), MobileNetV3 (depthwise 5x5), torchvision ResNet
FAMILIES = ['resnet10t', 'resnext26ts', 'regnetx_002', 'convnext_atto', 'efficientnet_b0', 'mobilenetv3_small_050',
            'torchvision:resnet18']
# the default stages but for RegNet's (seven grouped 3x3 layers): its first block, stride 2, exports in a third the time
STAGES = {'regnetx_002': 's4.b1'}


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _t_cnn(name: str) -> nn.Module:
    torch.manual_seed(0)
    cnn = nontrivial(create_cnn(name, pretrained=False))
    return varied_heads(tcnn.reparameterize(cnn, stages=STAGES.get(name), verify=False)).eval()


@pytest.fixture(scope='module')
def family_files(tmp_path_factory):
    """name -> path of its T-CNN file, made on first use (``resnet10t``: a ``tcnn train`` checkpoint instead)."""
    folder = tmp_path_factory.mktemp('families')
    files = {}

    def get(name: str) -> str:
        if name not in files:
            model = _t_cnn(name)
            path = str(folder / (name.replace(':', '_') + '.pt'))
            if name == 'resnet10t':
                run_folder.write_checkpoint(run_folder.make_checkpoint(model, epoch=3, best_top1=12.5), path)
            else:
                tcnn.save(model, path)
            files[name] = path
        return files[name]

    return get


def _check_onnx(path: str, model_file: str, size: int = SIZE, batches=(3,)) -> ort.InferenceSession:
    """Our own check of an exported file, at batches the command did not use: onnxruntime against the T-CNN."""
    session = tcnn.export.onnx_session(path)
    assert session.get_inputs()[0].shape[0] == 'batch'  # a dynamic batch, named
    model = tcnn.load(model_file)
    for b in batches:
        x = images(b, size, seed=1)
        with torch.no_grad():
            ref = model(x)
        assert rel_err(session.run(['logits'], {'input': x.numpy()})[0], ref) < 1e-4
    return session


def _gpsa_matters(model: nn.Module) -> None:
    """The GPSA layers shape the logits: an export that computed them wrongly could not pass the check."""
    x = images(2, SIZE, seed=1)
    with torch.no_grad():
        ref = model(x)
        with tcnn.exact_configuration(model):
            exact = model(x)
    assert rel_err(exact, ref) > 1e-2


@torch_versions.DYNAMO_ONNX
@pytest.mark.parametrize('name', FAMILIES)
def test_every_family_exports_to_onnx_with_a_dynamic_batch(name, family_files, tmp_path, capsys):
    path = family_files(name)
    _gpsa_matters(tcnn.load(path))
    out_path = str(tmp_path / 'model.onnx')
    rc, out, err = _run(['export', path, '--out', out_path, '--img-size', str(SIZE)], capsys)
    assert rc == 0, err
    for text in ('ONNX opset 18, dynamo exporter', f'input       input (batch, 3, {SIZE}, {SIZE}) float32',
                 'output      logits (batch, ', 'checked     onnxruntime', f'batch 1 {SIZE}x{SIZE}',
                 f'batch 5 {SIZE}x{SIZE}', 'tolerance 0.0001'):
        assert text in out, (text, out)
    assert os.listdir(tmp_path) == ['model.onnx']
    _check_onnx(out_path, path)


@pytest.mark.parametrize('name', ['convnext_atto', 'efficientnet_b0'])
def test_the_torchscript_exporter_writes_a_checked_opset_13_file(name, family_files, tmp_path, capsys):
    # the two families it failed on (aten::linalg_vecdot has no ONNX symbolic) before the traceable product
    path = family_files(name)
    out_path = str(tmp_path / 'model.onnx')
    rc, out, err = _run(['export', path, '--out', out_path, '--img-size', str(SIZE), '--exporter', 'torchscript',
                         '--opset', '13'], capsys)
    assert rc == 0, err
    assert 'ONNX opset 13, torchscript exporter' in out
    _check_onnx(out_path, path)
    import onnx
    assert [o.version for o in onnx.load(out_path).opset_import if o.domain in ('', 'ai.onnx')] == [13]


@torch_versions.DYNAMO_ONNX
@torch_versions.DYNAMIC_SIZE
def test_a_dynamic_size_onnx_file_runs_at_other_sizes(family_files, tmp_path, capsys):
    path = family_files('convnext_atto')
    out_path = str(tmp_path / 'model.onnx')
    rc, out, err = _run(['export', path, '--out', out_path, '--img-size', str(SIZE), '--dynamic-size'], capsys)
    assert rc == 0, err
    assert 'input (batch, 3, height, width)' in out and f'batch 2 {SIZE + 32}x{SIZE + 32}' in out
    session = _check_onnx(out_path, path)
    model = tcnn.load(path)
    x = images(2, (80, 112), seed=2)  # non-square, not checked by export
    with torch.no_grad():
        ref = model(x)
    assert rel_err(session.run(['logits'], {'input': x.numpy()})[0], ref) < 1e-4


@pytest.mark.parametrize('dynamic_size', [False, pytest.param(True, marks=torch_versions.DYNAMIC_SIZE)],
                         ids=['batch', 'batch-and-size'])
def test_a_pt2_program_matches_the_model_and_guards_its_size(dynamic_size, family_files, tmp_path, capsys):
    # EfficientNet: the family whose dynamic batch torch.export refused before the traceable product
    name = 'convnext_atto' if dynamic_size else 'efficientnet_b0'
    path = family_files(name)
    out_path = str(tmp_path / 'model.pt2')
    argv = ['export', path, '--out', out_path, '--img-size', str(SIZE)] + (['--dynamic-size'] if dynamic_size else [])
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    assert 'torch.export' in out and 'checked     torch.export.load' in out
    program = torch.export.load(out_path)
    model = tcnn.load(path)
    size = 96 if dynamic_size else SIZE
    x = images(3, size, seed=1)
    with torch.no_grad():
        assert rel_err(program.module()(x), model(x)) < 1e-4
    if not dynamic_size:
        # the size is part of the program: its guard refuses another (torch 2.14 names the guard; older releases,
        # 2.4 for one, check the inputs with "Expected input at *args[0].shape[2] to be equal to 64, but got 96")
        refused = rf'Guard failed: \w+\.size\(\)\[2\] == {SIZE}$|shape\[2\] to be equal to {SIZE}, but got 96$'
        with pytest.raises((AssertionError, RuntimeError), match=refused):
            program.module()(images(3, 96, seed=1))


def test_the_export_api_reports_its_checks_and_stores_the_metadata(tmp_path):
    import json

    import onnx
    model = _t_cnn('resnet10t')
    report = tcnn.export.export(model, tmp_path / 'm.onnx', input_size=(3, 48, 48), exporter='torchscript')
    assert report.format == 'onnx' and report.exporter == 'torchscript' and report.opset == 17
    assert report.input_shape == ('batch', 3, 48, 48) and report.output_shape == ('batch', 1000)
    assert [(c.batch, c.height, c.width) for c in report.checks] == [(1, 48, 48), (5, 48, 48)]
    assert 0 < report.max_rel_err < 1e-5 and report.size_bytes == os.path.getsize(tmp_path / 'm.onnx')
    meta = json.loads({p.key: p.value for p in onnx.load(tmp_path / 'm.onnx').metadata_props}['tcnn'])
    assert meta['source'] == 'resnet10t' and meta['conversion']['stages'] == ['layer4']
    assert meta['data_config']['mean'] == list(timm.data.IMAGENET_DEFAULT_MEAN)
    assert model.training is False


# ------------------------------------------------------------------------------------- the traceable product


@pytest.mark.parametrize('c_in,c_out', [(20, 20), (10, 30)], ids=['depthwise', 'multiplier3'])
@pytest.mark.parametrize('fold', [False, True], ids=['eager-heads-first', 'eager-folded'])
def test_traceable_product_equals_the_eager_one(monkeypatch, c_in, c_out, fold):
    if fold:  # the folded, chunked autograd function, in chunks of 8 channels
        monkeypatch.setattr(tcnn.layers.depthwise, 'FOLD_MIN_ROW', 0)
        monkeypatch.setattr(tcnn.layers.depthwise, 'CPU_CHUNK_ELEMENTS', 1)
        monkeypatch.setattr(tcnn.layers.depthwise, 'MIN_CHUNK', 8)
    torch.manual_seed(0)
    attn = torch.rand(3, 6, 9, 5, dtype=torch.float64).softmax(-1).view(3, 6, 45)
    values, taps = torch.randn(3, 5, c_in, dtype=torch.float64), torch.randn(9, c_out, dtype=torch.float64)
    assert depthwise.folding_pays(3, 6, 9, 5, c_out) == fold
    eager, traceable = depthwise.attend_depthwise(attn, values, taps), depthwise.attend_traceable(attn, values, taps)
    torch.testing.assert_close(traceable, _definition(attn, values, taps), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(traceable, eager, rtol=1e-12, atol=1e-12)


def _not_here(*args):
    raise AssertionError('the eager depthwise product ran while exporting')


def _layer(stride: int = 1) -> GPSA:
    torch.manual_seed(0)
    layer = GPSA.from_conv(nn.Conv2d(16, 32, 5, stride, 2, groups=16, bias=True))
    return away_from_exact(layer, value_noise=0.3).eval()


@pytest.mark.parametrize('tracer', ['jit.trace', 'torch.export'])
def test_exporters_trace_the_plain_op_product(monkeypatch, tracer):
    # a 5x5 depthwise layer with a channel multiplier, traced at batch 2, run at batch 1 and 5
    layer = _layer()
    features = {b: images(b, 7, chans=16, seed=b) for b in (1, 2, 5)}
    with torch.no_grad():
        eager = {b: layer(features[b]) for b in (1, 5)}
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_depthwise', _not_here)
    with torch.no_grad():
        if tracer == 'jit.trace':
            traced = torch.jit.trace(layer, features[2], check_trace=False)  # the check would rerun eagerly
        else:
            traced = torch.export.export(layer, (features[2],),
                                         dynamic_shapes=({0: torch.export.Dim('batch')},)).module()
        for b in (1, 5):
            torch.testing.assert_close(traced(features[b]), eager[b], rtol=1e-5, atol=1e-6)
        with pytest.raises(AssertionError, match='eager depthwise'):
            layer(features[2])  # outside an exporter: the eager product (here the stand-in that refuses)


def test_outside_exporters_the_eager_product_has_the_traced_ones_gradients(monkeypatch):
    """Outside exporters training goes through the eager product's autograd function (it has a backward), whose
    gradients are those of the plain-op form that exporters trace, in float64."""
    assert not tcnn.layers.kept_values.is_exporting()
    layer = _layer(stride=2).double()
    x = torch.randn(2, 16, 9, 9, dtype=torch.float64, requires_grad=True)

    def gradients():
        layer.zero_grad()
        x.grad = None
        out = layer(x)
        out.square().sum().backward()
        return out, [x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]

    out, eager = gradients()
    assert out.grad_fn is not None
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_depthwise', depthwise.attend_traceable)
    plain_out, plain = gradients()
    torch.testing.assert_close(out, plain_out, rtol=1e-12, atol=1e-12)
    assert len(eager) == len(plain) == 1 + len(list(layer.parameters()))
    for a, b in zip(eager, plain):
        assert a.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------- bad input, one line


@pytest.fixture(scope='module')
def small_file(family_files):
    return family_files('resnet10t')


@pytest.mark.parametrize('args,message', [
    (['--out', 'OUT/m.tflite'], 'the extension must be one of .onnx, .pt2'),
    (['--out', 'OUT/m.pt2', '--opset', '18'], '--opset applies to .onnx files'),
    (['--out', 'OUT/m.pt2', '--exporter', 'dynamo'], '--exporter applies to .onnx files'),
    (['--out', 'OUT/m.onnx', '--opset', '17'], '--opset 17: the dynamo exporter writes opsets 18 and later; '
                                                '--exporter torchscript writes it'),
    (['--out', 'OUT/m.onnx', '--opset', '12', '--exporter', 'torchscript'],
     '--opset 12: the torchscript exporter writes opsets 13-20'),
    (['--out', 'OUT/m.onnx', '--opset', '21', '--exporter', 'torchscript'],
     '--opset 21: the torchscript exporter writes opsets 13-20; --exporter dynamo writes it'),
    (['--out', 'OUT/blocker/m.onnx'], 'is a file, so'),
    (['--out', 'OUT/m.onnx', '--img-size', '0'], '--img-size must be >= 1, got 0'),
    (['--out', 'OUT/m.onnx', '--img-size', '64x'], '--img-size takes N or HxW'),
    (['--out', 'OUT/m.onnx', '--tol', 'nan'], '--tol must be a finite number'),
])
def test_bad_export_options_are_refused_in_one_line(small_file, tmp_path, capsys, args, message):
    (tmp_path / 'blocker').write_text('a file where a folder is needed')
    args = [a.replace('OUT', str(tmp_path)) for a in args]
    rc, out, err = _run(['export', small_file] + args, capsys)
    assert rc == 2 and err.startswith('tcnn export: error: ') and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ['blocker']


@torch_versions.DYNAMO_ONNX
def test_plain_cnns_and_non_t_cnn_files_are_refused_in_one_line(tmp_path, capsys):
    cnn = timm.create_model('resnet10t')
    tcnn.save(cnn, str(tmp_path / 'cnn.pt'))
    torch.save(cnn.state_dict(), str(tmp_path / 'sd.pth'))
    for name, message in (('cnn.pt', 'holds a plain CNN (no GPSA layers), not a T-CNN: convert it first'),
                          ('sd.pth', 'is a plain state_dict, not a T-CNN file'),
                          ('missing.pt', 'T-CNN file not found')):
        rc, out, err = _run(['export', str(tmp_path / name), '--out', str(tmp_path / 'm.onnx')], capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / 'm.onnx').exists()


@torch_versions.DYNAMO_ONNX
def test_missing_onnxruntime_names_the_extra(small_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)  # import onnxruntime -> ImportError
    rc, out, err = _run(['export', small_file, '--out', str(tmp_path / 'm.onnx')], capsys)
    assert rc == 2 and err.strip() == ("tcnn export: error: exporting to ONNX needs onnxruntime (to export and to "
                                       "check the export against PyTorch): pip install 'tcnn[onnx]'")
    rc, out, err = _run(['export', small_file, '--out', str(tmp_path / 'm.pt2'), '--img-size', '32'], capsys)
    assert rc == 0, err  # torch.export needs no extra
    assert os.listdir(tmp_path) == ['m.pt2']


@torch_versions.DYNAMO_ONNX
def test_an_opset_the_exporter_cannot_convert_is_refused_in_one_line(small_file, tmp_path, capsys):
    rc, out, err = _run(['export', small_file, '--out', str(tmp_path / 'm.onnx'), '--img-size', '32', '--opset',
                         '30'], capsys)
    assert rc == 2 and err.strip() == ('tcnn export: error: --opset 30: the dynamo exporter could not convert this '
                                       'model to opset 30 (it wrote opset 18); use a lower opset'), err
    assert os.listdir(tmp_path) == []


def test_a_wrong_export_is_refused_and_nothing_written(family_files, tmp_path, capsys, monkeypatch):
    # an exported depthwise product 1% off: the check at batch 1 and 5 catches it; the previous file stays
    path = family_files('convnext_atto')
    out_path = tmp_path / 'm.onnx'
    out_path.write_bytes(b'previous export')
    monkeypatch.setattr(tcnn.layers.gpsa, 'attend_traceable',
                        lambda a, v, t: depthwise.attend_traceable(a, v, t) * 1.01)
    rc, out, err = _run(['export', path, '--out', str(out_path), '--img-size', str(SIZE), '--exporter', 'torchscript'],
                        capsys)
    assert rc == 2, err
    assert err.startswith('tcnn export: error: the exported model differs from PyTorch: max rel err ')
    assert 'at batch 1, 64x64 (onnxruntime 1.' in err and 'tolerance 0.0001); nothing written' in err
    assert out_path.read_bytes() == b'previous export' and os.listdir(tmp_path) == ['m.onnx']


@pytest.mark.parametrize('exporter', [pytest.param('dynamo', marks=torch_versions.DYNAMO_ONNX), 'torchscript'])
def test_without_the_traceable_product_depthwise_models_do_not_export(exporter, family_files, tmp_path, capfd,
                                                                       monkeypatch):
    # tcnn 0.3.1 traced the eager product: its batch-size decisions fixed the batch under torch.export, its
    # linalg.vecdot has no ONNX form in the TorchScript exporter; either way one line (no graph dump), nothing written
    monkeypatch.setattr(tcnn.layers.gpsa, 'is_exporting', lambda: False)
    path = family_files('efficientnet_b0')
    rc = main(['export', path, '--out', str(tmp_path / 'm.onnx'), '--img-size', str(SIZE), '--exporter', exporter])
    out, err = capfd.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and not out, err[:2000]
    assert err.startswith({'dynamo': 'tcnn export: error: torch.export cannot export this model with a dynamic batch',
                           'torchscript': "tcnn export: error: the torchscript ONNX exporter cannot export this model "
                                          "at opset 17: UnsupportedOperatorError: Exporting the operator "
                                          "'aten::linalg_vecdot'"}[exporter]), err
    assert os.listdir(tmp_path) == []


def test_api_refuses_a_float64_model(tmp_path):
    model = _t_cnn('resnet10t').double()
    with pytest.raises(tcnn.errors.InvalidArgumentError, match='export takes a float32 model on the CPU'):
        tcnn.export.export(model, tmp_path / 'm.pt2')
    assert os.listdir(tmp_path) == []


@torch_versions.DYNAMO_ONNX
def test_onnx_benchmark_runs(tmp_path):
    import json

    from benchmarks import onnx_cpu
    out = tmp_path / 'onnx.json'
    threads = torch.get_num_threads()
    try:
        assert onnx_cpu.main(['--models', 'resnet10t', '--size', '48', '--batch-size', '2', '--threads', '1',
                              '--repeats', '1', '--warmup', '0', '--out', str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # main() sets the thread count it measures
    res = json.loads(out.read_text())
    assert res['machine']['onnxruntime'] == ort.__version__ and res['command'].startswith('python ')
    (row,) = res['rows']
    assert set(row['ms']) == {'ort_cnn', 'ort_t_cnn', 'torch_cnn', 'torch_t_cnn'} and min(row['ms'].values()) > 0
    assert row['clock'] == 'process CPU time' and row['ort_t_over_cnn'] > 0 and row['ort_over_torch_t_cnn'] > 0


# ------------------------------------------------------------------------------------- issue 31: inputs and outputs


def test_a_published_hub_folder_exports_as_tcnn_load_reads_it(small_file, tmp_path, capsys):
    folder = tmp_path / 'published'
    rc, _, err = _run(['publish', small_file, '--out', str(folder)], capsys)
    assert rc == 0, err
    for spec in (str(folder), f'local-dir:{folder}'):
        out_path = tmp_path / 'm.pt2'
        rc, out, err = _run(['export', spec, '--out', str(out_path), '--img-size', '32'], capsys)
        assert rc == 0 and out_path.exists(), err
        model, x = tcnn.load(str(folder)), images(3, 32, seed=1)
        with torch.no_grad():
            assert rel_err(torch.export.load(str(out_path)).module()(x), model(x)) < 1e-5
        out_path.unlink()


@pytest.mark.parametrize('out,message', [
    ('/proc/tcnn-test.onnx', 'tcnn export: error: --out: /proc is not writable; choose another path'),
    ('OUT/m.onnx/', 'OUT/m.onnx/ is a folder; give a file name'),
    ('OUT/folder.onnx', 'OUT/folder.onnx is a folder; give a file name'),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_export(small_file, tmp_path, capsys, monkeypatch,
                                                                       out, message):
    # the export must not even start: a write that fails after minutes of exporting is a dead end
    (tmp_path / 'folder.onnx').mkdir()
    monkeypatch.setattr(tcnn.export.pipeline, 'export_checked',
                        lambda *a, **k: pytest.fail('exported before checking --out'))
    out, message = out.replace('OUT', str(tmp_path)), message.replace('OUT', str(tmp_path))
    rc, _, err = _run(['export', small_file, '--out', out, '--img-size', '32'], capsys)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == ['folder.onnx'] and not os.listdir(tmp_path / 'folder.onnx')


def test_the_options_are_checked_once(small_file, tmp_path, capsys, monkeypatch):
    """``tcnn export`` checks its options before reading the model and exports with what the check returned;
    ``tcnn.export.export`` checks them itself: once each, never again inside the export."""
    import tcnn.export.options as options
    check, calls = options.check_export_options, []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return check(*args, **kwargs)

    monkeypatch.setattr(tcnn.export.pipeline, 'check_export_options', counted)  # what tcnn.export.export calls
    monkeypatch.setattr(options, 'check_export_options', counted)  # what the command imports when it runs
    rc, _, err = _run(['export', small_file, '--out', str(tmp_path / 'cli.pt2'), '--img-size', '32'], capsys)
    assert rc == 0 and calls == [str(tmp_path / 'cli.pt2')], (calls, err)
    tcnn.export.export(tcnn.load(small_file), str(tmp_path / 'api.pt2'), input_size=(3, 32, 32))
    assert calls == [str(tmp_path / 'cli.pt2'), str(tmp_path / 'api.pt2')]


def test_a_model_with_non_finite_weights_is_named_before_exporting(tmp_path, capsys, monkeypatch):
    model = _t_cnn('resnet10t')
    with torch.no_grad():
        model.layer4[0].conv2.v_weight[0, 0] = float('nan')  # a GPSA layer's parameter
        model.fc.bias[3] = float('inf')
    path = str(tmp_path / 'bad.pt')
    tcnn.save(model, path)
    monkeypatch.setattr(tcnn.export.torch_export, 'export_bytes',
                        lambda *a: pytest.fail('exported a model that computes NaN'))
    rc, _, err = _run(['export', path, '--out', str(tmp_path / 'm.pt2'), '--img-size', '32'], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert 'the model computes non-finite logits (NaN or infinity); 2 of its parameters/buffers hold NaN or ' \
           'infinite values (layer4.0.conv2.v_weight, fc.bias)' in err and 'max rel err' not in err, err
    assert os.listdir(tmp_path) == ['bad.pt']


def test_finite_weights_with_non_finite_outputs_say_so():
    model = nn.Linear(2, 2)
    with pytest.raises(tcnn.errors.TcnnError, match=r'^cannot run: the model computes non-finite logits .* its '
                                                    r'parameters and buffers are all finite'):
        check_finite_outputs(model(torch.tensor([[1e38, 1e38]])) * 1e38, model, 'cannot run')
    check_finite_outputs(model(torch.ones(1, 2)), model, 'cannot run')  # finite: nothing raised


def test_exported_gpsa_graph_has_no_op_executorch_lacks():
    # ExecuTorch has no kernel for prims.copy_strided, which the core-ATen decomposition of torch.lerp writes: while
    # exporting, GPSA mixes the attentions with plain ops (eager keeps torch.lerp); the product is unchanged
    layer = _layer()
    features = images(2, 7, chans=16, seed=2)
    program = torch.export.export(layer, (features,)).run_decompositions()
    targets = {str(n.target) for n in program.graph.nodes if n.op == 'call_function'}
    assert not any('copy_strided' in t or 'lerp' in t for t in targets), targets
    with torch.no_grad():
        torch.testing.assert_close(program.module()(features), layer(features), rtol=1e-5, atol=1e-6)
