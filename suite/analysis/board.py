"""What the leaderboard shows: validated runs (leaderboard.validate_run) grouped into entries,
entries into boards, boards into machine classes. Pure functions of the records and the committed
references.

- **Entry**: runs whose configs differ only in the seed (fields added to the config since a run
count at
  the defaults it ran with), on one machine class. Its statistics follow rliable (Agarwal et al.
  2021, arXiv 2108.13264; suite/analysis/stats.py): the IQM of the final training accuracy over
  seeds with a stratified-bootstrap interval, and against the fp16 entry of the same algorithm on
  the same board the probability of improvement P(entry > fp16) with its interval. Every interval
  travels with its n.
- **Board**: one machine class and one *setting*, the config without the axes a board compares
  (algorithm, precision flow, fp32 head, injected noise, seed). Its header says what is measured:
  task, policy and its size, steps and batch, the verdict rule, the class, and how it differs from
  the published sanity test (arXiv 2510.26788, whose recipe is tasks/sanity_r1d.yaml's full tier).
- **Sections of a board**: `ranked` (recipes with at least MIN_SEEDS seeds that reproduce or were
not
  checked), `unranked` (recipes with fewer seeds, each saying why and how to fill it), `controls`
  (`exact`, the unified controls, injected noise: diagnostics, never ranked as recipes) and `stale`
  (entries that no longer reproduce with today's code, ranked apart).
- **Reproduction status** against today's code, per entry: `stale` when the class's reference.json
  declares that the numerics of that flow changed since (``numerics_changed_since``; key ``all
  flows`` for every flow), `pinned` when the class has a committed numerics fingerprint covering the
  flow (CI on a machine of the class fails on any bit that moves: tests/test_fingerprint.py), else
  `unchecked`.
- **Classes** are ordered by how many pinned entries they hold, most first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from suite.analysis import stats
from suite.numerics import flows as flow_table
from suite.results import REFERENCE_ROOT, VERDICT_RULE, config_hash

# rliable's point: fewer runs than this cannot support an ordering (arXiv 2108.13264, sec. 3)
MIN_SEEDS = 3
BASELINE = "fp16"  # the fix of arXiv 2510.26788: each recipe is compared with itself in fp16
# what ranks: final training accuracy (the verdict's window), IQM over seeds
SCORE = "accuracy/final"
SETTING_AXES = ("algorithm", "precision", "seed", "lm_head_fp32", "inject", "name", "out")
PUBLISHED_TASK = "sanity_r1d"
MISMATCH_SHOWN = ("kl_k3", "prob_diff/mean")
EXTRA_PREFIXES = ("eval/", "transfer/")
RANKING = (f"Recipes with at least {MIN_SEEDS} seeds, by the IQM over seeds of the final training "
           "accuracy (descending), then passes / seeds, then step-0 k3 KL (ascending). A rank is 1 "
           "+ the number of entries whose final accuracies lie above this one's by an exact "
           f"one-sided permutation test at level {stats.ALPHA} (each pair on its own); entries "
           "that share a rank are tied (=). With 3 seeds a side the test's smallest p-value is "
           "1/C(6,3) = 0.05: only fully separated seeds separate. Intervals: 95% stratified "
           f"bootstrap over seeds ({stats.BOOT_SAMPLES:,} resamples; rliable, arXiv 2108.13264); a "
           "zero-width one is shown as such, never as certainty.")


# ---------------------------------------------------------------------------- grouping keys
def normalised(cfg: dict, added: dict) -> dict:
    """The config as today's code composes it: ``added`` (flat ``a.b`` keys the code gained since
    the run, at the defaults that reproduce it; provenance.Check.added) filled in. Two runs of one
    experiment made before and after a field appeared then share a key."""
    out = json.loads(json.dumps(cfg))
    for key, value in (added or {}).items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node.setdefault(last, value)
    return out


def group_key(cfg: dict, class_id: str | None) -> str:
    """Seeds of one entry: the (normalised) config without the seed, on one machine class."""
    return config_hash({**{k: v for k, v in cfg.items() if k != "seed"}, "machine_class": class_id})


def setting_key(cfg: dict, class_id: str | None) -> str:
    """Entries of one board: the (normalised) config without the axes a board compares, on one
    class."""
    return config_hash({**{k: v for k, v in cfg.items() if k not in SETTING_AXES},
                        "machine_class": class_id})


def control_reason(cfg: dict) -> str | None:
    """Why an entry is a control and not a recipe; None for a recipe."""
    flow = flow_table.FLOWS.get(cfg.get("precision"))
    if flow is not None and flow.exact:
        return ("control: bitwise on-policy by construction (the trainer replays the sampler), "
                "mismatch exactly 0")
    if flow is not None and flow.control:
        return f"control of the trainer's numerics ({flow.note.removeprefix('control: ')})"
    inject = cfg.get("inject") or {}
    if inject.get("kind", "none") != "none":
        return (f"control: mismatch injected into the sampler ({inject.get('kind')}, "
                f"scale {inject.get('scale')})")
    return None


# ---------------------------------------------------------------------------- reproduction status
def _reference(class_id: str | None, root: Path) -> tuple[dict, dict]:
    """(reference.json, fingerprint.json) of a class; empty dicts where there is none."""
    if not class_id:
        return {}, {}
    out = []
    for name in ("reference.json", "fingerprint.json"):
        path = Path(root) / class_id / name
        out.append(json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})
    return out[0], out[1]


def reproduction(class_id: str | None, flow: str, root: Path = REFERENCE_ROOT,
                 twins: list | None = None) -> dict:
    """{"status": pinned | stale | unchecked, "why"}: can today's code reproduce an entry of
    ``flow`` on ``class_id``? ``twins``: byte-identical reruns of its runs found among the bundles
    (commit, source)."""
    ref, fp = _reference(class_id, root)
    for flows, why in (ref.get("numerics_changed_since") or {}).items():
        names = {f.strip() for f in flows.split(",")}
        if flow in names or "all flows" in names:
            return {"status": "stale", "why": f"no longer reproduces with today's code: {why}"}
    again = "; " + "; ".join(f"byte-identical rerun at commit {str(t['git_sha'])[:7]} "
                             f"({t['source']})"
                             for t in twins) if twins else ""
    if flow in (fp.get("flows") or {}):
        return {"status": "pinned", "why": "today's code is held to this class's numbers: the "
                                           "committed numerics "
                f"fingerprint of {class_id} covers {flow} (tests/test_fingerprint.py fails on any "
                f"bit that moves, on a machine of the class){again}"}
    where = ((f"class {class_id} has no committed numerics fingerprint" if not fp else
              f"the fingerprint of {class_id} does not cover {flow}")
             if class_id else "no machine class recorded")
    return {"status": "unchecked", "why": f"not checked against today's code: {where}{again}"}


# ---------------------------------------------------------------------------- entries
def _aggregate(values) -> dict:
    x = stats.finite(values)
    return stats.iqm_interval(x) or {"iqm": None, "lo": None, "hi": None, "n": 0}


def algorithm_words(cfg: dict) -> dict | None:
    """What the run's algorithm computes, with the ``algo.*`` knobs it recorded
    (suite/rl/algo_table.py): ``words`` for the entry page, ``elsewhere`` (shown on the board next
    to the name) when verl and TRL mean other settings by that name. None when the name is not in
    today's table."""
    from suite.rl.algo_table import ALGORITHMS, ROW_KNOBS, elsewhere, get_algorithm, in_words

    if cfg.get("algorithm") not in ALGORITHMS:
        return None
    knobs = {k: v for k, v in (cfg.get("algo") or {}).items() if k in ROW_KNOBS and v is not None}
    try:
        row = get_algorithm(cfg["algorithm"], **knobs)
    except ValueError:
        return None
    return {"words": in_words(row), "elsewhere": elsewhere(row)}


