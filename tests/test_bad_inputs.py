"""Bad files and output paths get one line naming the fix, before any work: the shared loader of user-named torch
files (``tcnn.io.load_torch_file``) and output-path checks (``tcnn.paths``) used by the commands."""
import os
import pickle

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
