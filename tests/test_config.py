"""Malformed configs are rejected before any compute, with a message that names the field."""

import pytest

from suite.rl import config


@pytest.mark.parametrize("overrides, field, words", [
    (["precision=bf17"], "precision", "did you mean 'bf16'"),
    (["optim.lr=-1e-4"], "optim.lr", "must be > 0"),
    (["perfectible.k=1"], "perfectible.k", "must be >= 2"),
    (["perfectible.lo=0.9", "perfectible.hi=0.5"], "perfectible.lo", "must be <= hi"),
    (["task=arth"], "task", "did you mean 'arith'"),
    (["task=missing_task"], "task", "allowed: arith"),
    (["algorithm=grpoo"], "algorithm", "did you mean 'grpo'"),
    (["tier=huge"], "tier", "allowed: smoke, small, full"),
    (["samples_per_prompt=1"], "samples_per_prompt", "must be >= 2"),
    (["updates_per_step=3"], "updates_per_step", "must divide"),
    (["sampling.top_p=0"], "sampling.top_p", "(0, 1]"),
    (["sampling.top_k=-1"], "sampling.top_k", "must be >= 0"),
    (["sampling.truncation=renormalize"], "sampling.truncation", "none, renormalise"),
    (["kv_cache=fp4"], "kv_cache", "auto, fp8"),
    (["staleness=-1"], "staleness", "must be >= 0"),
    (["eval.top_p=0"], "eval.top_p", "(0, 1]"),
    # Non-finite numbers and zero counts: refused here, not as a crash mid-run (ZeroDivisionError,
    # NaN loss).
    (["optim.lr=inf"], "optim.lr", "must be a finite number"),
    (["optim.grad_clip=nan"], "optim.grad_clip", "must be a finite number"),
    (["threshold=-inf"], "threshold", "must be a finite number"),
    (["optim.betas=[0.9,inf]"], "optim.betas", "must be a finite number"),
    (["updates_per_step=0"], "updates_per_step", "must be >= 1"),
    (["policy.heads=0"], "policy.heads", "must be >= 1"),
    (["policy.kv_heads=0"], "policy.kv_heads", "must be >= 1"),
    (["steps=0"], "steps", "must be >= 1"),
    (["prompts_per_step=0"], "prompts_per_step", "must be >= 1"),
    (["ckpt_every=0"], "ckpt_every", "must be >= 1"),
    (["micro_batch=0"], "micro_batch", "must be >= 1"),
    (["vllm.tensor_parallel_size=0"], "vllm.tensor_parallel_size", "must be >= 1"),
    (["vllm.gpu_memory_fraction=0"], "vllm.gpu_memory_fraction", "(0, 1]"),
    (["eval.samples=0"], "eval.samples", "must be >= 1"),
    # Overrides Hydra cannot parse get the same one-line refusal.
    (["precision=[bf16"], "precision", "cannot parse"),
    (["optim.lr=1e-4)"], "optim.lr", "cannot parse"),
    (["precison=bf16"], "precison", "did you mean 'precision'"),
    (["optim.lrr=1e-3"], "optim.lrr", "did you mean 'lr'"),
    (["seed=abc"], "seed", "could not be converted"),
])
def test_bad_config_names_the_field(overrides, field, words):
    with pytest.raises(ValueError) as err:
        config.load(overrides)
    msg = str(err.value)
    assert msg.startswith(field + ":"), msg
    assert words.lower() in msg.lower(), msg


@pytest.mark.parametrize("override",
                         ["optim.lr=inf", "updates_per_step=0", "precision=[bf16",
                          "sampling.top_p=1.5"])
