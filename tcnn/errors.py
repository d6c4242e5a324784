"""Errors meant for the user: the CLI prints them as one line (no traceback) and exits non-zero."""

__all__ = ['TcnnError']


class TcnnError(Exception):
    """A user mistake or an unmet precondition, with a message that names the fix."""
