"""What the exporters and runtimes print or raise, reduced to what a one-line error needs.

The exporters log progress and the tracebacks of fallbacks they recover from, the TorchScript exporter's C++ side
prints the whole graph when an op has no ONNX form, and the runtimes print their refusal of a wrong input; an export
reports all of that in one line instead (``error_line``).
"""
import contextlib
import logging
import os
import sys
from typing import Iterator, Sequence

__all__ = ['quiet_loggers', 'native_output_dropped', 'error_line']


@contextlib.contextmanager
def quiet_loggers(names: Sequence[str] = ('torch', 'onnxscript', 'onnx_ir')) -> Iterator[None]:
    """Silence the exporters' log records inside the block (progress, and tracebacks of fallbacks they recover from
    or that ``export`` reports in one line); the levels are restored after."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def native_output_dropped() -> Iterator[None]:
    """Drop what native code writes to file descriptors 1 and 2 inside the block (``sys.stdout`` redirection does not
    reach C++): the TorchScript exporter prints the whole graph when an op has no ONNX form, and the runtimes print
    their refusal of a wrong input, which ``export`` reports in one line instead. The descriptors are restored after."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        with open(os.devnull, 'wb') as sink:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def error_line(e: BaseException) -> str:
    """``Type: first line`` of an exporter's or runtime's exception (their messages run to pages of graph dumps)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return f'{type(e).__name__}: {lines[0] if lines else ""}'.rstrip(': ')
