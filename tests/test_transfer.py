"""Transfer index: the formulas on the paper's Table 1, the flags, and a real lm-eval evaluation
of the embedded base policy against trained ones (suite/rl/transfer.py, suite/rl/evaluate.py)."""

import json
import shutil
from pathlib import Path

import pytest

from suite.rl import transfer as ti

# ---- Table 1 of arXiv 2507.00432 scores in percent -----------------------
BENCHES = ["aime24", "aime25", "math500", "olympiad", "gpqa", "lcb2", "acpbench", "headqa",
           "coqa", "mctaco", "ifeval", "halueval"]
GROUPS = {"math": BENCHES[:4], "other": BENCHES[4:8], "non": BENCHES[8:]}
ROWS = {
    "base": [13.0, 9.3, 60.4, 27.9, 42.6, 29.7, 10.7, 37.6, 10.0, 67.7, 69.2, 35.7],
    "sft_think": [52.0, 37.0, 85.0, 25.0, 55.9, 21.9, 68.6, 34.8, 1.7, 38.2, 42.3, 2.3],
    "sft_nothink": [16.0, 13.0, 77.2, 22.7, 48.7, 23.5, 69.3, 35.0, 5.3, 66.1, 41.4, 3.3],
    "rl": [55.7, 38.0, 87.8, 33.8, 57.7, 40.6, 65.4, 40.2, 28.2, 74.0, 70.0, 40.7],
}
PUBLISHED = {"sft_think": (52.2, -104.1), "sft_nothink": (165.4, -278.9), "rl": (82.3, 52.2)}


def scores(row):
    return dict(zip(BENCHES, ROWS[row]))


def pair(d):
    return round(d["other"], 1), round(d["non"], 1)


def test_v1_on_the_rl_row():
    value, flags = ti.ti_v1(scores("base"), scores("rl"), GROUPS)
    assert pair(value) == (83.9, 29.3) and flags == []


def test_v2_with_sigma_per_model_on_the_rl_row():
    sigma = ti.sigma_per_model(scores("base"), scores("rl"), GROUPS)
    value, flags = ti.ti_v2(scores("base"), scores("rl"), GROUPS, sigma)
    assert pair(value) == (71.0, 84.1) and flags == []


@pytest.mark.parametrize("row, expected", [("rl", (87.7, 59.0)), ("sft_think", (55.7, -117.5)),
                                           ("sft_nothink", (176.2, -315.0))])
def test_v2_without_sigma(row, expected):
    value, flags = ti.ti_v2(scores("base"), scores(row), GROUPS, None)
    assert pair(value) == expected and flags == []


def test_published_values_are_no_sigma_times_one_constant_per_group():
    # arXiv 2507.00432 Sec. 3: one shared sigma per group over a model pool gives 0.938 (other),
    # 0.885 (non).
    for row, (other, non) in PUBLISHED.items():
        value, _ = ti.ti_v2(scores("base"), scores(row), GROUPS, None)
        assert other / value["other"] == pytest.approx(0.938, abs=0.005)
        assert non / value["non"] == pytest.approx(0.885, abs=0.005)


def test_sigma_choices_are_consistent():
    base, rl = scores("base"), scores("rl")
    # pooled over a single model is that model's own sigma
    assert ti.sigma_pooled([(base, rl)],
                           GROUPS) == pytest.approx(ti.sigma_per_model(base, rl, GROUPS))
    # one constant for every group cancels in the ratio: the no-sigma values
    fixed, _ = ti.ti_v2(base, rl, GROUPS, dict.fromkeys(GROUPS, 7.5))
    assert pair(fixed) == (87.7, 59.0)
    # pooled over the three models of Table 1, each against the same base
    pooled = ti.sigma_pooled([(base, scores(r)) for r in PUBLISHED], GROUPS)
    out = ti.all_variants(base, rl, GROUPS, pooled=pooled, fixed=dict.fromkeys(GROUPS, 1.0))
    assert {"v1", "v2_per_model", "v2_pooled", "v2_fixed", "v2_no_sigma"} <= set(out)
    assert pair(out["v2_fixed"]) == pair(out["v2_no_sigma"]) == (87.7, 59.0)
    assert all(v == [] for v in out["flags"].values())
    assert out["delta"]["math"] == pytest.approx((42.7 + 28.7 + 27.4 + 5.9) / 4)


