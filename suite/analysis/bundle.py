"""The run bundle for RL loops outside the suite: write it from TRL, verl or your own loop, and
the suite's verdict, mismatch metrics, report and leaderboard row follow (docs/bundle.md).

A bundle is the directory the suite's own loop writes (suite/results.py): ``config.json``,
``metrics.jsonl``, ``timing.jsonl``, ``summary.json``, ``env.json``. An outside loop adds two
things the suite's runs do not need, because nothing can rerun them with ``suite run``:

- **the framework** that ran it, ``env.json: framework = {name, version}``, shown as a column and
  a filter of the leaderboard;
- **the evidence behind every mismatch number**. The writer computes the mismatch metrics and
  their anatomy with the very functions of the suite's loop (``suite.numerics.mismatch``), so
  numbers are comparable by construction, and keeps each step's per-token log-probs in
  ``logprobs/step_NNNNNN.safetensors``; the leaderboard recomputes every ``mismatch/*``,
  ``anatomy/*`` and ``logprob/*`` value from them (``check``). Numbers an importer copied from a
  framework's own logs (suite/experiments/verl_import.py) are marked ``copied`` and checked against
  the original log kept in ``source/``. A number that is neither is a claim the bundle cannot back:
  the bundle is rejected with that reason.

Writing one, from any loop (tensors are (B, T) over the response tokens; row b of the batch is
response b % group_size of prompt b // group_size)::

    from suite.analysis import bundle
    run = bundle.open_run("runs/mine", task="arith3", algorithm="grpo", precision="bf16", seed=0,
                          steps=100, framework=("mylib", "0.3.1"), recipe={"lr": 1e-4})
    for step in range(100):
        ...  # sample; score; trainer log-probs of the same tokens at the same parameters
        run.log_step(trainer_logp, sampler_logp, mask, rewards=rewards, group_size=8,
        entropy=entropy) ... # update
    run.close()

Evidence is stored losslessly (safetensors: no pickle, so checking a bundle from a stranger runs
no code of theirs). Its size is about 9 bytes per response token with fp32 log-probs, 13 with the
entropy: 4 MB per step for 64 prompts x 8 responses x 8k tokens.
"""

from __future__ import annotations

import hashlib
import math
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from suite.numerics import machine
from suite.numerics.mismatch import mismatch_anatomy, mismatch_metrics
from suite.numerics.precision import resolve
from suite.results import (
    RUN_FILES,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    config_hash,
    read_jsonl,
    run_dir_name,
    write_summary,
)
from suite.rl.env_record import env_info

# version of the outside-loop fields (env.json "framework" and "bundle"); docs/bundle.md
BUNDLE_SCHEMA = 1
KNOWN_BUNDLE_SCHEMAS = (BUNDLE_SCHEMA,)
SUITE = "suite"  # framework name of the suite's own runs (their env.json has no "framework")
EVIDENCE_DIR = "logprobs"
SOURCE_DIR = "source"
# Namespaces whose values must be backed (recomputed from evidence, or copied from a source log):
# the numbers the report and the leaderboard compare across frameworks.
BACKED_PREFIXES = ("mismatch/", "anatomy/", "logprob/")
EVIDENCE_KEYS = ("trainer_logp", "sampler_logp", "mask")


# ---- what one step's log-probs give ----------------------------------------------------------
def step_metrics(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                 entropy: torch.Tensor | None = None) -> dict[str, float]:
    """Everything the suite computes from one step's per-token log-probs, as the writer logs it and
    as ``check`` recomputes it from the evidence: ``suite.numerics.mismatch`` metrics (and their
    anatomy when the trainer's entropy is given), the mean log-prob each engine gave the sampled
    tokens, response lengths, and the mean entropy. All (B, T); ``mask`` is 1 on response tokens."""
    m = mask.bool()
    n = int(m.sum())
    lengths = m.sum(1).double()  # (B,)

    def masked_mean(x: torch.Tensor) -> float:
        return float(x.detach().double()[m].mean()) if n else math.nan

    out = {**mismatch_metrics(trainer_logp, sampler_logp, mask),
           # Per-engine statistics of the sampled tokens: the sampler's mean log-prob is the
           # negative log-perplexity of its own samples; a swap of the two inputs shows up here
           # first.
           "logprob/trainer/mean": masked_mean(trainer_logp),
           "logprob/sampler/mean": masked_mean(sampler_logp),
           "response/length/mean": float(lengths.mean()),
           "response/length/max": float(lengths.max())}
    if entropy is not None:
        out.update(mismatch_anatomy(trainer_logp, sampler_logp, mask, entropy))
        out["entropy/mean"] = masked_mean(entropy)
    return out


