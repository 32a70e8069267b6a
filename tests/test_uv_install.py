"""The set-up's uv installs (scripts/uv_install.py) take packages from where pip would."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("uv_install", REPO / "scripts" / "uv_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_environment_wins_over_the_install_section_over_global():
    listing = "\n".join([
        "global.find-links='/g/wheels'",
        "global.index-url='https://mirror.example/simple'",
        "install.find-links='/install/wheels'",
        ":env:.find-links='/env/a /env/b'",
        "download.extra-index-url='https://only-for-download.example'",  # not pip install's
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "global.no-index='true'",
        "global.cert='/etc/ssl/x.pem'",  # left to uv
    ])
    uv = _module()
    assert uv.uv_flags(listing) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--find-links", "/env/a", "--find-links", "/env/b",
        "--no-index",
    ]
    assert uv.uv_flags(listing, "https://download.pytorch.org/whl/cpu")[:2] == [
        "--index-url", "https://download.pytorch.org/whl/cpu"]
    assert uv.uv_flags("") == []


def test_it_reads_what_pip_itself_lists(tmp_path):
    """pip's own `pip config list` (its text, its sections) read back: a file and a variable."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = file:///x/simple\nconstraint = /c.txt\n"
                    "[install]\ntrusted-host = mirror.example\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), PIP_FIND_LINKS="/w1 /w2")
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], env=env,
                             capture_output=True, text=True, check=True).stdout
    flags = _module().uv_flags(listing)
    pairs = list(zip(flags[::2], flags[1::2]))
    for pair in [("--extra-index-url", "file:///x/simple"), ("--find-links", "/w1"),
                 ("--find-links", "/w2"), ("--constraint", "/c.txt"),
                 ("--allow-insecure-host", "mirror.example")]:
        assert pair in pairs, (pair, listing)
