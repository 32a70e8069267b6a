"""How a precision flow maps onto FSDP2, measured: step-0 mismatch of three trainers on one rollout
batch.

    .venv/bin/torchrun --standalone --nproc_per_node=1 scripts/fsdp_precision.py [key=value ...]

(1) today's single-process trainer (fp32 masters, autocast), (2) the suite's FSDP2 trainer
(fully_shard over fp32 shards, autocast inside: docs/distributed.md), (3) the other common mapping,
FSDP2's ``MixedPrecisionPolicy(param_dtype=<flow dtype>, reduce_dtype=fp32)`` without autocast,
whose forward also runs the residual stream, norms and softmax inputs in the low dtype. Same policy,
prompts, sampled tokens and sampler; only the trainer differs. Printed, never asserted.
"""

import copy
import sys

import torch
from rich.table import Table
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from suite import dist
from suite.console import make_console
from suite.numerics.engine import sequence_seeds
from suite.numerics.mismatch import mismatch_metrics
from suite.numerics.scoring import Batch, batch_tensors
from suite.rl import config, perfectible
from suite.rl.data import prepare_data
from suite.rl.policy import load_policy
from suite.rl.train import build_engines
from suite.tasks.registry import prompt_ids


def main(argv: list[str]) -> None:
    console = make_console()
    world = dist.init()
    table = Table("flow", "trainer", "k3 KL", "mean |dp|", "max |logp diff|", "trainer logits",
                  title=f"step-0 mismatch by FSDP2 mapping ({world.size} rank(s), {world.backend})")
    for precision in ("bf16", "fp16"):
        cfg = config.load(["tier=small", f"precision={precision}", *argv])
        model_dir, data_dir = prepare_data(cfg, console)
        items, _ = perfectible.load(data_dir, cfg.perfectible.max_prompts)
        model, tok = load_policy(model_dir)
        G = cfg.samples_per_prompt
        prompts = [prompt_ids(tok, it) for it in items[:cfg.prompts_per_step] for _ in range(G)]
        plain, engine, _ = build_engines(cfg, copy.deepcopy(model))
        engine.sync(plain.model.state_dict())
        roll = engine.generate(prompts, cfg.sampling.max_new_tokens, 1.0, 1.0,
                               sequence_seeds(cfg.seed, 1, list(range(cfg.prompts_per_step)), G))
        ids, attn = batch_tensors(roll.prompt_ids, roll.tokens, roll.mask)
        R = roll.tokens.shape[1]
        sharded, _, _ = build_engines(cfg, copy.deepcopy(model), world)

        alt = copy.deepcopy(model).float()
        mp = MixedPrecisionPolicy(param_dtype=plain.dtype, reduce_dtype=torch.float32)
        for layer in alt.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(alt, mp_policy=mp)

        def alt_logprobs():
            pos = (attn.cumsum(1) - 1).clamp(min=0)
            logits = alt(input_ids=ids, attention_mask=attn, position_ids=pos).logits
            lp = torch.log_softmax(logits[:, -R - 1:-1].float(),
                                   -1).gather(-1, roll.tokens[..., None])[..., 0]
            return lp, str(logits.dtype)

        with torch.no_grad():
            rows = {"single process, autocast": (plain.score(Batch(ids, attn, roll.tokens, 1.0))[0],
                                                 plain.observe()["logits"]),
                    "FSDP2 fp32 shards + autocast (the suite's)": (sharded.score(Batch(ids, attn,
                                                                                       roll.tokens,
                                                                                       1.0))[0],
                                                                   sharded.observe()["logits"]),
                    f"FSDP2 MixedPrecisionPolicy(param_dtype={precision})": alt_logprobs()}
        for name, (logp, dtype) in rows.items():
            m = mismatch_metrics(logp, roll.logprobs, roll.mask)
            table.add_row(precision, name, f"{m['mismatch/kl_k3']:.3e}",
                          f"{m['mismatch/prob_diff/mean']:.3e}",
                          f"{m['mismatch/logprob_diff/max']:.3e}", dtype)
    if world.main:
        console.print(table)
    dist.close(world)


if __name__ == "__main__":
    main(sys.argv[1:])
