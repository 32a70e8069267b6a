"""How the leaderboard names a run it has accepted: its precision flow (with the fp32 head when the
run kept one), its model (the policy's folder, an outside loop's model, or the embedded Llama's
shape), its hardware (the machine class first, since the class decides the numerics, then the GPUs
or the CPU), and the env.json facts a board's header reads (task version, policy size, perfectible
prompts). Pure functions of a run's config and env.json that only describe: whether a bundle may
enter at all is decided by the checks in suite/analysis/leaderboard.py.
"""

from __future__ import annotations

from pathlib import Path


def _precision_label(cfg: dict) -> str:
    return cfg["precision"] + (" + fp32 head" if cfg.get("lm_head_fp32") else "")


def _model_label(cfg: dict) -> str:
    p = cfg.get("policy") or {}
    if cfg.get("framework") and not p.get("hidden"):  # an outside loop on a model of its own
        return Path(str(cfg.get("model") or "unnamed")).name
    if p.get("path"):
        return Path(str(p["path"])).name or str(p["path"])
    return f"embedded Llama h{p.get('hidden')} L{p.get('layers')}"


def _hardware_label(env: dict, cls: dict | None = None) -> str:
    """The machine class first (it decides the numerics, suite/numerics/machine.py), then the
    hardware."""
    if env.get("gpus"):
        names = env["gpus"]
        hw = f"{len(names)}x {names[0]}" if len(set(names)) == 1 else ", ".join(map(str, names))
    else:
        cores = env.get("cpu_count")
        hw = f"CPU {env.get('cpu_model')}" + (f", {cores} cores" if cores else "")
    return f"{cls['id'] if cls else 'class not recorded'}: {hw}"


def _env_facts(env: dict) -> dict:
    """What a board's header reads from env.json: task version, policy size, perfectible prompts."""
    def get(*path):
        node = env
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        return node

    return {"task_version": get("task", "version"), "params": get("policy", "params"),
            "prompts": get("dataset", "prompts")}
