"""Under a peer's name, the peer's number: the suite's metrics and IS weights against the released verl and TRL.

The metric table (suite/numerics/peers.py) says, for every suite key, which verl and TRL names compute the
same number and in which one convention the others differ. Here the peers' own code runs (tests/peer_runner.py,
in a process of its own, from the pinned and hash-checked wheels that scripts/conformance.sh installs in
.peers/) on the same tensors as the suite: small and large mismatch, -inf padding, a row without response
tokens, a one-token batch, log-ratios beyond 20, float32 and float64, the log-probs of a real transformer in
fp32 vs bf16, and an empty batch. Every `identical` entry must agree to 1e-6 relative (plus the rounding of
the inputs' dtype, below); every other relation must hold exactly as the table states it.

Without the peers installed the tests skip, saying how to install them; in CI (where scripts/test.sh
installs them) a missing peer is a failure.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite.numerics import peers
from suite.numerics.mismatch import mismatch_metrics
from suite.rl.algos import is_weights

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / os.environ.get("SUITE_PEERS", ".peers")  # an absolute SUITE_PEERS replaces ROOT
REQUIREMENTS = ROOT / "scripts" / "peers-requirements.txt"
C = 3.0  # the sanity test's IS threshold, TRL's default clip_max
VERL_IS = {"token_tis": "token", "seq_tis": "sequence"}  # suite correction -> verl rollout_is (threshold C)
TRL_IS = {"token_tis": "token_truncate", "seq_tis": "sequence_truncate", "seq_mis": "sequence_mask"}


def pinned() -> dict[str, str]:
    rows = [line.split()[0] for line in REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    return dict(r.split("==") for r in rows)


def test_the_table_names_the_pinned_versions_and_every_suite_correction_it_maps():
    pins = pinned()
    assert peers.PEERS["verl"].version == pins["verl"] and peers.PEERS["TRL"].version == pins["trl"]
    assert set(peers.CORRECTION_PEERS) == set(TRL_IS) and {c for c, p in peers.CORRECTION_PEERS.items()
                                                           if "verl" in p} == set(VERL_IS)


# ---- the cases ---------------------------------------------------------------------------------------------
def _pair(seed: int, B: int, T: int, noise: float, V: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of sampled tokens under a softmax policy (trainer) and the same logits plus noise (sampler),
    float64, with right-padded responses of random lengths 1..T."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T, 1), generator=g)
    old = torch.log_softmax(logits, -1).gather(-1, tokens)[..., 0]
    rollout = torch.log_softmax(logits + noise * torch.randn(B, T, V, generator=g, dtype=torch.float64), -1)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return old, rollout.gather(-1, tokens)[..., 0], mask


def _transformer_pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random tiny Llama's log-probs of 8 sequences in fp32 (trainer) and in bf16 weights (sampler)."""
    import copy

    from suite.rl.policy import PolicySpec, build_model

    model = build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=128), vocab_size=40).eval()
    ids = torch.randint(3, 40, (8, 17), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = []
        for m in (model, copy.deepcopy(model).to(torch.bfloat16)):
            logp = torch.log_softmax(m(ids).logits.float(), -1)[:, :-1]
            out.append(logp.gather(-1, ids[:, 1:, None])[..., 0])
    mask = (torch.arange(16)[None] < torch.tensor([16, 3, 9, 1, 16, 12, 5, 7])[:, None]).long()
    return out[0], out[1], mask


def build_cases() -> dict[str, dict]:
    cases = {}

    def add(name, old, rollout, mask):
        cases[name] = {"name": name, "old": old, "rollout": rollout, "mask": mask, "C": C}

    old, rollout, mask = _pair(0, 16, 24, 1e-3)
    add("small", old, rollout, mask)
    add("identical", old, old.clone(), mask)
    old, rollout, mask = _pair(1, 16, 24, 1.0)
    add("large", old, rollout, mask)
    off = mask == 0
    add("neg_inf_padding", old.masked_fill(off, -math.inf), rollout.masked_fill(off, -math.inf), mask)
    empty = mask.clone()
    empty[5] = 0  # one row in sixteen without a response token
    add("empty_row", old, rollout, empty)
    add("one_token", *_pair(2, 1, 1, 0.3))
    old, rollout, mask = _pair(3, 8, 6, 0.3)
    old[0, 0], rollout[0, 0] = -0.01, -26.0  # token log-ratio +26: its sequence's sum is beyond +20
    old[1, :2], rollout[1, :2] = -30.0, -0.5  # two tokens at -29.5
    mask[:2] = 1
    add("beyond_20", old, rollout, mask)
    old, rollout, mask = _pair(4, 16, 24, 0.3)
    add("float32", old.float(), rollout.float(), mask)
    old, rollout, mask = _transformer_pair()
    add("transformer_fp32_bf16", old, rollout, mask)
    # the same log-probs in float64, where the peers' float32 rounding (k3's exp(x) - x - 1 keeps ~1e-7
    # absolute in float32, more than this pair's k3) no longer hides a difference of formula
    add("transformer_fp32_bf16_f64", old.double(), rollout.double(), mask)
    old, rollout, _ = _pair(5, 8, 12, 0.3)
    add("equal_lengths", old, rollout, torch.ones(8, 12, dtype=torch.long))
    add("all_masked", old, rollout, torch.zeros(8, 12, dtype=torch.long))
    for name in [n for n, c in cases.items() if _has_empty_row(c) and c["mask"].any()]:
        c = cases[name]
        keep = c["mask"].any(-1)
        add(f"{name}/nonempty", c["old"][keep], c["rollout"][keep], c["mask"][keep])
    return cases


def _has_empty_row(case: dict) -> bool:
    return not bool(case["mask"].any(-1).all())


# ---- running the peers -------------------------------------------------------------------------------------
def _missing() -> str | None:
    pins = pinned()
    for name in ("verl", "trl"):
        if not (PEERS_DIR / f"{name}-{pins[name]}.dist-info").is_dir():
            return (f"{name}=={pins[name]} is not installed in {PEERS_DIR}: run `bash scripts/conformance.sh` "
                    "(it needs the package registry)")
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    cases = build_cases()
    tmp = tmp_path_factory.mktemp("peers")
    torch.save(list(cases.values()), tmp / "cases.pt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEERS_DIR), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "peer_runner.py"), str(tmp / "cases.pt"),
                           str(tmp / "out.pt")], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = torch.load(tmp / "out.pt")
    for peer, (version, path) in out.pop("versions").items():  # the pinned wheels ran, not another copy
        assert version == peers.PEERS[peer].version and Path(path).is_relative_to(PEERS_DIR), (peer, version, path)
    return cases, out


def test_the_released_peers_ran(run):
    cases, out = run
    assert set(out) == set(cases)


# ---- tolerance: 1e-6 relative, plus the rounding of the inputs' dtype ---------------------------------------
def _terms(case: dict) -> dict[str, float]:
    """A bound on the size of the terms each kind of metric sums, in float64. A peer computing in the
    inputs' dtype rounds each term to ~eps of that size (a log-ratio of two inputs to eps of itself, a
    mean of log-probs to eps of the log-probs), and a reduction over n terms adds ~log2(n) more."""
    m = case["mask"].bool()
    old, rollout = case["old"].double(), case["rollout"].double()
    lr = torch.where(m, old - rollout, 0.0)
    a = torch.where(m, old.abs() + rollout.abs(), 0.0)  # verl's perplexities average the log-probs themselves
    x = lr[m].abs()
    rows = m.any(-1)
    n_row = m.sum(-1)[rows]
    seq_x = lr.abs().sum(-1)[rows]
    rho_seq = lr.sum(-1)[rows].clamp(-20, 20).exp()
    return {
        "log": float(x.max()),
        "k3": float((lr[m].exp() * (1 + x) + x + 1).max()),
        "chi2_token": float((lr[m].clamp(-20, 20).exp().square() * (1 + 2 * x)).max()),
        "chi2_seq": float((rho_seq.square() * (1 + 2 * seq_x)).max()),
        "ppl": float(((-lr.sum(-1)[rows] / n_row).exp() * (1 + a.sum(-1)[rows] / n_row)).max()),
        "log_ppl": float((a.sum(-1)[rows] / n_row).max()),
        "token_w": float((lr[m].clamp(-20, 20).exp() * (1 + x)).max()),
        "seq_w": float((rho_seq * (1 + seq_x)).max()),
        "n": int(m.sum()),
    }


SCALE = {"mismatch/kl_k1": "log", "mismatch/logprob_diff/mean": "log", "mismatch/logprob_diff/max": "log",
         "mismatch/log_ppl_diff": "log_ppl", "mismatch/kl_k3": "k3", "mismatch/chi2_token": "chi2_token",
         "mismatch/chi2_seq": "chi2_seq", "mismatch/ppl_ratio": "ppl"}


def close(ours: float, theirs: float, case: dict, key: str, level: str = "", extra_rtol: float = 0.0) -> bool:
    terms = _terms(case)
    scale = terms.get(SCALE.get(key, ""), 1.0)
    if key.startswith("is/"):
        scale = terms["token_w" if level == "token" else "seq_w"]
        scale *= 4.0 if key == "is/ess" else 1.0  # ESS = a ratio of sums of w and w^2
    eps = torch.finfo(case["old"].dtype).eps
    atol = (8 + math.log2(terms["n"] + 1)) * eps * scale
    return math.isclose(ours, theirs, rel_tol=1e-6 + extra_rtol, abs_tol=atol)


# ---- the mismatch metrics ----------------------------------------------------------------------------------
def _peer_value(out_case: dict, peer: str, name: str) -> float:
    if peer == "TRL":
        return float(out_case["TRL"]["token_truncate"]["metrics"][name])
    src = out_case["verl"]["debug" if name.startswith("training/") else "offpolicy"]
    assert "error" not in src, src
    return src[name]


MISMATCH_PAIRS = [(key, c) for peer in ("verl", "TRL") for key, c in peers.counterparts(peer)]
CASES = ["identical", "small", "large", "neg_inf_padding", "empty_row", "one_token", "beyond_20", "float32",
         "transformer_fp32_bf16", "transformer_fp32_bf16_f64", "equal_lengths"]


def test_every_peer_named_mismatch_metric_is_checked():
    names = {(k, c.name) for k, c in MISMATCH_PAIRS}
    assert names >= {("mismatch/kl_k3", "rollout_corr/k3_kl"), ("mismatch/ppl_ratio", "rollout_corr/ppl_ratio"),
                     ("mismatch/logprob_diff/max", "sampling/sampling_logp_difference/max")}


@pytest.mark.parametrize("name", CASES)
def test_mismatch_metrics_equal_the_peers_or_differ_as_declared(run, name):
    cases, out = run
    case = cases[name]
    ours = mismatch_metrics(case["old"], case["rollout"], case["mask"])
    for key, c in MISMATCH_PAIRS:
        theirs = _peer_value(out[name], c.peer, c.name)
        what = f"{name}: {key} vs {c.peer} {c.name} ({c.relation})"
        if c.relation == "identical" or (c.relation == "empty_rows" and not _has_empty_row(case)):
            assert close(ours[key], theirs, case, key), (what, ours[key], theirs)
        elif c.relation == "empty_rows":  # the suite's number is the peer's on the rows that have a response
            assert close(ours[key], _peer_value(out[f"{name}/nonempty"], c.peer, c.name), case, key), what
            assert not close(ours[key], theirs, case, key), what  # and the convention does move it here
        elif c.relation == "sample_std":
            n = int(case["mask"].sum())
            assert (math.isnan(theirs) and ours[key] == 0.0) if n == 1 else \
                close(ours[key], theirs * math.sqrt((n - 1) / n), case, key), (what, ours[key], theirs)
        else:
            raise AssertionError(f"{what}: no check for relation {c.relation!r}")


def test_an_empty_batch_is_nan_here_and_what_the_notes_say_there(run):
    cases, out = run
    case = cases["all_masked"]
    assert all(math.isnan(v) for v in mismatch_metrics(case["old"], case["rollout"], case["mask"]).values())
    assert "error" in out["all_masked"]["verl"]["offpolicy"]  # compute_offpolicy_metrics asserts a token
    assert math.isnan(out["all_masked"]["verl"]["debug"]["training/rollout_probs_diff_mean"])
    assert out["all_masked"]["TRL"]["token_truncate"]["metrics"]["sampling/sampling_logp_difference/mean"] == 0.0


# ---- the IS corrections: applied weights and diagnostics ---------------------------------------------------
def _peer_is(out_case: dict, peer: str, correction: str) -> tuple[torch.Tensor, dict]:
    if peer == "verl":
        res = out_case["verl"][f"is_{VERL_IS[correction]}"]
        assert "error" not in res, res
        return res["weights"], res["metrics"]
    res = out_case["TRL"][TRL_IS[correction]]
    return res["weights"], res["metrics"]


def _is_value(metrics: dict, peer: str, name: str) -> float:
    return float(metrics[name])


@pytest.mark.parametrize("correction", sorted(TRL_IS))
@pytest.mark.parametrize("name", CASES)
def test_is_weights_and_diagnostics_equal_the_peers_or_differ_as_declared(run, name, correction):
    cases, out = run
    case = cases[name]
    level = "token" if correction.startswith("token") else "sequence"
    m = case["mask"].bool()
    weight, ours = is_weights(correction, case["old"], case["rollout"], case["mask"], C)
    weight = weight.expand(m.shape)
    for peer in peers.CORRECTION_PEERS[correction]:
        theirs_w, theirs = _peer_is(out[name], peer, correction)
        w_ours, w_theirs = weight[m].double(), theirs_w.expand(m.shape)[m].double()
        for a, b in zip(w_ours.tolist(), w_theirs.tolist()):  # every applied weight on a response token
            assert close(a, b, case, "is/applied/max", level), (name, correction, peer, a, b)
        for key, c in peers.counterparts(peer, level):
            what = f"{name} {correction}: {key} vs {peer} {c.name} ({c.relation})"
            value = _is_value(theirs, peer, c.name)
            # verl's ESS normalises by (mean weight + 1e-8): 2e-8 / mean relative
            extra = 2e-8 / float(w_theirs.mean()) if c.name.endswith("eff_sample_size") else 0.0
            if c.relation == "identical" or (c.relation == "empty_rows" and not _has_empty_row(case)):
                assert close(ours[key], value, case, key, level, extra), (what, ours[key], value)
            elif c.relation == "empty_rows":
                other = _is_value(_peer_is(out[f"{name}/nonempty"], peer, correction)[1], peer, c.name)
                assert close(ours[key], other, case, key, level, extra), (what, ours[key], other)
            elif c.relation == "token_weighted":  # the same when every row has the same number of tokens
                if bool((m.sum(-1) == m.shape[1]).all()):
                    assert close(ours[key], value, case, key, level, extra), (what, ours[key], value)
            else:
                raise AssertionError(f"{what}: no check for relation {c.relation!r}")


def test_pre_and_post_truncation_diagnostics_differ_where_truncation_bites(run):
    """The suite reports both: is/weight/* before truncation, is/applied/* after (the peers' numbers)."""
    cases, out = run
    case = cases["large"]
    _, ours = is_weights("token_tis", case["old"], case["rollout"], case["mask"], C)
    trl = out["large"]["TRL"]["token_truncate"]["metrics"]
    assert ours["is/truncated_frac"] > 0 and ours["is/weight/max"] > C
    assert ours["is/applied/max"] == C == trl["sampling/importance_sampling_ratio/max"]