def entry(runs: list[dict], root: Path = REFERENCE_ROOT) -> dict:
    """One entry from the records of its seeds (sorted by seed)."""
    runs = sorted(runs, key=lambda r: r["seed"])
    first = runs[0]
    keys = ["accuracy/peak", SCORE, "time/total_s"]
    keys += [f"mismatch/{when}/{m}" for when in ("step0", "final") for m in MISMATCH_SHOWN]
    keys += sorted({k for r in runs for k in r["summary"] if k.startswith(EXTRA_PREFIXES)})
    reached = stats.finite(r["summary"].get("accuracy/first_pass_step") for r in runs)
    twins = [t for r in runs for t in r.get("twins", [])]
    return {
        "id": first["group"], "board": first["setting"], "class_id": first["class_id"],
        "task": first["task"], "algorithm": first["algorithm"], "precision": first["precision"],
        "algorithm_meaning": algorithm_words(first["config"]),
        "flow": first["config"]["precision"], "model": first["model"], "tier": first["tier"],
        "framework": first["framework"], "hardware": sorted({r["hardware"] for r in runs}),
        "seeds": len(runs), "seed_list": [r["seed"] for r in runs],
        "passes": sum(r["summary"].get("verdict") == "pass" for r in runs),
        "verdicts": [r["summary"].get("verdict") for r in runs],
        "metrics": {k: _aggregate(r["summary"].get(k) for r in runs) for k in keys},
        # Median over the seeds that got there, with how many did: a mean would hide the others.
        "first_pass": {"median": stats.median(reached), "reached": len(reached)},
        "control": control_reason(first["config"]),
        "reproduction": reproduction(first["class_id"], first["config"]["precision"], root, twins),
        "runs": runs,
    }


