"""Atomic file writes: a temporary file in the destination folder, then ``os.replace``.

A crash, Ctrl-C or full disk mid-write leaves the previous file (or none), never a partial one.
"""
import contextlib
import os
import shutil
import tempfile
from typing import IO, Any, Callable, Iterator

__all__ = ['atomic_path', 'atomic_write', 'atomic_open', 'atomic_write_text', 'atomic_torch_save', 'atomic_copy']


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on normal exit it replaces ``path``, on an exception it is removed."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp', dir=folder)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_path)``, then move the temporary file over ``path``; returns ``path``."""
    with atomic_path(path) as tmp:
        write(tmp)
    return path


@contextlib.contextmanager
def atomic_open(path: str, mode: str = 'wb') -> Iterator[IO]:
    """``open()`` for writing whose content appears at ``path`` only once the ``with`` block completes."""
    with atomic_path(path) as tmp, open(tmp, mode, **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
        yield f


def atomic_write_text(path: str, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    with atomic_open(path, 'w') as f:
        f.write(text)
    return path


def atomic_torch_save(obj: Any, path: str) -> str:
    """``torch.save`` to ``path`` atomically; returns ``path``.

    torch.save is given an open file, not the temporary path: given a path, it names the archive's root folder after
    the file, here a random temporary name, so the same object would give other bytes on every save; given a file,
    the folder is always ``archive`` and the same object gives the same bytes (a checksum can name a file).
    """
    import torch  # here, not at the top: the CLI writes text files through this module before torch loads

    def write(tmp: str) -> None:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
    return atomic_write(path, write)


def atomic_copy(src: str, dst: str) -> str:
    """Copy ``src`` over ``dst`` atomically; returns ``dst``."""
    return atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))
