"""Runs the released verl and TRL on the conformance cases, in a process of its own
(tests/test_conformance.py).

    python tests/peer_runner.py CASES.pt OUT.pt      # with the peers' directory first on PYTHONPATH

A separate process because importing verl imports ray and tensordict, which the suite's own tests
should never see. Nothing here re-implements a peer formula: verl's functions are called as
released, and TRL's importance-sampling code is the two `if self.use_vllm and
self.vllm_importance_sampling_correction:` blocks of `GRPOTrainer._generate_and_score_completions`,
taken from the installed source with `ast` and executed with the locals that method would hold (a
stand-in `self` carries only the settings those blocks read). CASES.pt: a list of dicts {name, old,
rollout, mask, C}; OUT.pt: one dict of results per case, plus "versions" {peer: (version, file)}.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import torch

TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TRL_TEST = "self.use_vllm and self.vllm_importance_sampling_correction"


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"}


def run_verl(case: dict) -> dict:
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import (
        compute_offpolicy_metrics,
        compute_rollout_correction_and_rejection_mask,
    )
    from verl.utils.debug.metrics import calculate_debug_metrics

    old, rollout, mask = case["old"], case["rollout"], case["mask"]
    out = {}
    try:
        metrics = compute_offpolicy_metrics(old, rollout, mask)
        out["offpolicy"] = {f"rollout_corr/{k}": float(v) for k, v in metrics.items()}
    except (AssertionError, ValueError) as e:
        out["offpolicy"] = _error(e)
    batch = DataProto.from_dict(tensors={"rollout_log_probs": rollout, "old_log_probs": old,
                                         "response_mask": mask,
                                         "responses": torch.zeros(mask.shape, dtype=torch.long)})
    out["debug"] = {k: float(v) for k, v in calculate_debug_metrics(batch).items()}
    for level in ("token", "sequence"):
        try:
            weights, _, metrics = compute_rollout_correction_and_rejection_mask(
                old, rollout, mask, rollout_is=level, rollout_is_threshold=case["C"])
            out[f"is_{level}"] = {"weights": weights.batch["rollout_is_weights"],
                                  "metrics": metrics}
        except (AssertionError, ValueError) as e:
            out[f"is_{level}"] = _error(e)
    return out


def trl_blocks():
    """The weights block and the metrics block of GRPOTrainer._generate_and_score_completions,
    compiled."""
    from trl.trainer import grpo_trainer

    method = grpo_trainer.GRPOTrainer._generate_and_score_completions
    lines, first = inspect.getsourcelines(method)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == TRL_TEST:
            head = node.body[0]
            target = ast.unparse(head.targets[0]) if isinstance(head, ast.Assign) else ""
            if target in ("mask", "delta"):
                ast.increment_lineno(node, first - 1)  # tracebacks point into TRL's file
                found[target] = compile(ast.Module(body=[node], type_ignores=[]),
                                        inspect.getsourcefile(method), "exec")
    if set(found) != {"mask", "delta"}:
        raise RuntimeError("TRL's importance-sampling blocks were not found in "
                           f"{method.__qualname__} (found {sorted(found)}): the TRL version "
                           "differs from the one pinned")
    return grpo_trainer, found["mask"], found["delta"]


def run_trl(case: dict, blocks) -> dict:
    module, weights_block, metrics_block = blocks
    out = {}
    for mode in TRL_MODES:
        self = SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                               vllm_importance_sampling_mode=mode,
                               vllm_importance_sampling_clip_max=case["C"],
                               vllm_importance_sampling_clip_min=None,
                               # one process
                               _metrics=defaultdict(lambda: defaultdict(list)),
                               accelerator=SimpleNamespace(gather=lambda t: t.reshape(1)))
        scope = {**vars(module), "self": self, "completion_mask": case["mask"], "tool_mask": None,
                 "old_per_token_logps": case["old"], "sampling_per_token_logps": case["rollout"],
                 "device": torch.device("cpu"), "mode": "train"}
        exec(weights_block, scope)
        exec(metrics_block, scope)
        out[mode] = {"weights": scope["vllm_importance_sampling_ratio"],
                     "metrics": {k: v[0] for k, v in self._metrics["train"].items()}}
    return out


def main(src: str, dst: str) -> None:
    import trl
    import verl

    cases = torch.load(src)
    blocks = trl_blocks()
    out = {"versions": {"verl": (verl.__version__, verl.__file__),
                        "TRL": (trl.__version__, trl.__file__)}}
    for case in cases:
        out[case["name"]] = {"verl": run_verl(case), "TRL": run_trl(case, blocks)}
    torch.save(out, dst)


if __name__ == "__main__":
    main(*sys.argv[1:])