def reward_metrics(rewards: torch.Tensor, group_size: int) -> dict:
    """reward/mean (the training accuracy the verdict reads) and per-prompt pass rates, as the
    suite's loop logs them. ``rewards`` (B,) with B = prompts x group_size, each prompt's responses
    adjacent."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size={group_size} must divide the {rewards.numel()} rewards of "
                         "the step")
    rates = rewards.view(-1, group_size).mean(1)
    return {"reward/mean": float(rewards.mean()),
            "reward/pass_rates": [round(float(r), 6) for r in rates],
            "reward/all_solved_frac": float((rates == 1).double().mean()),
            "reward/none_solved_frac": float((rates == 0).double().mean())}


# ---- the writer --------------------------------------------------------------------------------
def open_run(out, *, task: str, algorithm: str, precision: str, seed: int, steps: int, framework,
             recipe: dict | None = None, threshold: float = 0.95, tier: str | None = None,
             model: str | None = None, policy: dict | None = None, lm_head_fp32: bool = False,
             observed: dict | None = None, env_extra: dict | None = None,
             command: str | None = None, t0: float | None = None) -> Bundle:
    """Start the bundle ``<out>/<task>__<algorithm>__<precision>__s<seed>/`` of an outside loop.

    framework: ``(name, version)`` of the loop that trains (not "suite"). precision: a flow of
    suite/numerics/precision.py naming both engines' compute dtypes; when ``observed`` gives them
    (``{"sampler": {"compute_dtype": "torch.bfloat16", ...}, "trainer": {...}}``) the leaderboard
    checks that the label agrees. recipe: the loop's own settings, kept verbatim in config.json.
    command: how the run was started (default: this process's command line). t0: the
    ``time.perf_counter()`` at which the first step started (default: now), so that the steps'
    ``time/step_s`` add up to the loop's wall time.
    """
    config = run_config(task=task, algorithm=algorithm, precision=precision, seed=seed, steps=steps,
                        framework=framework, recipe=recipe, threshold=threshold, tier=tier,
                        model=model, policy=policy, lm_head_fp32=lm_head_fp32)
    flow, observed = resolve(precision), observed or {}
    seen = [bool((observed.get(side) or {}).get("compute_dtype"))
            for side in ("sampler", "trainer")]
    env = env_info({
        "framework": config["framework"],
        "bundle": {"schema": BUNDLE_SCHEMA, "writer": "suite.bundle", "evidence": EVIDENCE_DIR,
                   "recomputed": [], "copied": {}, "source_log": None, "command": command
                   or shlex.join([sys.executable, *sys.argv]),
                   "precision": "observed" if all(seen) else "partly observed" if any(seen)
                   else "declared"},
        # outside loops run torch's own kernels, never the emulation
        "machine_class": machine.describe("native"),
        "precision": flow.describe(), "lm_head_fp32": lm_head_fp32,
        "sampler_dtype": (observed.get("sampler") or {}).get("compute_dtype"),
        "trainer_compute_dtype": (observed.get("trainer") or {}).get("compute_dtype"),
        "observed": observed, **(env_extra or {}),
    })
    name = config["framework"]["name"]
    # the framework's installed version, next to what the caller says it is (check() compares them)
    try:
        env["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
    return Bundle(write_head(out, config, env), config, env, t0)


def run_config(*, task: str, algorithm: str, precision: str, seed: int, steps: int, framework,
               recipe: dict | None = None, threshold: float = 0.95, tier: str | None = None,
               model: str | None = None, policy: dict | None = None,
               lm_head_fp32: bool = False) -> dict:
    """config.json's config of an outside run, validated: what the report and the leaderboard group
    and label by (task, algorithm, precision flow, seed, model), the verdict's budget (steps,
    threshold), and the loop's recipe."""
    name, version = (framework["name"],
                     framework["version"]) if isinstance(framework, dict) else framework
    if not name or name == SUITE or not version:
        raise ValueError(f"framework: ({name!r}, {version!r}) must name the outside loop and its "
                         "version")
    resolve(precision)
    run_dir_name(task, algorithm, precision, seed)  # the names must make a run directory
    if not 0.0 < threshold <= 1.0 or isinstance(steps,
                                                bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"threshold={threshold} must be in (0, 1] and steps={steps!r} an int >= 1")
    return {"task": task, "algorithm": algorithm, "precision": precision, "seed": seed,
            "steps": steps, "threshold": threshold, "tier": tier, "model": model, "policy": policy,
            "lm_head_fp32": lm_head_fp32, "framework": {"name": str(name), "version": str(version)},
            "recipe": recipe or {}}