def test_cli_refuses_bad_input_with_one_line_and_exit_2(override, tmp_path, capsys):
    from suite import cli

    assert cli.main(["run", override, f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("suite run: error: " + override.split("=")[0]
                                                   + ":"), err
    assert list(tmp_path.iterdir()) == []  # no run directory was written


def test_tier_fills_unset_fields_and_overrides_win():
    cfg = config.load(["tier=smoke", "steps=7", "policy.hidden=32"])
    assert cfg.steps == 7 and cfg.policy.hidden == 32
    assert cfg.prompts_per_step == config.TIERS["smoke"]["prompts_per_step"]
    assert cfg.policy.layers == config.TIERS["smoke"]["policy"]["layers"]
    assert cfg.sampling.max_new_tokens == 52 + 8  # the arith trace is 52 characters


def test_bad_value_rejected_before_compute(monkeypatch, tmp_path):
    """The CLI refuses a bad config without building a policy or touching the output dir."""
    from suite import cli
    from suite.rl import data

    monkeypatch.setattr(data, "ensure_policy", lambda *a, **k: pytest.fail("compute started"))
    assert cli.main(["run", "precision=bf17", f"out={tmp_path}"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_regime_fills_defaults_and_yields_to_explicit_values():
    from suite.rl.schema import REGIMES

    cfg = config.load(["regime=stress"])
    assert (cfg.perfectible.max_prompts, cfg.optim.eps, cfg.optim.lr,
            cfg.updates_per_step) == (32, 1e-15, 2e-4, 8)
    assert config.load(["regime=stress", "optim.lr=5e-5"]).optim.lr == 5e-5  # the command line wins
    assert config.load(["regime=base"]) == config.load([])  # base changes nothing but its name
    assert set(REGIMES["long"]["set"]) == {"task"} and config.load(["regime=long"]).task == "arith"
    with pytest.raises(ValueError, match="Did you mean 'stress'"):
        config.load(["regime=strss"])


def test_a_composition_is_kept_per_process_and_each_caller_gets_its_own_copy():
    """compose.from_overrides composes each distinct override list once (a report recomposes every
    run's rerun command); what one caller changes in its config never reaches the next caller."""
    from suite.rl import compose

    first = compose.from_overrides(["tier=smoke", "seed=3"])
    first.seed, first.optim.lr = 99, 1.0
    again = compose.from_overrides(["tier=smoke", "seed=3"])
    assert again.seed == 3 and again.optim.lr != 1.0 and again is not first
    assert compose.from_overrides(["tier=smoke", "seed=4"]).seed == 4
    with pytest.raises(ValueError, match="sed"):  # a refusal is raised each time, never kept
        compose.from_overrides(["sed=1"])
    with pytest.raises(ValueError, match="sed"):
        compose.from_overrides(["sed=1"])


# Each grid's first and last cell, and the corners of Hydra's value grammar (quoting, escapes, null,
# lists, an interpolation, a key set twice, an unknown key, a wrong type, a sweep, + and ~).
def _grid_overrides() -> list[list[str]]:
    import itertools

    from suite.experiments import grids

    out = []
    for name in grids.GRIDS:
        g = grids.get(name)
        fixed = [o for o in g["overrides"] if "${" not in o]
        cells = list(itertools.product(*g["axes"].values()))
        out += [[*fixed, *(f"{k}={x}" for k, x in zip(g["axes"], v))]
                for v in dict.fromkeys([cells[0], cells[-1]])]
    return out


CORNERS = [[], ["name='a b'"], ["name=a\\ b"], ["name=on"], ["name=null"], ["name=${precision}"],
           ["optim.lr=1e-4", "optim.lr=2e-4"], ["optim.betas=[0.9,0.99]", "logger=[wandb]"],
           ["micro_batch=null", "algo.C=2"], ["sed=1"], ["steps=abc"], ["seed=1,2"],
           ["+extra=1"], ["~seed"], ["hydra.job.name=x"], ["algo=grpo"], ["policy.layers=2.5"]]


def test_plain_overrides_compose_what_hydras_whole_composition_does():
    """compose's plain path (Hydra's last step on a copy of the composed defaults) gives, for each
    grid's first and last cell and each corner of the grammar, the config or the refusal that
    hydra.compose gives; only what the plain path cannot do goes to Hydra."""
    from suite.rl import compose

    def outcome(fn, ov):
        try:
            return fn(tuple(ov))
        except ValueError as e:
            return f"refused: {e}"

    def whole(ov):  # compose's own grammar check first, then Hydra's whole composition
        for o in ov:
            compose._parse(o)
        return compose._hydra_composed(ov)

    cases = _grid_overrides() + CORNERS
    assert len(cases) > 50
    for ov in cases:
        assert outcome(compose._composed, ov) == outcome(whole, ov), ov
    plain = [ov for ov in cases if compose._plain_composed(tuple(ov)) is not None]
    assert len(plain) >= len(cases) - len(CORNERS)  # every grid's cells take the plain path
    for ov in (["seed=1,2"], ["+extra=1"], ["~seed"], ["hydra.job.name=x"], ["sed=1"]):
        assert compose._plain_composed(tuple(ov)) is None, ov
