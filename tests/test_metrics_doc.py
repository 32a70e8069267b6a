"""docs/metrics.md is the metric table (suite/numerics/peers.py) as generated, and the table covers every metric."""

from __future__ import annotations

import torch

from suite.analysis import metrics_doc
from suite.numerics import peers
from suite.numerics.mismatch import METRIC_KEYS
from suite.rl.algos import CORRECTIONS, is_weights


def test_the_committed_doc_is_the_generated_one():
    assert metrics_doc.DOC.read_text() == metrics_doc.render(), "run: python -m suite.analysis.metrics_doc --write"
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
            assert key not in seen, f"{c.peer} {c.name} [{c.level}] under both {seen[key]} and {m.key}"
            seen[key] = m.key
