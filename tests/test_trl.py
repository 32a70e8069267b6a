"""TRL's GRPOTrainer writing the suite's bundle (suite/experiments/trl_bridge.py), for real: a bf16
run of two rounds on a tiny Llama, whose evidence is compared with both engines recomputed
independently (so that the sampler's log-probs stored where the trainer's belong, or the reverse,
fails), and the precision label taken from what ran rather than from what was asked."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch

# TRL is imported at the first test that needs it, not when pytest collects this file: importing it
# takes ~10 s, which every test worker would otherwise pay before running anything.
if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL is not installed (the trl extra: pip install 'lowprec-rl-suite[trl]')",
                allow_module_level=True)

from safetensors.torch import load  # noqa: E402

from suite.analysis import leaderboard  # noqa: E402
from suite.numerics.engine import eos_ids  # noqa: E402
from suite.rl import config  # noqa: E402


def _bridge():
    """suite.experiments.trl_bridge, which imports trl without letting it change the process's
    VLLM_LOGGING_LEVEL (it re-exports trl and GRPOConfig)."""
    from suite.experiments import trl_bridge

    return trl_bridge


def _args(tmp_path, bf16: bool, **kw):
    return _bridge().GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, report_to=[],
                      save_strategy="no", disable_tqdm=True, bf16=bf16, max_steps=4,
                      per_device_train_batch_size=8, steps_per_generation=2, num_generations=4,
                      max_completion_length=12, learning_rate=1e-3, seed=0, **kw)


def _trainer(tmp_path, tiny_model, bf16: bool = True, precision: str | None = "bf16", **kw):
    model, tok, task = tiny_model
    meta = {"task": task.name, "seed": 0, "model": "tiny random Llama",
            **({"precision": precision} if precision else {})}
    return _bridge().BundleGRPOTrainer(
        model=copy.deepcopy(model), processing_class=tok, args=_args(tmp_path, bf16, **kw),
        reward_funcs=_bridge().task_reward(task, eos_ids(model.config)),
        train_dataset=_bridge().task_dataset(task.split("train", 16)), bundle_out=tmp_path / "out",
        bundle_meta=meta)


def _references(model, ev):
    """Both engines recomputed from the stored tokens at the step's parameters (the initial policy),
    under the bf16 autocast TRL ran with: the trainer as one full-sequence forward, the sampler as
    generate runs it, the prompt at once and then one token at a time through the KV cache."""
    prompt, pmask = ev["prompt_ids"], ev["prompt_mask"]
    comp, mask = ev["completion_ids"], ev["mask"].long()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.cat([prompt, comp], 1),
                       attention_mask=torch.cat([pmask, mask], 1)).logits
        trainer_logp = torch.log_softmax(logits[:, prompt.shape[1] - 1:-1].float(), -1)
        trainer = trainer_logp.gather(-1, comp[..., None])[..., 0]
        out = model(prompt, attention_mask=pmask, use_cache=True)
        steps, attn = [out.logits[:, -1]], pmask
        for t in range(comp.shape[1] - 1):
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
            out = model(comp[:, t:t + 1], attention_mask=attn, past_key_values=out.past_key_values,
                        use_cache=True)
            steps.append(out.logits[:, -1])
        sampler = torch.log_softmax(torch.stack(steps, 1).float(),
                                    -1).gather(-1, comp[..., None])[..., 0]
    return trainer, sampler


def test_each_engine_is_recorded_on_its_own_side(tmp_path, tiny_model):
    trainer = _trainer(tmp_path, tiny_model)
    trainer.train()
    d = trainer.bundle_dir
    assert d.name == "arith__trl_dapo__bf16__s0"  # no algorithm given: TRL's loss type
    ev = load((d / "logprobs" / "step_000001.safetensors").read_bytes())
    ref_trainer, ref_sampler = _references(tiny_model[0], ev)
    m = ev["mask"].bool()

    def dist(a, b):
        return float((a - b)[m].abs().max())

    # Each side matches its own engine's recomputation far better than the other engine's. A swap in
    # the bridge puts the KV-cache decode's numbers in the trainer's place and fails both lines.
    assert dist(ev["trainer_logp"], ref_trainer) * 10 < dist(ev["sampler_logp"], ref_trainer)
    assert dist(ev["sampler_logp"], ref_sampler) * 10 < dist(ev["trainer_logp"], ref_sampler)
    assert dist(ev["sampler_logp"], ev["trainer_logp"]) > 0  # bf16: the two engines do differ

    env = json.loads((d / "env.json").read_text())
    assert (env["observed"]["sampler"]["compute_dtype"]
            == env["observed"]["trainer"]["compute_dtype"] == "torch.bfloat16")
    # autocast over fp32 weights
    assert env["observed"]["sampler"]["compute_weights"] == "torch.float32"
    assert (env["framework"] == {"name": "trl", "version": _bridge().trl.__version__}
            and env["packages"]["trl"] == _bridge().trl.__version__)
    cfg = json.loads((d / "config.json").read_text())["config"]
    assert (cfg["steps"] == 2 and cfg["recipe"]["loss_type"] == "dapo"
            and cfg["recipe"]["bf16"] is True)
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and [r["trl/global_step"] for r in rows] == [0, 2]
    # 16 completions a round = 4 prompts x 4 generations
    assert len(rows[0]["reward/pass_rates"]) == 4
    rec = leaderboard.validate_run(d)  # recomputed from the evidence, as for any outside bundle
    assert rec["framework"] == f"trl {_bridge().trl.__version__}" and rec["precision"] == "bf16"
    assert json.loads((d / "summary.json").read_text())["steps_done"] == 2


def test_the_label_is_what_ran_not_what_was_asked(tmp_path, tiny_model):
    trainer = _trainer(tmp_path, tiny_model, bf16=False, precision="bf16")
    with pytest.raises(ValueError, match="meant to be bf16, but the sampler was observed computing "
                                         "in torch.float32"):
        trainer.train()
    trainer = _trainer(tmp_path, tiny_model, bf16=False, precision=None)
    trainer.train()
    assert trainer.bundle_dir.name == "arith__trl_dapo__fp32__s0"


def test_truncated_sampling_is_refused(tmp_path, tiny_model):
    with pytest.raises(ValueError, match="top_k, top_p < 1"):
        _trainer(tmp_path, tiny_model, top_p=0.9)


def test_the_suite_recipe_in_trl_names():
    # 16 prompts x 8 samples, 2 updates per step, 100 steps
    cfg = config.load(["tier=small", "precision=bf16"])
    a = _bridge().grpo_args(cfg, "/unused")
    assert (a.per_device_train_batch_size, a.steps_per_generation, a.num_generations,
            a.max_steps) == (64, 2, 8, 200)
    assert (a.loss_type, a.scale_rewards, a.epsilon, a.epsilon_high,
            a.beta) == ("dr_grpo", "none", 0.2, 0.28, 0.0)
    assert (a.bf16, a.fp16, a.learning_rate, a.adam_beta2,
            a.max_completion_length) == (True, False, 1e-4, 0.95, 40)
    with pytest.raises(ValueError, match="precision: bf16_fp8rollout cannot be run"):
        _bridge().grpo_args(config.load(["tier=small", "precision=bf16_fp8rollout"]), "/unused")
    with pytest.raises(ValueError, match="algorithm: pg_seq_is has no GRPOTrainer equivalent"):
        _bridge().grpo_args(config.load(["tier=small", "algorithm=pg_seq_is"]), "/unused")


def test_flow_of_observed_dtypes():
    assert _bridge().flow_of("torch.float32", "torch.float32") == "fp32"
    assert _bridge().flow_of("torch.bfloat16", "torch.bfloat16") == "bf16"
    assert _bridge().flow_of("torch.float32", "torch.bfloat16") == "bf16_fp32rollout"
    # no flow samples lower than it trains
    assert _bridge().flow_of("torch.bfloat16", "torch.float32") is None