def test_a_math_gain_of_zero_or_less_is_flagged_not_printed():
    base = scores("base")
    same_math = {**scores("rl"), **{b: base[b] for b in GROUPS["math"]}}
    worse_math = {**scores("rl"), **{b: base[b] - 1.0 for b in GROUPS["math"]}}
    for model, flag in ((same_math, ti.MATH_GAIN_ZERO), (worse_math, ti.MATH_GAIN_NEGATIVE)):
        out = ti.all_variants(base, model, GROUPS, pooled=ti.sigma_pooled([(base, model)], GROUPS),
                              fixed=dict.fromkeys(GROUPS, 2.0))
        for variant in ("v1", "v2_per_model", "v2_pooled", "v2_fixed", "v2_no_sigma"):
            assert out[variant] == {"other": None, "non": None}, variant
            assert flag in out["flags"][variant], (variant, out["flags"][variant])


def test_other_degenerate_cases_are_flagged():
    base, rl = scores("base"), scores("rl")
    # v1 divides by the base score
    zero_base = {**base, "coqa": 0.0}
    value, flags = ti.ti_v1(zero_base, rl, GROUPS)
    assert (value["non"] is None and value["other"] is not None
            and flags == [f"{ti.BASE_SCORE_ZERO}:non"])
    # a one-benchmark group has no spread: per-model sigma is 0 and that group's TI is flagged, not
    # infinite
    one = {"math": ["aime24", "math500"], "other": ["gpqa"], "non": ["coqa", "ifeval"]}
    value, flags = ti.ti_v2(base, rl, one, ti.sigma_per_model(base, rl, one))
    assert (value["other"] is None and value["non"] is not None
            and flags == [f"{ti.SIGMA_ZERO}:other"])
    # nothing moved in a group: DI 0, TI 0, no flag
    still = {**rl, **{b: base[b] for b in GROUPS["non"]}}
    value, flags = ti.ti_v2(base, still, GROUPS, ti.sigma_per_model(base, still, GROUPS))
    assert value["non"] == 0.0 and flags == []


def test_bad_groups_and_sigma_are_refused():
    with pytest.raises(ValueError, match="non missing"):
        ti.all_variants(scores("base"), scores("rl"),
                        {"math": GROUPS["math"], "other": GROUPS["other"]})
    with pytest.raises(ValueError, match="no score for coqa"):
        ti.all_variants(scores("base"), {k: v for k, v in scores("rl").items() if k != "coqa"},
                        GROUPS)
    assert ti.parse_sigma("math=2,other=1.5,non=3") == {"math": 2.0, "other": 1.5, "non": 3.0}
    for bad, msg in (("math=2,other=1", "give all of"),
                     ("math=2,reason=1,non=1", "not GROUP=VALUE"),
                     ("math=x,other=1,non=1", "not a number"),
                     ("math=0,other=1,non=1", "must be > 0")):
        with pytest.raises(ValueError, match=msg):
            ti.parse_sigma(bad)


# ---- lm-eval: task names
# ---------------------------------------------------------------------------------
def test_an_unknown_task_name_gets_a_suggestion():
    from suite.rl import evaluate as ev
    from suite.rl import lm_eval_harness as harness
    from suite.tasks.registry import get_task

    tm = harness.task_manager([ev.build_embedded(get_task("arith3"))], defaults=False)
    assert {n for g in ev.EMBEDDED.values() for n in g} <= set(tm.all_tasks)
    with pytest.raises(harness.TaskNotFound, match="no task 'tiny_math_sm' .*Did you mean "
                                                   "'tiny_math_sum'"):
        harness.resolve_groups({**ev.EMBEDDED, "math": ["tiny_math_sm"]}, tm)