def write_head(out, config: dict, env: dict) -> Path:
    """Create ``<out>/<task>__<algorithm>__<precision>__s<seed>/`` with config.json (and its hash)
    and env.json; a directory that already holds a bundle is refused (writers and importers do not
    resume)."""
    run_dir = Path(out) / run_dir_name(config["task"], config["algorithm"], config["precision"],
                                       config["seed"])
    if any((run_dir / f).exists() for f in RUN_FILES):
        raise ValueError(f"{run_dir} already holds a bundle; choose another out, or delete it")
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "config.json",
                      {"config_hash": config_hash(config), "config": config})
    atomic_write_json(run_dir / "env.json", env)
    return run_dir


class Bundle:
    """One outside run being written: its directory, the step counter and the clock between
    steps."""

    def __init__(self, run_dir: Path, config: dict, env: dict, t0: float | None = None):
        self.run_dir, self.config, self.env = Path(run_dir), config, env
        self.step = 0
        # time/step_s runs from one log_step to the next (the first: from t0; the last: to close)
        self._last = time.perf_counter() if t0 is None else t0
        # timing row of the last step, finished at the next log_step or close
        self._pending: dict | None = None

    def log_step(self, trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                 *, rewards, group_size: int, entropy: torch.Tensor | None = None,
                 tokens: dict | None = None, extra: dict | None = None,
                 timing: dict | None = None) -> dict:
        """Log one RL step: per-token log-probs of the sampled response tokens under the trainer and
        the sampler at the same parameters (before the update), the response mask, the rewards; the
        trainer's entropy for the anatomy. ``tokens`` (optional int tensors such as prompt_ids,
        completion_ids) are kept with the evidence so that a third party can re-score the step;
        ``extra`` adds numbers the loop reports (grad norm, loss, ...); ``timing`` adds time/* keys.
        Returns the metrics row."""
        trainer_logp, sampler_logp = trainer_logp.detach().cpu(), sampler_logp.detach().cpu()
        mask = mask.detach().cpu()
        if not (trainer_logp.dim() == 2 and trainer_logp.shape == sampler_logp.shape == mask.shape):
            raise ValueError(f"log_step: trainer_logp {tuple(trainer_logp.shape)}, sampler_logp "
                             f"{tuple(sampler_logp.shape)} and mask {tuple(mask.shape)} must be "
                             "the same (B, T)")
        self.step += 1
        row = {"step": self.step, **step_metrics(trainer_logp, sampler_logp, mask, entropy),
               **reward_metrics(rewards, group_size)}
        for key, value in (extra or {}).items():
            if key in row or key.startswith(BACKED_PREFIXES):
                raise ValueError(f"log_step: extra key {key!r} is computed by the writer (or "
                                 "reserved for it)")
            row[key] = value
        ev = {"trainer_logp": trainer_logp.contiguous(), "sampler_logp": sampler_logp.contiguous(),
              "mask": mask.bool().to(torch.uint8).contiguous()}
        if entropy is not None:
            ev["entropy"] = entropy.detach().cpu().float().contiguous()
        ev.update({k: v.detach().cpu().contiguous() for k, v in (tokens or {}).items()})
        from safetensors.torch import save

        atomic_write_bytes(self.run_dir / EVIDENCE_DIR / f"step_{self.step:06d}.safetensors",
                           save(ev))
        if self.step == 1:  # the keys this bundle claims as recomputed, now that they are known
            self.env["bundle"]["recomputed"] = sorted(k for k in row
                                                      if k.startswith(BACKED_PREFIXES))
            atomic_write_json(self.run_dir / "env.json", self.env)
        self._finish_timing()
        append_jsonl(self.run_dir / "metrics.jsonl", row)
        self._pending = {"step": self.step, **(timing or {})}
        return row

    def _finish_timing(self) -> None:
        now = time.perf_counter()
        if self._pending is not None:
            append_jsonl(self.run_dir / "timing.jsonl",
                         {**self._pending, "time/step_s": now - self._last})
            self._pending = None
        self._last = now

    def close(self, error: str | None = None) -> dict:
        """Finish the timing of the last step and write summary.json (verdict included); returns
        it."""
        self._finish_timing()
        return write_summary(self.run_dir, self.config, error)


