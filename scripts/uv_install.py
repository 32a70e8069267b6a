"""`uv pip install` into this Python's environment with pip's configuration (scripts/setup.sh).

uv (https://docs.astral.sh/uv/pip/compatibility/) reads neither pip.conf nor the PIP_* variables,
so where pip points at a mirror, a local wheel directory or a constraints file, uv would resolve
against PyPI alone. This passes on what decides where packages come from and which versions may:
index-url, extra-index-url, find-links, no-index, constraint and trusted-host. Precedence is pip's:
an environment variable (`:env:`) over the `install` section over `global`; within one section
`pip config list` already shows the file that wins. The rest of pip's configuration (a certificate,
a proxy, timeouts) is left to uv's defaults; where that makes uv fail, the set-up uses pip.

It also passes scripts/uv-constraints.txt and scripts/uv-excludes.txt (why: in each file) and
--index-strategy unsafe-best-match, which takes the best version over all indexes, as pip does (uv's
default stops at the first index that has the package).

    .venv/bin/python scripts/uv_install.py [--index-url URL] REQUIREMENT...  # URL: the index
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

_LINE = re.compile(r"^(?P<section>[^.]+)\.(?P<key>[\w-]+)='(?P<value>.*)'$")
# pip: the environment over the section of the command over global
_RANK = {":env:": 2, "install": 1, "global": 0}
_FLAGS = {  # pip's key -> uv's flag, taking a whitespace-separated list of values
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
_TRUE = {"1", "true", "yes", "on"}


def settings(listing: str) -> dict[str, str]:
    """The value pip uses for each key, from the text of `pip config list`."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        match = _LINE.match(line.strip())
        if match is None or match["section"] not in _RANK:
            continue  # another command's section (pip download, ...) does not apply to install
        rank = _RANK[match["section"]]
        if rank >= found.get(match["key"], (-1, ""))[0]:
            found[match["key"]] = (rank, match["value"])
    return {key: value for key, (_, value) in found.items()}


def uv_flags(listing: str, index_url: str | None = None) -> list[str]:
    """uv's flags for what pip is configured with; `index_url`, when given, replaces the index."""
    config = settings(listing)
    if index_url is not None:
        config["index-url"] = index_url
    flags: list[str] = []
    for key, flag in _FLAGS.items():
        for value in config.get(key, "").split():
            flags += [flag, value]
    if config.get("no-index", "").lower() in _TRUE:
        flags.append("--no-index")
    return flags


def main(argv: list[str]) -> int:
    index_url = None
    if argv[:1] == ["--index-url"] and len(argv) > 1:
        index_url, argv = argv[1], argv[2:]
    if not argv:
        print("usage: " + __doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, check=True).stdout
    here = Path(__file__).parent
    uv = Path(sys.executable).parent / "uv"  # pip put uv's binary beside the environment's python
    command = [str(uv), "pip", "install", "-q", "--python", sys.executable,
               "--index-strategy", "unsafe-best-match",
               "--constraint", str(here / "uv-constraints.txt"),
               "--excludes", str(here / "uv-excludes.txt"), *uv_flags(listing, index_url), *argv]
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
