"""The command line's surface, pinned: every subcommand, its --flags and the config fields its help
lists. A new command, flag or field fails this test until tests/fixtures/cli_surface.json is
regenerated on purpose:

    SUITE_WRITE_FIXTURES=1 python -m pytest tests/test_cli_surface.py

so that growth of the interface is a decision, reviewed in the fixture's diff."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from suite import cli

FIXTURE = Path(__file__).parent / "fixtures" / "cli_surface.json"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
FIELD = re.compile(r"^  ([a-z_][a-z0-9_.]*)=", re.M)


def surface(capsys) -> dict:
    out = {}
    for name in sorted(cli.COMMANDS):
        assert cli._dispatch([name, "--help"]) == 0, name
        text = capsys.readouterr().out
        out[name] = {"flags": sorted(set(FLAG.findall(text)) - {"--help"}),
                     "fields": sorted(set(FIELD.findall(text)))}
    return out


def test_the_command_line_is_what_the_fixture_pins(capsys):
    got = surface(capsys)
    if os.environ.get("SUITE_WRITE_FIXTURES"):
        FIXTURE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(FIXTURE.read_text())
    assert sorted(got) == sorted(want), ("commands added or removed: "
                                         "regenerate the fixture if on purpose")
    for name in want:
        assert got[name] == want[name], (f"suite {name}: its flags or fields changed; "
                                         "regenerate the fixture if on purpose")
