"""Bad files and output paths get one line naming the fix, before any work: the shared loader of user-named torch
files (``tcnn.io.load_torch_file``) and output-path checks (``tcnn.paths``) used by the commands."""
import os

import pytest
import torch

from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.io import load_torch_file
from tcnn.paths import check_output_dir, check_output_file, output_dir


class _Payload:
    """A pickled object whose loading would run code: must never be unpickled."""

    def __reduce__(self):
        return (os.system, ('echo pwned > /dev/null',))


@pytest.fixture()
def bad_files(tmp_path):
    files = {'empty': tmp_path / 'empty.pt', 'junk': tmp_path / 'junk.pt', 'pickle': tmp_path / 'pickle.pt',
             'folder': tmp_path / 'folder'}
    files['empty'].write_bytes(b'')
    files['junk'].write_bytes(b'GIF89a, random bytes, not a torch file\n' * 8)
    torch.save({'state_dict': {'w': torch.zeros(1)}, 'code': _Payload()}, files['pickle'])
    files['folder'].mkdir()
    return files


@pytest.mark.parametrize('kind, message', [
    ('empty', 'is empty (0 bytes)'),
    ('junk', 'is not a torch file'),
    ('pickle', 'never loads (unpickling can run code)'),
    ('folder', 'is a folder, not a file'),
])
def test_load_torch_file_one_line(bad_files, kind, message):
    with pytest.raises(TcnnError) as info:
        load_torch_file(str(bad_files[kind]), 'weights file')
    text = str(info.value)
    assert message in text and len(text.splitlines()) == 1 and 'weights_only=False' not in text, text


@pytest.mark.parametrize('kind, message', [('empty', 'is empty (0 bytes)'), ('pickle', 'never loads')])
def test_convert_weights_bad_file_is_one_line(bad_files, tmp_path, capsys, kind, message):
    out = tmp_path / 'out' / 't.pt'
    assert main(['convert', 'resnet18d', '--weights', str(bad_files[kind]), '--out', str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('tcnn convert: error:') and message in err[0], err
    assert 'weights_only=False' not in err[0] and not out.exists()


def test_output_checks(tmp_path):
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