def _rank_key(e: dict) -> tuple:
    def low_first(v):  # None (missing) after every number
        return (v is None, v if v is not None else 0.0)

    final = e["metrics"][SCORE]["iqm"]
    return (low_first(None if final is None else -final), -e["passes"] / e["seeds"],
            low_first(e["metrics"]["mismatch/step0/kl_k3"]["iqm"]), e["algorithm"], e["precision"],
            e["id"])


def _finals(e: dict) -> list[float]:
    return stats.finite(r["summary"].get(SCORE) for r in e["runs"])


def _loop(e: dict) -> str:
    """The training loop without its version: seeds of one recipe may come from two commits of the
    suite."""
    return e["framework"].split(" ")[0]


def improvement(e: dict, entries: list[dict]) -> dict:
    """P(final accuracy of ``e`` > that of the fp16 entry of the same algorithm, model and framework
    on the board), with its interval; or {"p": None, "why": ...} when either side has fewer than
    MIN_SEEDS runs."""
    if e["flow"] == BASELINE:
        return {"p": None, "why": "the fp16 baseline itself"}
    want = BASELINE + e["precision"][len(e["flow"]):]  # the same fp32-head option as the entry
    base = [b for b in entries if b["precision"] == want and b["control"] is None and
            (b["algorithm"], b["model"], _loop(b)) == (e["algorithm"], e["model"], _loop(e))]
    if not base:
        return {"p": None, "why": f"no fp16 entry of {e['algorithm']} on this board"}
    x, y = _finals(e), _finals(base[0])
    if len(x) < MIN_SEEDS or len(y) < MIN_SEEDS:
        return {"p": None, "why": f"needs {MIN_SEEDS} seeds on both sides (this entry {len(x)}, "
                                  f"fp16 {len(y)})"}
    poi = stats.probability_of_improvement(x, y)
    exact = stats.permutation_test(x, y)
    passes = stats.fisher_exact(e["passes"], e["seeds"], base[0]["passes"], base[0]["seeds"])
    # A zero-width bootstrap interval (every resample separated alike) is not certainty: the board
    # shows the exact test's p-value instead, and its floor 1 / C(n + m, n) for these seed counts.
    return {**poi, "degenerate": poi["lo"] == poi["hi"], "perm_p": exact["p"],
            "perm_min_p": exact["min_p"], "fisher_p": passes, "baseline": base[0]["id"]}


def tied_ranks(ranked: list[dict]) -> list[dict]:
    """Ranks that order entries only where the data separate them: an entry's rank is 1 + the number
    of entries whose final accuracies lie above its own by an exact one-sided permutation test at
    level stats.ALPHA (each pair on its own); entries with one rank are tied (``tied`` counts them).
    Sorted by rank, then by the IQM order ``ranked`` came in."""
    finals = [_finals(e) for e in ranked]
    for e, x in zip(ranked, finals):
        above = [f for f, y in zip(ranked, finals) if f is not e and x and y
                 and stats.separated(y, x)]
        e["rank"], e["above"] = 1 + len(above), [f["id"] for f in above]
    for e in ranked:
        e["tied"] = sum(f["rank"] == e["rank"] for f in ranked)
    order = {id(e): i for i, e in enumerate(ranked)}
    return sorted(ranked, key=lambda e: (e["rank"], order[id(e)]))