def test_the_papers_benchmarks_are_lm_eval_names_or_listed_missing():
    """The real groups against lm-eval's own task files (only the directories that hold them: the
    full index takes ~40 s); the three benchmarks lm-eval lacks are listed, not silently dropped."""
    import lm_eval

    from suite.rl import evaluate as ev
    from suite.rl import lm_eval_harness as harness

    root = Path(lm_eval.__file__).parent / "tasks"
    dirs = [root / d
            for d in ("minerva_math", "aime", "gpqa", "acpbench", "headqa", "coqa", "ifeval",
                      "mc_taco")]
    tm = harness.task_manager(dirs, defaults=False)
    kept, missing = harness.resolve_groups(ev.PAPER, tm)
    assert sorted(missing) == ["halueval", "livecodebench_v2", "olympiadbench"]
    assert kept == {g: [n for n in names if n not in missing] for g, names in ev.PAPER.items()}
    # a tag: the mean of its 7 MCQ tasks
    assert len(harness._members("acp_mcq_cot_2shot", tm)) == 7
    with pytest.raises(harness.TaskNotFound, match="Did you mean 'minerva_math500'"):
        harness.resolve_groups({**ev.PAPER, "math": ["minerva_math50"]}, tm)


def test_embedded_documents_stay_in_the_policys_alphabet():
    from suite.rl import evaluate as ev
    from suite.tasks.lm_eval_docs import embedded_docs
    from suite.tasks.registry import get_task

    for task in (get_task("arith3"), get_task("arith")):
        for name in (n for g in ev.EMBEDDED.values() for n in g):
            docs = embedded_docs(name, task, 128)
            assert len(docs) >= 32, (task.name, name, len(docs))
            text = "".join(json.dumps([d.get("prompt", ""), d.get("answer", ""),
                                       d.get("context", ""), d.get("choices", [])]) for d in docs)
            assert set(text) - set('0123456789+=,#[]", ') == set(), name
            for d in docs:
                if "choices" in d:
                    assert (len(set(d["choices"])) == len(d["choices"])
                            and 0 <= d["gold"] < len(d["choices"]))
    held_out = {it.prompt for it in get_task("arith3").split("test")}
    for name in ("tiny_math_sum", "tiny_math_carry"):
        assert all(d["prompt"] in held_out for d in embedded_docs(name, get_task("arith3"), 128))


# ---- lm-eval: a real evaluation of the embedded base and trained policies
# ------------------------------
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """Two smoke-tier runs (a few RL steps, one at a learning rate that wrecks the policy), a run
    without a checkpoint and a directory that is no run, evaluated together with lm-eval."""
    from suite.rl import config
    from suite.rl import evaluate as ev
    from suite.rl.train import run

    out = tmp_path_factory.mktemp("transfer-runs")
    hot = run(config.load(["tier=smoke", f"out={out}", "name=hot", "steps=6", "optim.lr=1e-3"]))
    mild = run(config.load(["tier=smoke", f"out={out}", "name=mild"]))
    bare = out / "bare" / mild.name
    shutil.copytree(mild, bare, ignore=shutil.ignore_patterns("ckpt"))
    records = ev.evaluate_runs([hot, bare, mild, out / "nothing"], limit=16)
    return {"hot": hot, "mild": mild, "records": records}


def test_base_and_trained_policies_are_scored_on_the_three_groups(evaluated):
    from suite.rl.evaluate import EMBEDDED

    hot_rec, _, mild_rec, _ = evaluated["records"]
    assert hot_rec["status"] == mild_rec["status"] == "ok"
    doc = json.loads((evaluated["hot"] / "transfer.json").read_text())
    assert doc == json.loads(json.dumps(hot_rec["transfer"]))
    names = [n for g in ti.GROUPS for n in doc["groups"][g]]
    assert names == [n for g in ti.GROUPS for n in EMBEDDED[g]]
    for side in ("base", "final"):
        for n in names:
            s = doc[side]["scores"][n]
            assert (0.0 <= s["score"] <= 100.0 and s["stderr"] is not None and s["n"] == 16
                    and s["version"] == 1)
    assert (doc["versions"]["lm_eval"] == "0.4.13"
            and doc["tasks"]["tiny_math_sum"]["metric"] == "exact_match,last_hash")
    assert doc["final"]["step"] == 6 and doc["final"]["checkpoint"] == "ckpt/step_000006"
    # lr 1e-3 wrecks the tiny policy (Adam's first steps are sign-like): math falls, so no TI number
    base, final = doc["base"]["scores"], doc["final"]["scores"]
    assert final["tiny_math_sum"]["score"] < base["tiny_math_sum"]["score"]
    assert doc["ti"]["v2_no_sigma"] == {"other": None, "non": None}
    assert (ti.MATH_GAIN_NEGATIVE in doc["flags"]["v1"]
            and ti.MATH_GAIN_NEGATIVE in doc["flags"]["v2_no_sigma"])
    assert set(doc["ti"]) == {"v1", "v2_per_model", "v2_pooled",
                              "v2_no_sigma"} and doc["pooled_over"] == 2


