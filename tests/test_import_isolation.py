"""What tcnn's imports and commands import: ``import tcnn`` no torch (the ``t_*`` models are registered all the same);
the commands' help and argument errors (``tcnn train``'s and ``tcnn export``'s too) no torch; saving, loading and
exporting a model the data config only, never the dataset code (image folders, timm's readers, the augmentation, the
CLI's images).

Each case runs in a fresh interpreter: in this one, other tests have imported everything already.
"""
import pytest

from helpers import fresh_python

# the modules of tcnn.data that hold dataset code; tcnn.data.config is what files and exports need
DATASET_MODULES = ('tcnn.data.folders', 'tcnn.data.readers', 'tcnn.data.transforms', 'tcnn.data.images',
                   'tcnn.data.batch_augment', 'tcnn.data.rand_augment', 'tcnn.data.batch_geometry',
                   'tcnn.data.batch_colour', 'tcnn.data.batch_misc')


def test_save_load_and_export_import_no_dataset_code():
    out = fresh_python(
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
    out = fresh_python(
        'import contextlib, io, sys\n'
        'from tcnn.cli import main\n'
        'with contextlib.redirect_stderr(io.StringIO()) as err:\n'
        f'    rc = main({argv!r})\n'
        'print(rc, sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules))\n'
        'print(err.getvalue().strip())\n')
    lines = out.strip().splitlines()
    assert lines[0] == '2 []' and len(lines) == 2 and message in lines[1], out


def test_cli_help_and_argument_errors_do_not_import_torch(tmp_path):
    missing = str(tmp_path / 'missing.pt')
    out = fresh_python(
        'import contextlib, io, sys\n'
        'from tcnn.cli import main\n'
        'for argv in (["--help"], ["convert", "--help"], ["convert"], ["eval", "--help"], ["inspect", "--help"],\n'
        '             ["plot", "--help"], ["info", "--help"], ["convert", "resnet18d", "--out", "x.bin"],\n'
        '             ["convert", "resnet18d", "--out", "x.pt", "--tol", "-1"], ["info", ' + repr(missing) + '],\n'
        '             ["publish", "--help"], ["publish", ' + repr(missing) + ', "--out", ' + repr(str(tmp_path / 'o'))
        + ']):\n'
        '    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n'
        '        try:\n'
        '            rc = main(argv)\n'
        '        except SystemExit as e:\n'
        '            rc = e.code\n'
        '    print(argv[0], rc)\n'
        'print(sorted(m for m in ("torch", "timm", "torchvision", "matplotlib") if m in sys.modules))\n')
    lines = out.strip().splitlines()
    assert lines[-1] == '[]', out
    assert [line.split()[-1] for line in lines[:-1]] == ['0', '0', '2', '0', '0', '0', '0', '2', '2', '2', '0',
                                                         '2'], out


def test_train_help_and_argument_errors_do_not_import_torch():
    """``tcnn train`` takes its arguments from the torch-free ``tcnn.train.args`` and checks a fresh run's recipe
    before importing ``tcnn.train.launch``: --help, argparse errors and recipe mistakes answer without importing
    torch/timm (about 0.05 s instead of 1.5-2 s)."""
    out = fresh_python(
        'import contextlib, io, sys, time\n'
        'start = time.perf_counter()\n'
        'import tcnn.commands.train\n'
        'print("import", sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules))\n'
        'from tcnn.cli import main\n'
        'for argv in (["train", "--help"], ["train", "--epochs", "x"], ["train", "--amp", "fp8"],\n'
        '             ["train", "--lr", "nan"], ["train", "--set", "warmup_epoch=3"]):\n'
        '    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:\n'
        '        try:\n'
        '            rc = main(argv)\n'
        '        except SystemExit as e:\n'
        '            rc = e.code\n'
        '    print(argv[1], rc, ("invalid" in err.getvalue() or "recipe key" in err.getvalue()) if rc else "")\n'
        'print("after", sorted(m for m in ("torch", "timm", "torchvision") if m in sys.modules))\n')
    lines = out.strip().splitlines()
    assert lines[0] == 'import []' and lines[-1] == 'after []', out
    assert lines[1:-1] == ['--help 0 ', '--epochs 2 True', '--amp 2 True', '--lr 2 True', '--set 2 True'], out


def test_import_tcnn_is_light_and_still_registers_the_t_models():
    out = fresh_python(
        'import sys\n'
        'import tcnn\n'
        'print("torch" in sys.modules, "timm" in sys.modules)\n'
        'import timm\n'
        'print(timm.is_model("t_resnet18d"), tcnn.GPSA.__name__, tcnn.__version__)\n')
    assert out.split() == ['False', 'False', 'True', 'GPSA', tcnn_version()], out
    out = fresh_python('import timm, tcnn\nprint(timm.is_model("t_resnet18d"))\n')  # timm first
    assert out.strip() == 'True', out


def tcnn_version() -> str:
    from tcnn.version import __version__
    return __version__
