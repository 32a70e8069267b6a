"""The console every command prints to.

On a terminal, rich wraps to its width. Written to a pipe or a file (CI logs, ``| tee``, sweep
cell logs) nothing may be cut or wrapped mid-sentence: prose is printed as long lines (soft
wrap) and tables get a wide canvas.
"""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 240


def make_console(file=None) -> Console:
    tty = (file or sys.stdout).isatty()
    return Console(file=file, width=None if tty else PIPE_WIDTH, soft_wrap=not tty)
