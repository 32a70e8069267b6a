"""docs/metrics.md is the metric table (suite/numerics/peers.py) as generated, and the table covers
every metric."""

from __future__ import annotations

import torch

from suite.analysis import metrics_doc
from suite.numerics import peers
from suite.numerics.mismatch import METRIC_KEYS
from suite.rl.algos import CORRECTIONS, is_weights


def test_the_committed_doc_is_the_generated_one():
    assert metrics_doc.DOC.read_text() == metrics_doc.render(), (
        "run: python -m suite.analysis.metrics_doc --write")
    assert metrics_doc.main(["--check"]) == 0


def test_every_metric_the_code_logs_has_a_row_and_no_row_is_invented():
    lp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], dtype=torch.float64)
    is_keys = set()
    for correction in CORRECTIONS[1:]:
        is_keys |= set(is_weights(correction, lp, lp - 0.3, torch.ones(2, 2), 3.0)[1])
    keys = [m.key for m in peers.METRICS]
    assert keys[:len(METRIC_KEYS)] == list(METRIC_KEYS) and set(keys[len(METRIC_KEYS):]) == is_keys


def test_a_peer_name_is_claimed_by_at_most_one_suite_key_per_level():
    seen = {}
    for m in peers.METRICS:
        for c in m.counterparts:
            key = (c.peer, c.name, c.level)
            assert key not in seen, (f"{c.peer} {c.name} [{c.level}] under both {seen[key]} "
                                     f"and {m.key}")
            seen[key] = m.key


def test_no_module_writes_under_the_names_of_a_peer_the_table_says_it_writes_nothing_for():
    """docs/metrics.md says the suite writes nothing under TRL's, slime's, prime-rl's or Oat's names
    (their columns only point at the corresponding number): a module that logged one of their keys
    would need the peer's own number there, checked as verl's importer is, and a `Peer.written` line
    saying where."""
    from pathlib import Path

    silent = {p for p, peer in peers.PEERS.items() if not peer.written}
    assert silent >= {"slime", "prime-rl", "Oat"}  # no released code to check a number against
    names = {c.name for m in peers.METRICS for c in m.counterparts if c.peer in silent}
    root = Path(peers.__file__).resolve().parents[1]  # suite/
    for path in [*root.rglob("*.py"), *root.rglob("*.js")]:
        if path.name == "peers.py" and path.parent.name == "numerics":
            continue
        text = path.read_text()
        assert not [n for n in names
                    if n in text], f"{path} names {[n for n in names if n in text]}"
