"""tcnn on older torch releases (``tcnn.compat``): a torch older than supported is refused in one line, an export
feature that needs a later torch than the oldest supported names it, a missing torch function is never reported as a
corrupt file, and the stand-in for a function of later torch releases does what that function does."""
import importlib.util
import os

import pytest
import torch
import torch.nn as nn

import tcnn
import tcnn.export
from tcnn import compat
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.files.weights import load_torch_file


def test_a_torch_older_than_supported_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch, '__version__', '2.4.1')
    spec = importlib.util.spec_from_file_location('tcnn._compat_on_torch_2_4', compat.__file__)
    with pytest.raises(TcnnError) as info:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))  # tcnn.compat, imported anew
    assert str(info.value) == "tcnn needs torch >= 2.5 (this is 2.4.1): pip install -U 'torch>=2.5' torchvision"


@pytest.mark.parametrize('args,message', [
    (['m.onnx'], "the dynamo ONNX exporter (the default) needs torch >= 2.8 (this is 2.5.1): pip install -U "
                 "'torch>=2.8' torchvision, or --exporter torchscript"),
    (['m.pt2', '--aoti'], "--aoti (an AOTInductor package) needs torch >= 2.10 (this is 2.5.1): pip install -U "
                          "'torch>=2.10' torchvision, or a .pt2 without --aoti"),
    (['m.pt2', '--dynamic-size'], "--dynamic-size needs torch >= 2.6 (this is 2.5.1): pip install -U 'torch>=2.6' "
                                  "torchvision, or a fixed size per export"),
])
def test_export_features_of_a_later_torch_name_it(monkeypatch, tmp_path, capsys, args, message):
    """On torch 2.5 (the oldest supported) these exports stop in one line, before the model is read; a .pt2 archive
    and the TorchScript ONNX exporter pass the check."""
    monkeypatch.setattr(torch, '__version__', '2.5.1')
    (tmp_path / 'in.pt').write_bytes(b'never read')
    rc = main(['export', str(tmp_path / 'in.pt'), '--out', str(tmp_path / args[0])] + args[1:])
    err = capsys.readouterr().err
    assert rc == 2 and err == f'tcnn export: error: {message}\n'
    assert os.listdir(tmp_path) == ['in.pt']
    assert tcnn.export.check_export_options(str(tmp_path / 'm.onnx'), 'torchscript').format == 'onnx'
    assert tcnn.export.check_export_options(str(tmp_path / 'm.pt2')).format == 'pt2'


def test_a_missing_torch_function_is_not_a_corrupt_file(monkeypatch, tmp_path):
    """What torch lacks is named as such, not as a truncated or corrupt file (torch 2.4 has no safe_globals)."""
    path = str(tmp_path / 'sd.pt')
    torch.save({'w': torch.ones(2)}, path)
    assert load_torch_file(path)['w'].tolist() == [1.0, 1.0]
    monkeypatch.delattr(torch.serialization, 'safe_globals')
    with pytest.raises(AttributeError, match='safe_globals'):
        load_torch_file(path)


@pytest.mark.skipif(not hasattr(torch.onnx.ONNXProgram, 'rename_axes'),
                    reason=f'ONNXProgram.rename_axes, the reference, needs torch >= 2.11 (this is {torch.__version__})')
def test_onnx_axis_renaming_equals_torchs():
    """``compat.rename_ir_axes`` (torch 2.8-2.10) writes the file that torch's ``rename_axes`` writes, shape
    expressions (the strided conv's output size) included."""
    pytest.importorskip('onnxscript', reason="the dynamo ONNX exporter needs onnxscript: pip install 'tcnn[onnx]'")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2)).eval()
    x = torch.randn(2, 3, 32, 32)
    dims = {0: torch.export.Dim('batch'), 2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}
    files = []
    for rename in (lambda p, names: p.rename_axes(names), lambda p, names: compat.rename_ir_axes(p.model, names)):
        program = torch.onnx.export(torch.export.export(model, (x,), dynamic_shapes=(dims,)), (x,), dynamo=True,
                                    opset_version=18, verbose=False)
        shape = program.model.graph.inputs[0].shape
        names = {shape[0].value: 'batch', shape[2].value: 'height', shape[3].value: 'width'}
        rename(program, names)
        files.append(program.model_proto.SerializeToString())
    assert files[0] == files[1]
    proto = torch.onnx.export(torch.export.export(model, (x,), dynamic_shapes=(dims,)), (x,), dynamo=True,
                              opset_version=18, verbose=False).model_proto
    assert files[0] != proto.SerializeToString()  # the renaming changed the file
    outputs = [d.dim_param for d in onnx_output_dims(files[0])]
    assert outputs[0] == 'batch' and 'height' in outputs[2] and 'width' in outputs[3], outputs


def onnx_output_dims(data: bytes):
    import onnx
    return onnx.load_from_string(data).graph.output[0].type.tensor_type.shape.dim