# ---- the check -----------------------------------------------------------------------------------
def framework_of(env: dict | None) -> dict:
    """{name, version} of the loop that produced a bundle; the suite's own runs record none."""
    fw = (env or {}).get("framework")
    if isinstance(fw, dict):
        return {"name": fw.get("name"), "version": fw.get("version")}
    return {"name": SUITE, "version": str((env or {}).get("git_sha") or "")[:12] or None}


def framework_label(env: dict | None) -> str:
    fw = framework_of(env)
    return f"{fw['name']} {fw['version']}" if fw["version"] else str(fw["name"])


def _close(a, b) -> bool:
    """Equal up to float summation order (1e-9 relative), NaN equal to NaN; recomputation runs the
    same float64 code on the same stored values, so anything larger is a different number."""
    if isinstance(a, bool) or isinstance(b,
                                         bool) or not isinstance(a, (int, float)) or not isinstance(
                                             b, (int, float)):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def read_evidence(path: Path) -> dict[str, torch.Tensor]:
    """One step's evidence, shape-checked; ValueError naming the file when it is not usable."""
    from safetensors.torch import load

    try:
        ev = load(path.read_bytes())
    except Exception as e:  # noqa: BLE001 -- a corrupt or foreign file, whatever safetensors raises
        raise ValueError(f"{path.parent.name}/{path.name} is not a safetensors file "
                         f"({type(e).__name__})") from None
    missing = [k for k in EVIDENCE_KEYS if k not in ev]
    shape = ev.get("mask", torch.empty(0)).shape
    if missing or len(shape) != 2 or any(ev[k].shape != shape for k in EVIDENCE_KEYS
                                         if k in ev) or (
            "entropy" in ev and ev["entropy"].shape != shape):
        raise ValueError(f"{path.parent.name}/{path.name}: needs trainer_logp, sampler_logp, mask "
                         f"(and entropy) of one (B, T) shape (missing {missing or 'none'})")
    return ev


def read_source_log(path: Path) -> dict[int, dict]:
    """A framework's own per-step log as {step: {metric: value}}: JSONL rows either flat
    ({"step": 3, "actor/entropy": ...}) or nested as verl's file logger writes them
    ({"step": 3, "data": {...}}). Rows of one step are merged (later keys win)."""
    out: dict[int, dict] = {}
    for n, row in enumerate(read_jsonl(path), start=1):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"{path.name}: row {n} has no integer 'step'")
        data = row["data"] if isinstance(row.get("data"),
                                         dict) else {k: v for k, v in row.items() if k != "step"}
        out.setdefault(step, {}).update(data)
    return out


def check(run_dir: Path, cfg: dict, env: dict, rows: list[dict]) -> dict:
    """Validate an outside bundle beyond what every bundle passes (schema, summary recomputed from
    the rows): its framework, its command, the precision label against the observed dtypes, and
    every backed number against its evidence or its source log. Returns what the leaderboard shows;
    ValueError with the first reason otherwise."""
    run_dir = Path(run_dir)
    fw, meta = framework_of(env), env.get("bundle")
    if not isinstance(meta, dict) or meta.get("schema") not in KNOWN_BUNDLE_SCHEMAS:
        raise ValueError("env.json: bundle schema "
                         f"{(meta or {}).get('schema') if isinstance(meta, dict) else None!r} "
                         f"unknown (this suite reads {KNOWN_BUNDLE_SCHEMAS})")
    if not fw["name"] or fw["name"] == SUITE or not isinstance(fw["version"], str) or not fw[
        "version"]:
        raise ValueError(f"env.json: framework {fw} must name the outside loop and its version")
    if cfg.get("framework") != env.get("framework"):
        raise ValueError(f"config.json: framework {cfg.get('framework')} but env.json says "
                         f"{env.get('framework')}")
    installed = (env.get("packages") or {}).get(fw["name"])
    if installed is not None and installed != fw["version"]:
        raise ValueError(f"env.json: framework {fw['name']} {fw['version']} but the installed "
                         f"package was {installed}")
    if not isinstance(meta.get("command"), str) or not meta["command"].strip():
        raise ValueError("env.json: bundle.command (how the run was started) is missing")
    _check_precision(cfg, env)
    recomputed, copied = list(meta.get("recomputed") or []), dict(meta.get("copied") or {})
    both = sorted(set(recomputed) & set(copied))
    if both:
        raise ValueError(f"env.json: {both[0]} is declared both recomputed and copied")
    for key in sorted({k for r in rows for k in r if k.startswith(BACKED_PREFIXES)}):
        if key not in recomputed and key not in copied:
            raise ValueError(f"metrics.jsonl: {key} is neither recomputed from log-prob evidence "
                             "nor copied from a source log (env.json bundle.recomputed / "
                             "bundle.copied): a number the bundle cannot back")
    if recomputed:
        _check_evidence(run_dir, rows, recomputed)
    if copied:
        _check_copied(run_dir, rows, copied, meta.get("source_log"))
    return {"framework": fw, "command": meta["command"], "recomputed": len(recomputed),
            "copied": copied, "precision": meta.get("precision"), "declared": meta.get("declared")
            or []}


