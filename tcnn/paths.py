"""Paths checked before any work: every command validates the files it reads and where it will write first, so a
mistake costs seconds, not a finished evaluation or training run, and a failed run leaves no empty folder it created.
Nothing here imports torch: the CLI runs these checks before the heavy imports."""
import contextlib
import os
import tempfile
from typing import Iterator, List, Optional, Sequence

from .errors import TcnnError

__all__ = ['HUB_PREFIXES', 'check_input_file', 'check_output_file', 'check_output_dir', 'check_replaceable_dir',
           'output_dir']

# How a Hugging Face Hub folder is named instead of a path (timm's prefixes): 'local-dir:PATH', 'hf-hub:ORG/NAME'
HUB_PREFIXES = ('local-dir:', 'hf-hub:')


def check_input_file(path: str, what: str = 'file') -> str:
    """``path`` if it is an existing, non-empty file; else a one-line error naming ``what`` (its role, e.g.
    ``'weights file'``): not found, a folder, empty (an interrupted copy)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TcnnError(f'{what} not found: {path}')
    if os.path.isdir(path):
        raise TcnnError(f'{what} {path} is a folder, not a file')
    if os.path.getsize(path) == 0:
        raise TcnnError(f'{what} {path} is empty (0 bytes): an interrupted copy or download?')
    return path


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _check_creatable(folder: str, what: str) -> None:
    """``folder`` exists as a writable folder, or can be created below its nearest existing ancestor."""
    existing = _nearest_existing(folder)
    if not os.path.isdir(existing):
        raise TcnnError(f'{what}: {existing} is a file, so {folder} cannot be a folder; choose another path')
    if not os.access(existing, os.W_OK | os.X_OK) or not _can_create_in(existing):
        raise TcnnError(f'{what}: {existing} is not writable; choose another path')


def _can_create_in(folder: str) -> bool:
    """Whether a file can be created in ``folder``, by trying: ``os.access`` answers yes to root everywhere, also in
    /proc, /sys or a read-only mount, where only the final write fails (after an export or a training run)."""
    try:
        fd, probe = tempfile.mkstemp(prefix='.tcnn-write-test-', dir=folder)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.remove(probe)
    return True


def check_output_file(path: str, what: str = '--out', suffixes: Optional[Sequence[str]] = None) -> str:
    """Check that ``path`` can be written as a file; returns it absolute.

    Args:
        path: The file to be written.
        what: The argument that named it, for messages.
        suffixes: Allowed extensions (lower case, with the dot), or None for any.
    """
    given = os.fspath(path)
    path = os.path.abspath(given)
    if os.path.isdir(path) or given.endswith(('/', os.sep)):  # 'out.onnx/': a folder was meant, or a typo
        raise TcnnError(f'{what} {given} is a folder; give a file name')
    if suffixes is not None and os.path.splitext(path)[1].lower() not in suffixes:
        raise TcnnError(f'{what} {path}: the extension must be one of {", ".join(suffixes)}')
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise TcnnError(f'{what} {path} exists and is not writable; choose another path')
    _check_creatable(os.path.dirname(path), what)
    return path


def check_output_dir(path: str, what: str = '--output') -> str:
    """Check that ``path`` is, or can become, a writable folder; returns it absolute."""
    path = os.path.abspath(str(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise TcnnError(f'{what} {path} is a file; give a folder')
    _check_creatable(path, what)
    return path


def check_replaceable_dir(path: str, marker: str, what: str = '--out') -> str:
    """Check that ``path`` may be written as a whole folder: missing, empty, or one that holds ``marker`` (written
    before by the same command, so it may be replaced); returns it absolute."""
    path = check_output_dir(path, what)
    if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(os.path.join(path, marker)):
        raise TcnnError(f'{what} {path} is a folder with other files (no {marker}): give a new or empty folder, or '
                        'one this command wrote before (it is replaced)')
    return path


@contextlib.contextmanager
def output_dir(path: str) -> Iterator[str]:
    """Create ``path`` (and its missing parents); if the block raises, remove the folders this call created that
    are still empty, then re-raise."""
    path = os.path.abspath(str(path))
    created: List[str] = []
    probe = path
    while not os.path.exists(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(path, exist_ok=True)
    try:
        yield path
    except BaseException:
        for folder in created:  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # fails, and is kept, when not empty
        raise
