"""Run under torchrun by tests/test_dist.py: one FSDP2 trainer over every rank, an inf injected into
one rank's gradient shard. Each rank writes what it saw to <out>/rank<N>.json."""

import json
import sys
from pathlib import Path

import torch

from suite import dist
from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch
from suite.numerics.trainer import Trainer
from suite.rl.policy import PolicySpec, build_model
from suite.rl.schema import OptimConfig


def main(out: Path, inject_rank: int) -> None:
    world = dist.init()
    model = build_model(PolicySpec(hidden=32, layers=2, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    trainer = Trainer(model, resolve("fp16"), "emulated", OptimConfig(lr=1e-3), world=world)
    torch.manual_seed(0)  # the same batch on every rank: each rank takes its half of the rows
    ids = torch.randint(3, 20, (4, 6))
    rows = torch.arange(4).tensor_split(world.size)[world.rank]

    def loss_fn():
        logp, _, _ = trainer.score(Batch(ids[rows], torch.ones_like(ids[rows]), ids[rows, -3:],
                                         1.0))
        return -logp.mean() / world.size, {}

    real_unscale = trainer.scaler.unscale_

    def unscale_with_inf(params, w):
        # after the reduce-scatter: only this rank's shard holds the inf
        if world.rank == inject_rank:
            next(p for p in params if p.grad is not None).grad.to_local().view(-1)[0] = float("inf")
        return real_unscale(params, w)

    before = {n: p.to_local().clone() for n, p in trainer.model.named_parameters()}
    trainer.scaler.unscale_ = unscale_with_inf
    skipped = trainer.step([(loss_fn, 1.0)])
    unchanged = all(torch.equal(p.to_local(), before[n])
                    for n, p in trainer.model.named_parameters())
    scale_after_skip = trainer.scaler.scale
    trainer.scaler.unscale_ = real_unscale
    applied = trainer.step([(loss_fn, 1.0)])
    moved = any(not torch.equal(p.to_local(), before[n])
                for n, p in trainer.model.named_parameters())
    (out / f"rank{world.rank}.json").write_text(json.dumps({
        "skipped": skipped["train/skipped"], "grad_norm_skipped": str(skipped["train/grad_norm"]),
        "unchanged": unchanged, "scale_after_skip": scale_after_skip,
        "applied": applied["train/skipped"], "grad_norm": applied["train/grad_norm"],
        "moved": moved, "world": world.size}))
    dist.close(world)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
