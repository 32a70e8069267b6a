"""``python -m suite <command> ...``: the ``suite`` command (suite/cli.py), where the console script
is not on PATH or under ``torchrun -m suite``."""

import sys

from suite.cli import entry

sys.exit(entry())