def test_base_scores_are_cached_and_runs_without_checkpoint_are_reported(evaluated):
    hot_rec, bare_rec, mild_rec, none_rec = evaluated["records"]
    hot, mild = hot_rec["transfer"], mild_rec["transfer"]
    from suite.rl.policy import cache_root

    # the base is evaluated once (for the first run; a warm session cache may already hold it)
    assert (mild["base"]["cached"] is True
            and (cache_root() / "transfer" / "base" / f"{hot['base']['cache_key']}.json").exists())
    assert (hot["base"]["scores"] == mild["base"]["scores"]
            and hot["base"]["cache_key"] == mild["base"]["cache_key"])
    assert hot["final"]["scores"] != mild["final"]["scores"]
    assert bare_rec["status"] == "skipped" and "no final checkpoint" in bare_rec["reason"]
    assert none_rec["status"] == "skipped" and "not a run bundle" in none_rec["reason"]
    assert not (Path(bare_rec["run"]) / "transfer.json").exists()


def test_the_cli_prints_scores_and_flags_and_exits_1_on_a_skipped_run(evaluated, capsys):
    from suite import cli

    code = cli.main(["transfer", str(evaluated["mild"]), "--limit", "16"])
    out = capsys.readouterr().out
    assert (code == 0 and "base cached" in out and "tiny_copy_repeat" in out
            and "TI v2_no_sigma" in out)
    assert cli.main(["transfer", str(evaluated["mild"]), "--groups", "embeded"]) == 2
    assert "Did you mean 'embedded'" in capsys.readouterr().err
    committed = (Path(__file__).resolve().parent / "fixtures" / "results-2seeds"
                 / "arith__grpo__fp32__s0")
    assert cli.main(["transfer", str(committed)]) == 1
    assert "SKIPPED: no final checkpoint" in capsys.readouterr().out


def test_report_and_leaderboard_show_the_transfer_index(evaluated, tmp_path):
    from suite.analysis import leaderboard, report

    root = tmp_path / "results"
    for key in ("hot", "mild"):
        shutil.copytree(evaluated[key], root / key / evaluated[key].name,
                        ignore=shutil.ignore_patterns("ckpt"))
    md = (report.write_report(root) / "report.md").read_text()
    assert ("Transfer index (lm-eval)" in md and "math_gain_negative" in md
            and "tiny_math_carry" in md)
    record = leaderboard.validate_run(root / "hot" / evaluated["hot"].name)
    assert (record["summary"]["transfer/ti_other"] is None
            and "math_gain_negative" in record["transfer_flags"])
    assert record["summary"]["transfer/delta_math"] < 0
    site = leaderboard.build([root / "hot", root / "mild"], tmp_path / "site")
    assert "transfer/ti_other" in (site.parent / "data.js").read_text()


def test_a_failing_evaluation_at_the_end_of_a_run_never_fails_the_run(tmp_path, monkeypatch):
    from suite.rl import config
    from suite.rl import evaluate as ev
    from suite.rl.train import run

    def boom(*a, **k):
        raise RuntimeError("lm-eval exploded")

    monkeypatch.setattr(ev, "evaluate_runs", boom)
    d = run(config.load(["tier=smoke", f"out={tmp_path}", "transfer=true", "steps=2"]))
    assert json.loads((d / "summary.json").read_text())["steps_done"] == 2
    assert "lm-eval exploded" in (d / "transfer_error.txt").read_text()


def test_the_vllm_back_end_needs_the_vllm_distribution(monkeypatch, tmp_path):
    from suite.rl import evaluate as ev

    monkeypatch.setattr(ev, "_version", lambda dist: None)
    with pytest.raises(ValueError, match="--backend vllm: lm-eval's vLLM wrapper needs the `vllm` "
                                         "distribution"):
        ev.evaluate_runs([tmp_path], backend="vllm")
    with pytest.raises(ValueError, match="--backend: unknown value 'vlm'. Did you mean 'vllm'"):
        ev.evaluate_runs([tmp_path], backend="vlm")