def _check_precision(cfg: dict, env: dict) -> None:
    """The precision label must name the dtypes each engine was observed computing in (when
    observed)."""
    flow = resolve(cfg.get("precision"))
    obs = env.get("observed") or {}
    # FP8 quantisation is not observable from dtypes
    if not obs or flow.sampler_quant or flow.trainer_quant:
        return
    for side, want in (("sampler", flow.sampler_dtype), ("trainer", flow.trainer_dtype)):
        got = (obs.get(side) or {}).get("compute_dtype")
        if got is not None and got != str(want):  # None: this side could not be observed (declared)
            raise ValueError(f"precision {flow.name} means a {want} {side}, but env.json observed "
                             f"the {side} computing in {got}")


def _check_evidence(run_dir: Path, rows: list[dict], recomputed: list[str]) -> None:
    for row in rows:
        if isinstance(row["step"], bool) or not isinstance(row["step"], int):
            raise ValueError(f"metrics.jsonl: step {row['step']!r} is not an integer")
        path = run_dir / EVIDENCE_DIR / f"step_{row['step']:06d}.safetensors"
        if not path.is_file():
            raise ValueError(f"env.json claims {recomputed[0]} and {len(recomputed) - 1} more keys "
                             "are recomputed from per-token log-probs, but "
                             f"{EVIDENCE_DIR}/{path.name} (step {row['step']}) is missing")
        ev = read_evidence(path)
        again = step_metrics(ev["trainer_logp"], ev["sampler_logp"], ev["mask"], ev.get("entropy"))
        for key in recomputed:
            if key not in again:
                raise ValueError(f"env.json claims {key} is recomputed, but step {row['step']}'s "
                                 "evidence cannot give it")
            if not _close(row.get(key), again[key]):
                raise ValueError(f"metrics.jsonl: {key}={row.get(key)!r} at step {row['step']} but "
                                 f"its log-prob evidence gives {again[key]!r}")


def _check_copied(run_dir: Path, rows: list[dict], copied: dict, source: dict | None) -> None:
    if not isinstance(source, dict) or not source.get("path"):
        raise ValueError(f"env.json claims {next(iter(copied))} is copied from the framework's "
                         "log, but names no source log")
    path = (run_dir / str(source["path"])).resolve()
    if not path.is_relative_to((run_dir / SOURCE_DIR).resolve()) or not path.is_file():
        raise ValueError(f"source log {source['path']} is missing from the bundle's {SOURCE_DIR}/")
    if hashlib.sha256(path.read_bytes()).hexdigest() != source.get("sha256"):
        raise ValueError(f"source log {source['path']} differs from the one imported (sha256 "
                         "mismatch)")
    log = read_source_log(path)
    for row in rows:
        src = log.get(row["step"], {})
        for key, name in copied.items():
            if not _close(row.get(key), src.get(name)):
                raise ValueError(f"metrics.jsonl: {key}={row.get(key)!r} at step {row['step']} but "
                                 f"the source log's {name} is {src.get(name)!r}")


def describe_check(info: dict) -> str:
    """One line for the report and the site: what backs this bundle's numbers."""
    parts = [f"{info['framework']['name']} {info['framework']['version']}"]
    if info["recomputed"]:
        parts.append(f"{info['recomputed']} per-step metrics recomputed from log-prob evidence")
    if info["copied"]:
        parts.append(f"{len(info['copied'])} copied from the framework's log (not recomputable)")
    parts.append(f"precision {info['precision']}")
    if info["declared"]:
        parts.append("declared, not observed: " + ", ".join(info["declared"]))
    return "; ".join(parts)
