"""What the suite does on the oldest torch it installs with (>= 2.6): the features newer torch
brings are refused with their version before any compute, never a crash at the first collective
(docs/install.md)."""

import pytest

from suite import dist
from suite.rl import config

SMOKE = ["tier=smoke", "steps=1"]


def test_sharded_training_without_fsdp2_sum_reduction_is_refused_naming_the_torch_it_needs(
        monkeypatch):
    # torch 2.6's FSDPModule has no set_force_sum_reduction_for_comms: the trainer died in _shard on
    # every rank.
    monkeypatch.setattr(dist, "fsdp_sums", lambda: False)
    with pytest.raises(ValueError, match=r"nproc=2 nnodes=1: sharded training needs torch >= 2.8"):
        config.load([*SMOKE, "nproc=2"])
    config.load([*SMOKE, "nproc=1"])  # one process never shards

