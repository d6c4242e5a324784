"""Bad files and output paths get one line naming the fix, before any work: the shared loader of user-named torch
files (``tcnn.files.weights.load_torch_file``) and output-path checks (``tcnn.paths``) used by the commands."""
import os
import shlex

import pytest
import torch

from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.files.weights import load_torch_file
from tcnn.paths import check_output_dir, check_output_file, output_dir


class _Payload:
    """A pickled object whose loading runs code (it creates the file ``marker``): must never be unpickled."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {shlex.quote(self.marker)}',))


@pytest.fixture()
def bad_files(tmp_path):
    files = {'empty': tmp_path / 'empty.pt', 'junk': tmp_path / 'junk.pt', 'pickle': tmp_path / 'pickle.pt',
             'folder': tmp_path / 'folder'}
    files['empty'].write_bytes(b'')
    files['junk'].write_bytes(b'GIF89a, random bytes, not a torch file\n' * 8)
    files['marker'] = tmp_path / 'payload-ran'
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'code': _Payload(str(files['marker']))}, files['pickle'])
    files['folder'].mkdir()
    return files


@pytest.mark.parametrize('kind, message', [
    ('empty', 'is empty (0 bytes)'),
    ('junk', 'is not a torch file'),
    ('pickle', 'never loads (unpickling can run code)'),
    ('folder', 'is a folder, not a file'),
])
def test_load_torch_file_refuses_bad_files_in_one_line_without_unpickling(bad_files, kind, message):
    with pytest.raises(TcnnError) as info:
        load_torch_file(str(bad_files[kind]), 'weights file')
    text = str(info.value)
    assert message in text and len(text.splitlines()) == 1 and 'weights_only=False' not in text, text
    assert not bad_files['marker'].exists()  # the payload's code never ran


def test_the_payload_runs_when_unpickled(bad_files):
    """The check above can fail: unpickling the 'pickle' file for real runs its payload."""
    torch.load(bad_files['pickle'], weights_only=False)
    assert bad_files['marker'].exists()


@pytest.mark.parametrize('kind, message', [('empty', 'is empty (0 bytes)'), ('pickle', 'never loads')])
def test_convert_refuses_a_bad_weights_file_in_one_line(bad_files, tmp_path, capsys, kind, message):
    out = tmp_path / 'out' / 't.pt'
    assert main(['convert', 'resnet18d', '--weights', str(bad_files[kind]), '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('tcnn convert: error:') and message in err[0], err
    assert 'weights_only=False' not in err[0] and not out.exists() and not bad_files['marker'].exists()


def test_output_checks_refuse_a_file_for_a_folder_and_an_unknown_extension(tmp_path):
    a_file = tmp_path / 'file.txt'
    a_file.write_text('x')
    with pytest.raises(TcnnError, match='is a file; give a folder'):
        check_output_dir(str(a_file))
    with pytest.raises(TcnnError, match='is a file, so'):
        check_output_dir(str(a_file / 'sub'))
    with pytest.raises(TcnnError, match='is a folder; give a file name'):
        check_output_file(str(tmp_path))
    with pytest.raises(TcnnError, match='extension must be one of .png, .pdf'):
        check_output_file(str(tmp_path / 'fig.xyz'), suffixes=('.png', '.pdf'))
    assert check_output_file(str(tmp_path / 'new' / 'fig.png'), suffixes=('.png',)).endswith('fig.png')


def test_output_dir_removes_only_what_it_created_and_left_empty(tmp_path):
    with pytest.raises(RuntimeError):
        with output_dir(str(tmp_path / 'a' / 'b' / 'c')):
            raise RuntimeError('failed run')
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError):
        with output_dir(str(tmp_path / 'a' / 'b')) as path:
            open(os.path.join(path, 'log.txt'), 'w').close()
            raise RuntimeError('failed after writing')
    assert os.listdir(tmp_path / 'a' / 'b') == ['log.txt']
    with output_dir(str(tmp_path / 'x')):
        pass
    assert (tmp_path / 'x').is_dir()


@pytest.mark.parametrize('flags, message', [
    (['--locality-strength', 'nan'], '--locality-strength must be a finite number, got nan'),
    (['--locality-strength', '-1'], '--locality-strength must be > 0'),
    (['--gating-init', 'inf'], '--gating-init must be a finite number, got inf'),
    (['--qk-dim', '0'], '--qk-dim must be >= 1, got 0'),
    (['--tol', '-1'], '--tol must be > 0, got -1.0'),
])
def test_convert_refuses_bad_settings_before_work(tmp_path, capsys, flags, message):
    out = tmp_path / 't.pt'
    assert main(['convert', 'resnet18d', '--no-pretrained', '--out', str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize('kwargs, message', [
    ({'locality_strength': float('nan')}, 'locality_strength must be a finite number, got nan'),
    ({'gating_init': float('inf')}, 'gating_init must be a finite number, got inf'),
    ({'qk_dim': 0}, 'qk_dim must be >= 1'),
    ({'tol': -1.0}, 'tol must be > 0'),
])
def test_reparameterize_refuses_bad_settings(kwargs, message):
    import timm
    import tcnn
    model = timm.create_model('resnet18d', num_classes=3)
    for fn in (tcnn.reparameterize, tcnn.reparameterize_):
        with pytest.raises(ValueError, match=message) as info:
            fn(model, **kwargs)
        assert isinstance(info.value, TcnnError)
    assert not tcnn.gpsa_layers(model)  # nothing was converted


def test_load_with_an_unknown_device_names_the_argument(tmp_path):
    import timm
    import tcnn
    path = tcnn.save(timm.create_model('resnet18d', num_classes=3), str(tmp_path / 'cnn.pt'))
    with pytest.raises(ValueError, match="map_location 'tpu' is not a device"):
        tcnn.load(path, map_location='tpu')
    with pytest.raises(TcnnError, match="map_location 'tpu' is not a device"):
        load_torch_file(path, map_location='tpu')


# ---------------------------------------------------------------------------------------------- API arguments


@pytest.fixture(scope='module')
def small():
    """A CNN, its T-CNN (32 px, not verified: only arguments are under test) and a batch of images."""
    import timm
    import tcnn
    cnn = timm.create_model('resnet18d', num_classes=3)
    return cnn, tcnn.reparameterize(cnn, verify=False), torch.randn(2, 3, 32, 32)


def _api_cases():
    import torch.nn as nn
    import tcnn
    from tcnn.analysis import figures, heads
    from tcnn.evaluation import plots
    from tcnn.data.config import data_config
    from tcnn.data.images import denormalize, find_images, load_images
    from tcnn.files.sources import create_cnn
    from tcnn.evaluation import scoring, suites, tables
    nan, inf = float('nan'), float('inf')
    conv = nn.Conv2d(4, 4, 3, padding=1)
    return [  # (name, call(cnn, t_cnn, x, tmp_path), exception type, message)
        ('GPSA in_chs', lambda c, t, x, p: tcnn.GPSA(0, 4), ValueError, 'in_chs must be >= 1, got 0'),
        ('GPSA in_chs float', lambda c, t, x, p: tcnn.GPSA(4.5, 4), TypeError, 'in_chs must be an integer'),
        ('GPSA kernel_size', lambda c, t, x, p: tcnn.GPSA(4, 4, kernel_size=0), ValueError, 'kernel_size must be >= 1'),
        ('GPSA kernel_size pair', lambda c, t, x, p: tcnn.GPSA(4, 4, kernel_size=(3,)), TypeError,
         'kernel_size must be an int or a pair'),
        ('GPSA stride', lambda c, t, x, p: tcnn.GPSA(4, 4, stride=0), ValueError, 'stride must be >= 1'),
        ('GPSA padding', lambda c, t, x, p: tcnn.GPSA(4, 4, padding=-1), ValueError, 'padding must be >= 0'),
        ('GPSA dilation', lambda c, t, x, p: tcnn.GPSA(4, 4, dilation=0), ValueError, 'dilation must be >= 1'),
        ('GPSA qk_dim 0', lambda c, t, x, p: tcnn.GPSA(4, 4, qk_dim=0), ValueError, 'qk_dim must be >= 1, got 0'),
        ('GPSA alpha nan', lambda c, t, x, p: tcnn.GPSA(4, 4, locality_strength=nan), ValueError,
         'locality_strength must be a finite number, got nan'),
        ('GPSA lambda inf', lambda c, t, x, p: tcnn.GPSA(4, 4, gating_init=inf), ValueError,
         'gating_init must be a finite number, got inf'),
        ('GPSA padding_mode', lambda c, t, x, p: tcnn.GPSA(4, 4, padding_mode='x'), ValueError,
         'padding_mode must be zeros'),
        ('from_conv Linear', lambda c, t, x, p: tcnn.GPSA.from_conv(nn.Linear(3, 3)), TypeError,
         'conv must be a torch.nn.Conv2d, got Linear'),
        ('from_conv alpha nan', lambda c, t, x, p: tcnn.GPSA.from_conv(conv, locality_strength=nan), ValueError,
         'locality_strength must be a finite number'),
        ('from_conv qk_dim 0', lambda c, t, x, p: tcnn.GPSA.from_conv(conv, qk_dim=0), ValueError,
         'qk_dim must be >= 1'),
        ('set_locality nan', lambda c, t, x, p: tcnn.GPSA(4, 4).set_locality_strength(nan), ValueError,
         'locality_strength must be a finite number'),
        ('set_locality shape', lambda c, t, x, p: tcnn.GPSA(4, 4).set_locality_strength(torch.ones(3)), ValueError,
         'locality_strength must be a number or 9 values'),
        ('set_gating inf', lambda c, t, x, p: tcnn.GPSA(4, 4).set_gating(inf), ValueError,
         'gating must be a finite number'),
        ('reparameterize model', lambda c, t, x, p: tcnn.reparameterize('resnet50d'), TypeError,
         'model must be a torch.nn.Module, got str'),
        ('reparameterize stages', lambda c, t, x, p: tcnn.reparameterize(c, stages=1.5), ValueError,
         'stages must be None, a stage number'),
        ('reparameterize input_size', lambda c, t, x, p: tcnn.reparameterize(c, input_size=224), TypeError,
         'input_size must be 3 positive integers'),
        ('check_equivalence batch_size', lambda c, t, x, p: tcnn.check_equivalence(c, t, (3, 32, 32), batch_size=0),
         ValueError, 'batch_size must be >= 1, got 0'),
        ('check_equivalence input_size', lambda c, t, x, p: tcnn.check_equivalence(c, t, (3, -1, 4)), ValueError,
         'input_size must be >= 1, got -1'),
        ('check_equivalence device', lambda c, t, x, p: tcnn.check_equivalence(c, t, (3, 32, 32), device='tpu'),
         ValueError, "device 'tpu' is not a device"),
        ('check_equivalence dtype', lambda c, t, x, p: tcnn.check_equivalence(c, t, (3, 32, 32), dtype=torch.int64),
         TypeError, 'dtype must be a floating-point torch.dtype'),
        ('check_equivalence no GPSA', lambda c, t, x, p: tcnn.check_equivalence(c, c, (3, 32, 32)), TcnnError,
         't_cnn has no GPSA layer'),
        ('check_equivalence channels', lambda c, t, x, p: tcnn.check_equivalence(c, t, (1, 32, 32)), ValueError,
         'input_size (1, 32, 32) does not fit the model'),
        ('exact_configuration', lambda c, t, x, p: tcnn.exact_configuration(None).__enter__(), TypeError,
         'model must be a torch.nn.Module, got None'),
        ('gpsa_summary', lambda c, t, x, p: tcnn.gpsa_summary('x'), TypeError, 'model must be a torch.nn.Module'),
        ('attention_maps x', lambda c, t, x, p: heads.attention_maps(t, x[0]), ValueError,
         'x must be a float tensor of images (B, C, H, W), got shape (3, 32, 32)'),
        ('attention_maps query nan', lambda c, t, x, p: heads.attention_maps(t, x, (nan, 1)), ValueError,
         'query must be a finite number, got nan'),
        ('attention_maps query len', lambda c, t, x, p: heads.attention_maps(t, x, (1,)), TypeError,
         'query must be a (y, x) pixel'),
        ('nonlocality None', lambda c, t, x, p: heads.nonlocality(t, None), TypeError,
         'images must be a tensor of images'),
        ('image_data_config crop', lambda c, t, x, p: data_config(t, 32, nan), ValueError,
         'crop_pct must be a finite number'),
        ('image_data_config size', lambda c, t, x, p: data_config(t, 0), ValueError,
         'img_size must be >= 1'),
        ('find_images limit', lambda c, t, x, p: find_images(str(p), 0), ValueError,
         'limit must be >= 1'),
        ('load_images empty', lambda c, t, x, p: load_images([], {}), ValueError, 'paths is empty'),
        ('load_images str', lambda c, t, x, p: load_images('a.png', {}), TypeError,
         'paths must be a list of image paths'),
        ('denormalize', lambda c, t, x, p: denormalize(x, {}), ValueError,
         'data_config must hold the normalisation mean and std'),
        ('eval_data_config crop', lambda c, t, x, p: suites.eval_data_config(t, 'imagenet', 32, 2.0), ValueError,
         'crop_pct must be <= 1, got 2.0'),
        ('evaluate models', lambda c, t, x, p: scoring.evaluate([t], 'imagenet', str(p)), TypeError,
         'models must be a dict of name -> model'),
        ('evaluate batch_size', lambda c, t, x, p: scoring.evaluate({'t': t}, 'imagenet', str(p), batch_size=0),
         ValueError, 'batch_size must be >= 1'),
        ('evaluate device', lambda c, t, x, p: scoring.evaluate({'t': t}, 'imagenet', str(p), device='tpu'),
         ValueError, "device 'tpu' is not a device"),
        ('subset_wnids', lambda c, t, x, p: suites.subset_wnids('imagenet'), ValueError,
         "suite 'imagenet' has no class subset; choose from imagenet-a, imagenet-r"),
        ('num_outputs', lambda c, t, x, p: suites.num_outputs(None), TypeError, 'model must be a torch.nn.Module'),
        ('results_table', lambda c, t, x, p: tables.results_table({}), ValueError, 'report must be a tcnn eval report'),
        ('plot_summary format', lambda c, t, x, p: figures.plot_summary({}, str(p / 's.xyz')), TcnnError,
         'the extension must be one of'),
        ('plot_training_curves folder', lambda c, t, x, p: plots.plot_training_curves([], str(p)), TcnnError,
         'is a folder; give a file name'),
        ('plot_attention index', lambda c, t, x, p: figures.plot_attention(heads.attention_maps(t, x), x[0],
                                                                         str(p / 'a.png'), index=5),
         ValueError, 'index 5 is out of range: the maps hold 2 images'),
        ('plot_attention parts', lambda c, t, x, p: figures.plot_attention(heads.attention_maps(t, x), x[0],
                                                                         str(p / 'a.png'), parts=['x']),
         ValueError, 'parts must be a list of mixed, content, positional'),
        ('load_metrics', lambda c, t, x, p: plots.load_metrics(None), TypeError, 'path must be a run folder'),
        ('save model', lambda c, t, x, p: tcnn.save(None, str(p / 'm.pt')), TypeError,
         'model must be a torch.nn.Module, got None'),
        ('save data_config', lambda c, t, x, p: tcnn.save(t, str(p / 'm.pt'), data_config=5), TypeError,
         'data_config must be a dict or None'),
        ('load path', lambda c, t, x, p: tcnn.load(None), TypeError, 'path must be a file path'),
        ('load map_location', lambda c, t, x, p: tcnn.load(tcnn.save(t, str(p / 'm.pt')), map_location=5),
         TypeError, 'map_location must be a device name or torch.device, got int'),
        ('create_cnn name', lambda c, t, x, p: create_cnn(None), TypeError, 'name must be a model name'),
        ('create_cnn num_classes', lambda c, t, x, p: create_cnn('resnet18d', pretrained=False, num_classes=-1),
         ValueError, 'num_classes must be >= 0, got -1'),
    ]


@pytest.mark.parametrize('case', _api_cases(), ids=lambda case: case[0])
def test_api_arguments_raise_our_error_naming_the_argument(small, tmp_path, case):
    _, call, kind, message = case
    cnn, t_cnn, x = small
    with pytest.raises(kind) as info:
        call(cnn, t_cnn, x, tmp_path)
    assert isinstance(info.value, TcnnError) and message in str(info.value), repr(info.value)
    assert len(str(info.value).splitlines()) == 1
    assert not [p for p in tmp_path.iterdir() if p.suffix in ('.png', '.xyz')]  # nothing drawn before the check


def test_a_bad_input_size_leaves_the_model_unconverted():
    import timm
    import tcnn
    cnn = timm.create_model('resnet18d', num_classes=3)
    with pytest.raises(ValueError, match=r'input_size \(1, 32, 32\) does not fit the model'):
        tcnn.reparameterize_(cnn, input_size=(1, 32, 32))  # one channel for a 3-channel stem
    assert not tcnn.gpsa_layers(cnn) and not hasattr(cnn, 'tcnn_config')


def test_safetensors_on_an_unusable_device_is_not_called_corrupt(small, tmp_path):
    import tcnn
    path = tcnn.save(small[1], str(tmp_path / 't.safetensors'))
    with pytest.raises(TcnnError) as info:
        tcnn.load(path, map_location='cuda:99')  # no such device, with or without CUDA
    assert "onto map_location='cuda:99'" in str(info.value) and 'corrupt' not in str(info.value)


def test_convert_refuses_empty_safetensors_weights_in_one_line(tmp_path, capsys):
    weights = tmp_path / 'w.safetensors'
    weights.write_bytes(b'')
    assert main(['convert', 'resnet18d', '--weights', str(weights), '--out', str(tmp_path / 't.pt')]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'is empty (0 bytes)' in err[0], err


def test_write_results_checks_both_paths_before_writing(tmp_path):
    from tcnn.evaluation import tables
    report = {'format': 'tcnn-eval', 'version': 1, 'models': {'m': {}}, 'suites': {}}
    (tmp_path / 'blocker').write_text('a file')
    with pytest.raises(TcnnError, match='markdown_path'):
        tables.write_results(report, str(tmp_path / 'r.json'), str(tmp_path / 'blocker' / 'r.md'))
    assert not (tmp_path / 'r.json').exists()


# ---------------------------------------------------------------------------------------------- commands


@pytest.fixture()
def read_only(tmp_path, monkeypatch):
    """A folder nobody may write to (mode 555; as root, where the mode does not bind, ``os.access`` says so)."""
    folder = tmp_path / 'read_only'
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real_access = os.access
        monkeypatch.setattr(os, 'access', lambda p, mode, *a, **k: False if os.path.abspath(p) == str(folder)
                            and mode & os.W_OK else real_access(p, mode, *a, **k))
    yield folder
    folder.chmod(0o755)


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f'tcnn {command}: error:'), err
    return err[0]


@pytest.mark.parametrize('flags, message', [
    (['--out', 'READ_ONLY/r.json'], 'is not writable'),
    (['--crop-pct', 'nan'], '--crop-pct must be a finite number, got nan'),
    (['--crop-pct', '1.5'], '--crop-pct must be <= 1'),
    (['--img-size', '0'], '--img-size must be >= 1, got 0'),
    (['--batch-size', '0'], '--batch-size must be >= 1, got 0'),
    (['--workers', '-1'], '--workers must be >= 0, got -1'),
    (['--device', 'tpu'], "device 'tpu' is not a device"),
    (['--markdown', 'table.txt'], '--markdown'),
])
def test_eval_refuses_bad_flags_before_any_work(tmp_path, read_only, capsys, flags, message):
    # the data folder and model do not exist: an error about them would mean the flags were checked too late
    flags = [f.replace('READ_ONLY', str(read_only)) for f in flags]
    assert main(['eval', str(tmp_path / 'missing.pt'), '--suite', 'imagenet', '--data', str(tmp_path / 'nowhere'),
                 *flags]) == 2
    assert message in _one_line(capsys, 'eval')


@pytest.mark.parametrize('flags, message', [
    (['--query', 'nan,3'], '--query must be a finite number, got nan'),
    (['--max-images', '0'], '--max-images must be >= 1, got 0'),
    (['--batch-size', '0'], '--batch-size must be >= 1, got 0'),
    (['--img-size', '-5'], '--img-size must be >= 1, got -5'),
    (['--device', 'tpu'], "--device 'tpu' is not a device"),
])
def test_inspect_refuses_bad_flags_before_any_work(tmp_path, capsys, flags, message):
    out = tmp_path / 'fresh' / 'out'
    assert main(['inspect', str(tmp_path / 'missing.pt'), '--out', str(out), *flags]) == 2
    assert message in _one_line(capsys, 'inspect') and not (tmp_path / 'fresh').exists()


@pytest.mark.parametrize('command', [['inspect', 'MODEL', '--out', 'READ_ONLY/figures'],
                                     ['plot', 'RUN', '--out', 'READ_ONLY/curves.png'],
                                     ['convert', 'resnet18d', '--no-pretrained', '--out', 'READ_ONLY/t.pt'],
                                     ['publish', 'MODEL', '--out', 'READ_ONLY/hub']])
def test_commands_refuse_a_read_only_output_folder(tmp_path, read_only, capsys, command):
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'metrics.jsonl').write_text('{"epoch": 0, "val_top1": 1.0}\n')
    argv = [a.replace('READ_ONLY', str(read_only)).replace('MODEL', str(tmp_path / 'm.pt')).replace('RUN', str(run))
            for a in command]
    assert main(argv) == 2
    assert 'is not writable' in _one_line(capsys, command[0])
    assert os.listdir(read_only) == []