def fill_command(e: dict) -> str | None:
    """The command that adds the missing seeds (0 .. MIN_SEEDS-1) of a suite entry; None when it has
    them or was trained by an outside loop (its command cannot be rerun by suite)."""
    missing = [s for s in range(MIN_SEEDS) if s not in e["seed_list"]]
    cmd = e["runs"][0]["provenance"].get("command") or ""
    if not missing or not e["runs"][0]["provenance"].get("command_checked") or "seed=" not in cmd:
        return None
    return "for s in " + " ".join(map(str, missing)) + "; do " + re.sub(
        r"\bseed=\S+", "seed=$s", cmd) + "; done"


def sections(entries: list[dict]) -> dict:
    """The four lists of a board, each in rank order; ``rank`` and ``why`` set on every entry."""
    out = {"ranked": [], "unranked": [], "controls": [], "stale": []}
    for e in sorted(entries, key=_rank_key):
        e["improvement"] = improvement(e, entries)
        e["fill_command"] = fill_command(e)
        e["rank"] = None
        if e["control"]:
            e["why"] = e["control"]
            out["controls"].append(e)
        elif e["reproduction"]["status"] == "stale":
            e["why"] = e["reproduction"]["why"]
            out["stale"].append(e)
        elif e["seeds"] < MIN_SEEDS:
            e["why"] = (f"{e['seeds']} seed{'s' if e['seeds'] != 1 else ''}: a rank needs "
                        f"{MIN_SEEDS} (rliable, arXiv 2108.13264)")
            out["unranked"].append(e)
        else:
            e["why"] = None
            out["ranked"].append(e)
    out["ranked"] = tied_ranks(out["ranked"])
    for n, e in enumerate([e for e in out["stale"] if e["seeds"] >= MIN_SEEDS], start=1):
        e["rank"] = n  # ranked apart, among the entries that no longer reproduce
    return out


# ---------------------------------------------------------------------------- boards and classes
def _published() -> dict:
    """The published sanity test's recipe (sanity_r1d's full tier) and its task, as the suite runs
    it."""
    from suite.tasks.registry import task_spec

    spec = task_spec(PUBLISHED_TASK)
    return {"task": PUBLISHED_TASK, **(spec.get("tiers") or {}).get("full", {}),
            "prompts": "1,460 MATH problems (" + str(spec.get("prefiltered", "")) + ")"}


