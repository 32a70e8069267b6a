"""The console every command prints to.

On a terminal, rich wraps to its width. Written to a pipe or a file (CI logs, ``| tee``, sweep
cell logs) nothing may be cut or wrapped mid-sentence: prose is printed as long lines (soft
wrap) and tables get a wide canvas.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPE_WIDTH = 240


class _ReaderMayLeave:
    """A stream that goes quiet, instead of raising, once its reader has gone: `suite run ... |
    head` must not turn a run into a failure at its next progress line (the run, not its printout,
    is what the command is for)."""

    def __init__(self, stream):
        self.stream, self.gone = stream, False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        # Python flushes sys.stdout again at exit; point it at /dev/null so that flush cannot fail
        # either.
        self.gone = True
        if self.stream is sys.stdout:
            sys.stdout = open(os.devnull, "w")

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def make_console(file=None) -> Console:
    tty = (file or sys.stdout).isatty()
    return Console(file=_ReaderMayLeave(file or sys.stdout), width=None if tty else PIPE_WIDTH,
                   soft_wrap=not tty)
