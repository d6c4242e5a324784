"""What saving, loading and exporting a model import: the data config only, never the dataset code (image folders,
timm's readers, the augmentation, the CLI's images), and ``tcnn export`` checks its options without importing torch.

Each case runs in a fresh interpreter: in this one, other tests have imported everything already.
"""
import pytest

from test_bad_inputs import _fresh_python

# the modules of tcnn.data that hold dataset code; tcnn.data.config is what files and exports need
DATASET_MODULES = ('tcnn.data.folders', 'tcnn.data.readers', 'tcnn.data.transforms', 'tcnn.data.images',
                   'tcnn.data.batch_augment', 'tcnn.data.rand_augment', 'tcnn.data.batch_geometry',
                   'tcnn.data.batch_colour', 'tcnn.data.batch_misc')


def test_save_load_and_export_import_no_dataset_code():
    out = _fresh_python(
        'import sys\n'
        'import tcnn\n'
        'import tcnn.files.tcnn_file, tcnn.files.loading\n'  # tcnn.save, tcnn.load
        'import tcnn.files.weights, tcnn.files.sources\n'
        'import tcnn.export.pipeline, tcnn.export.backbone\n'  # tcnn.export.export and every format module
        'assert tcnn.save and tcnn.load and tcnn.export.export\n'
        'print(sorted(m for m in sys.modules if m.startswith("tcnn.data")))\n')
    loaded = eval(out.strip().splitlines()[-1])
    assert 'tcnn.data.config' in loaded, out  # the data config: what a file and an export store
    assert [m for m in DATASET_MODULES if m in loaded] == [], out


@pytest.mark.parametrize('args,message', [
    (['--out', 'OUT/m.bin'], 'the extension must be one of .onnx, .pt2, .pte'),
    (['--out', 'OUT/m.pt2', '--opset', '18'], '--opset applies to .onnx files'),
    (['--out', 'OUT/m.pt2', '--exporter', 'dynamo'], '--exporter applies to .onnx files'),
    (['--out', 'OUT/m.onnx', '--aoti'], '--aoti compiles an AOTInductor package'),
    (['--out', 'OUT/m.onnx', '--opset', '12', '--exporter', 'torchscript'], 'writes opsets 13-20'),
    (['--out', 'OUT/m.onnx', '--tol', 'nan'], '--tol must be a finite number'),
    (['--out', 'OUT/m.onnx', '--img-size', '0'], '--img-size must be >= 1, got 0'),
    (['--out', 'OUT/m.onnx', '--img-size', '64x'], '--img-size takes N or HxW'),
])
def test_export_argument_errors_do_not_import_torch(tmp_path, args, message):
    """The options are checked once, by ``tcnn.export.options`` (torch-free until they are valid), before the model
    is read: a mistake answers in one line without the seconds importing torch takes."""
    (tmp_path / 'in.pt').write_bytes(b'never read')
    argv = ['export', str(tmp_path / 'in.pt')] + [a.replace('OUT', str(tmp_path)) for a in args]
    out = _fresh_python(
        'import contextlib, io, sys\n'
        'from tcnn.cli import main\n'
        'with contextlib.redirect_stderr(io.StringIO()) as err:\n'
        f'    rc = main({argv!r})\n'
        'print(rc, sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules))\n'
        'print(err.getvalue().strip())\n')
    lines = out.strip().splitlines()
    assert lines[0] == '2 []' and len(lines) == 2 and message in lines[1], out