def _flat(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def setting(first: dict) -> dict:
    """What a board measures, from the config and env of one of its runs."""
    cfg, env = first["config"], first.get("env_facts") or {}
    try:
        from suite.tasks.registry import task_spec

        task_doc = " ".join(str(task_spec(cfg["task"]).get("description", "")).split())
    except (ValueError, KeyError, OSError):
        task_doc = ""
    facts = {
        "task": cfg["task"], "task_description": task_doc, "task_version": env.get("task_version"),
        "policy": first["model"], "params": env.get("params"),
        "prompts": env.get("prompts"),
        "steps": cfg.get("steps"), "prompts_per_step": cfg.get("prompts_per_step"),
        "samples_per_prompt": cfg.get("samples_per_prompt"),
        "updates_per_step": cfg.get("updates_per_step"), "lr": _flat(cfg, "optim.lr"),
        "max_new_tokens": _flat(cfg, "sampling.max_new_tokens"),
        "threshold": cfg.get("threshold", 0.95),
        "verdict_rule": first["summary"].get("verdict_rule") or VERDICT_RULE,
        "tier": cfg.get("tier"), "regime": cfg.get("regime"), "framework": first["framework"],
    }
    pub = _published()
    here = {"task": cfg["task"], "model": first["model"], "steps": cfg.get("steps"),
            "prompts_per_step": cfg.get("prompts_per_step"),
            "samples_per_prompt": cfg.get("samples_per_prompt"),
            "updates_per_step": cfg.get("updates_per_step"), "optim.lr": _flat(cfg, "optim.lr"),
            "sampling.max_new_tokens": _flat(cfg, "sampling.max_new_tokens")}
    facts["differs"] = [{"field": k, "here": v, "published": pub.get(k)} for k, v in here.items()
                        if pub.get(k) is not None and str(v) != str(pub.get(k))]
    return facts


# What the literature reports for pairs of flows, as (behind, ahead, source id in reported.yaml,
# what the source says about its own setting); each board says whether its order agrees.
LITERATURE = (
    ("bf16", "fp16", "precision-rl-fp16", "arXiv 2510.26788 reports FP16 ahead of BF16"),
    ("bf16_fp8rollout", "fp8", "jet-rl-fp8-rollout",
     "arXiv 2601.14243 reports BF16-train + FP8-rollout collapsing and unified FP8 stable, under "
     "long rollouts and hard tasks"),
)


def literature(ranked: list[dict]) -> list[dict]:
    """For each pair of LITERATURE present in ``ranked`` with one algorithm: whether this board's
    data agree with the source, tie, or reverse it by the pair's exact permutation test at
    stats.ALPHA, as a sentence; the page puts them under the list of how the board's setting differs
    from the published one (``setting``'s ``differs``)."""
    out = []
    for behind, ahead, source, says in LITERATURE:
        for b in [e for e in ranked if e["precision"] == behind]:
            a = next((e for e in ranked if e["precision"] == ahead
                      and e["algorithm"] == b["algorithm"]
                      and e["model"] == b["model"]), None)
            if a is None:
                continue
            x, y = _finals(a), _finals(b)
            p_ahead, p_behind = stats.permutation_test(x, y)["p"], stats.permutation_test(y, x)["p"]
            # The pair's own test, not the ranks: two entries may hold different ranks because each
            # is separated from a third entry while neither is separated from the other.
            if p_ahead <= stats.ALPHA:
                verdict, how = "agrees", f"puts {ahead} above {behind} (exact p = {p_ahead:.2f})"
            elif p_behind <= stats.ALPHA:
                verdict, how = "reverses", f"puts {behind} above {ahead} (exact p = {p_behind:.2f})"
            else:
                verdict, how = "ties", (f"does not separate {behind} and {ahead} (exact p = "
                                        f"{min(p_ahead, p_behind):.2f} either way, {len(x)} vs "
                                        f"{len(y)} seeds)")
            text = f"{b['algorithm']}: this board {how}; {says}."
            out.append({"source": source, "algorithm": b["algorithm"], "behind": behind,
                        "ahead": ahead, "verdict": verdict, "text": text})
    return out


def board(entries: list[dict], class_id: str | None, root: Path = REFERENCE_ROOT) -> dict:
    """A board: its setting, its four sections, and the sweep that would fill it to MIN_SEEDS
    seeds."""
    first = entries[0]["runs"][0]
    parts = sections(entries)
    grid = first["config"].get("name")
    short = sorted({s for e in parts["unranked"] for s in range(MIN_SEEDS)
                    if s not in e["seed_list"]})
    # A grid this class's reference ran (reference.json "grids"): its sweep with the missing seeds
    # fills the board.
    grids = _reference(class_id, root)[0].get("grids") or []
    sweep = (f"suite sweep grid={grid} seed={','.join(map(str, short))} name={grid}-seeds "
             "launcher=local jobs=2"
             if short and grid in grids else None)
    facts = setting(first)
    return {"id": entries[0]["board"], "class_id": class_id, "setting": facts, **parts,
            "literature": literature(parts["ranked"]), "fill_sweep": sweep, "entries": len(entries)}


def classes(records: list[dict], root: Path = REFERENCE_ROOT) -> list[dict]:
    """Every class with its boards, the class with the most pinned (reproducible) entries first."""
    from suite.numerics import machine

    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    by_class: dict[str | None, dict[str, list[dict]]] = {}
    for runs in groups.values():
        e = entry(runs, root)
        by_class.setdefault(e["class_id"], {}).setdefault(e["board"], []).append(e)
    out = []
    for cid, boards in by_class.items():
        bs = sorted((board(es, cid, root) for es in boards.values()),
                    key=lambda b: (-b["entries"], b["setting"]["task"], b["id"]))
        every = [e for b in bs for s in ("ranked", "unranked", "controls", "stale") for e in b[s]]
        cls = next((r["class"] for r in records if r["class_id"] == cid), None)
        out.append({"id": cid or "class not recorded", "label": machine.label(cls), "boards": bs,
                    "pinned": sum(e["reproduction"]["status"] == "pinned" for e in every),
                    "stale": sum(e["reproduction"]["status"] == "stale" for e in every),
                    "ranked": sum(len(b["ranked"]) for b in bs), "entries": len(every)})
    return sorted(out, key=lambda c: (-c["pinned"], -c["ranked"], c["id"]))
