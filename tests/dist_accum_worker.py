"""Run under torchrun by tests/test_dist.py: one fp32 FSDP2 update of two micro-batches per rank,
once reduce-scattering after every micro-batch and once after the last only (defer_grad_sync). Each
rank counts the reduce-scatters and compares the two gradients with the bound of summing the same
four terms in two orders; it writes <out>/rank<N>.json."""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as tdist
from torch.distributed.fsdp import FSDPModule

from suite import dist
from suite.numerics.precision import resolve
from suite.numerics.scoring import Batch
from suite.numerics.trainer import Trainer, TrainerOptions
from suite.rl.policy import PolicySpec, build_model
from suite.rl.schema import OptimConfig

# FSDP2 calls reduce_scatter_single from torch 2.10 on (reduce_scatter_tensor forwards to it),
# reduce_scatter_tensor before
RS = "reduce_scatter_single" if hasattr(tdist, "reduce_scatter_single") else "reduce_scatter_tensor"


def main(out: Path) -> None:
    world = dist.init()
    calls = []
    real = getattr(tdist, RS)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(tdist, RS, counted)
    model = build_model(PolicySpec(hidden=32, layers=2, heads=2, kv_heads=1, mlp=64), vocab_size=20)
    # the same batch on every rank: each rank takes its half of the rows, in two micro-batches
    torch.manual_seed(0)
    ids = torch.randint(3, 20, (8, 6))
    rows = torch.arange(8).tensor_split(world.size)[world.rank]
    micro = rows.split(2)
    w = 1.0 / (world.size * len(micro))  # each micro-batch's share of the global loss

    def loss_of(trainer, r):
        logp, _, _ = trainer.score(Batch(ids[r], torch.ones_like(ids[r]), ids[r, -3:], 1.0))
        return -logp.mean(), {}

    grads, counts, losses = {}, {}, {}
    for defer in (False, True):
        trainer = Trainer(copy.deepcopy(model), resolve("fp32"), "native",
                          OptimConfig(lr=1e-3, grad_clip=1e9),
                          TrainerOptions(defer_grad_sync=defer), world=world)
        calls.clear()
        m = trainer.step([(lambda r=r: loss_of(trainer, r), w) for r in micro])
        counts[defer], losses[defer] = len(calls), m["loss/policy"]
        # grad_clip 1e9: clipping multiplies by exactly 1.0, so these are the gradients AdamW
        # consumed
        grads[defer] = {n: p.grad.full_tensor() for n, p in trainer.model.named_parameters()}
        units = sum(isinstance(x, FSDPModule) for x in trainer.model.modules())
    calls.clear()
    # one part after a deferred update: FSDP2 must sync again
    trainer.step(lambda: loss_of(trainer, rows))
    after = len(calls)

    # The four terms of every gradient entry: each (rank, micro-batch)'s gradient of its weighted
    # loss, from a plain model on the same weights and rows. sum |term| in float64 sizes the bound
    # below.
    plain = Trainer(copy.deepcopy(model), resolve("fp32"), "native", OptimConfig(lr=1e-3),
                    world=dist.World(device="cpu"))
    mass = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in plain.model.named_parameters()}
    for r_rows in torch.arange(8).tensor_split(world.size):
        for r in r_rows.split(2):
            plain.model.zero_grad(set_to_none=True)
            (loss_of(plain, r)[0] * w).backward()
            for n, p in plain.model.named_parameters():
                mass[n] += p.grad.double().abs()
    # Summing the same 4 floats as (t00 + t10) + (t01 + t11) (a reduce-scatter per micro-batch,
    # accumulated) or as (t00 + t01) + (t10 + t11) (accumulated unsharded, one reduce-scatter): in
    # both every term passes through two roundings, so each is within gamma_2 * sum|t| of the exact
    # sum (Higham 2002, Accuracy and Stability of Numerical Algorithms, Sec. 4.2), gamma_2 = 2u / (1
    # - 2u), u = 2^-24 for fp32; the two differ by at most twice that. Both runs compute each term
    # from the same weights and rows with the same kernels: only the association differs.
    u = torch.finfo(torch.float32).eps / 2
    gamma2 = 2 * u / (1 - 2 * u)
    excess = float("-inf")
    for n, a in grads[False].items():
        diff = (a.double() - grads[True][n].double()).abs()
        excess = max(excess, float((diff - 2 * gamma2 * mass[n]).max()))
    (out / f"rank{world.rank}.json").write_text(json.dumps({
        "units": units, "micro_batches": len(micro),
        "reduce_scatters": {"every": counts[False], "deferred": counts[True]}, "after": after,
        "loss_equal": losses[False] == losses[True], "excess": excess}))
    dist.close(world)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
