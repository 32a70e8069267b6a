"""Shared fixtures: an isolated cache (the smoke policy is built once per session), offline HF."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
torch.set_num_threads(1)

# What tests/test_conformance.py ran against: {peer: "version (where it was imported from)"}, or
# {"": why nothing ran}. Printed at the end of the run (below), so a CI log shows the peer versions
# the conformance tests passed against; the summary is printed even under -q, which hides pytest's
# report header.
PEERS_RAN = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def peers_ran(request) -> dict:
    return request.config.stash.setdefault(PEERS_RAN, {})


def pytest_sessionfinish(session):
    # a pytest-xdist worker hands what it ran to the controller, which prints the summary
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["peers_ran"] = session.config.stash.get(PEERS_RAN, {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    ran = getattr(node, "workeroutput", {}).get("peers_ran", {})
    node.config.stash.setdefault(PEERS_RAN, {}).update(ran)


def pytest_terminal_summary(terminalreporter, config):
    ran = config.stash.get(PEERS_RAN, {})
    if "" in ran:
        terminalreporter.write_line(f"conformance peers: none ran: {ran['']}")
    elif ran:
        terminalreporter.write_line("conformance peers: "
                                    + ", ".join(f"{p} {v}" for p, v in ran.items()))


@pytest.fixture(scope="session", autouse=True)
def suite_cache(tmp_path_factory):
    """Policies and datasets built by tests live in one session-wide temporary cache, shared by the
    pytest-xdist workers of the session (the suite's build lock makes one of them build an entry
    while the others wait for it)."""
    shared = tmp_path_factory.getbasetemp().parent / "suite-cache"  # pytest-N/, the workers' parent
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    path = os.environ.get("SUITE_TEST_CACHE") or str(
        shared if worker else tmp_path_factory.mktemp("suite-cache"))
    old = os.environ.get("SUITE_CACHE")
    os.environ["SUITE_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("SUITE_CACHE", None)
    else:
        os.environ["SUITE_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_model():
    """A random (not warm-started) tiny Llama and the arith tokenizer: for numerics tests."""
    from suite.rl.policy import PolicySpec, build_model, build_tokenizer
    from suite.tasks.registry import get_task

    task = get_task("arith")
    tok = build_tokenizer(task.alphabet)
    model = build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=128),
                        vocab_size=len(tok))
    return model, tok, task


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, driven by Playwright (no browser download; see
    scripts/setup.sh)."""
    import shutil

    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        why = ("chromium is not installed (apt-get install chromium; "
               "CI=true bash scripts/test.sh installs it)")
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page whose console errors and page errors are collected in ``page.errors``."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()
