"""Under a peer's name, the peer's number: the suite's metrics and IS weights against the released
verl and TRL.

The metric table (suite/numerics/peers.py) says, for every suite key, which verl and TRL names
compute the same number and in which one convention the others differ. Here the peers' own code runs
(tests/peer_runner.py, in a process of its own, from the pinned and hash-checked wheels that
scripts/conformance.sh installs in .peers/) on the same tensors as the suite: small and large
mismatch, -inf padding, a row without response tokens, a one-token batch, log-ratios beyond 20,
float32 and float64, the log-probs of a real transformer in fp32 vs bf16, responses of unequal
lengths with and without an empty row, and an empty batch. Every `identical` entry must agree to
1e-6 relative (plus the rounding of the inputs' dtype, below); every other relation must hold
exactly as the table states it: the peer's number is the relation's convention computed by hand from
the suite's, the suite's is its own, and the two are apart wherever the convention moves them.

The end of the run prints the peer versions the runner imported (tests/conftest.py). Without the
peers installed the tests skip, saying how to install them (that line says it too); in CI (where
scripts/test.sh installs them) a missing peer is a failure.
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
# suite correction -> verl rollout_is (threshold C)
VERL_IS = {"token_tis": "token", "seq_tis": "sequence"}
TRL_IS = {"token_tis": "token_truncate", "seq_tis": "sequence_truncate", "seq_mis": "sequence_mask"}


def pinned() -> dict[str, str]:
    rows = [line.split()[0] for line in REQUIREMENTS.read_text().splitlines() if line
            and not line.startswith("#")]
    return dict(r.split("==") for r in rows)


def test_the_table_names_the_pinned_versions_and_every_suite_correction_it_maps():
    pins = pinned()
    assert peers.PEERS["verl"].version == pins["verl"] and peers.PEERS["TRL"].version == pins["trl"]
    assert set(peers.CORRECTION_PEERS) == set(TRL_IS) and {
        c for c, p in peers.CORRECTION_PEERS.items() if "verl" in p} == set(VERL_IS)


# ---- the cases
# ---------------------------------------------------------------------------------------------
def _pair(seed: int, B: int, T: int, noise: float,
          V: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of sampled tokens under a softmax policy (trainer) and the same logits plus noise
    (sampler), float64, with right-padded responses of random lengths 1..T."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T, 1), generator=g)
    old = torch.log_softmax(logits, -1).gather(-1, tokens)[..., 0]
    rollout = torch.log_softmax(logits
                                + noise * torch.randn(B, T, V, generator=g, dtype=torch.float64),
                                -1)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return old, rollout.gather(-1, tokens)[..., 0], mask


def _transformer_pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random tiny Llama's log-probs of 8 sequences in fp32 (trainer) and in bf16 weights
    (sampler)."""
    import copy

    from suite.rl.policy import PolicySpec, build_model

    model = build_model(PolicySpec(hidden=64, layers=2, heads=4, kv_heads=2, mlp=128),
                        vocab_size=40).eval()
    ids = torch.randint(3, 40, (8, 17), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = []
        for m in (model, copy.deepcopy(model).to(torch.bfloat16)):
            logp = torch.log_softmax(m(ids).logits.float(), -1)[:, :-1]
            out.append(logp.gather(-1, ids[:, 1:, None])[..., 0])
    mask = (torch.arange(16)[None] < torch.tensor([16, 3, 9, 1, 16, 12, 5, 7])[:, None]).long()
    return out[0], out[1], mask


# Token log-ratios (trainer minus sampler) of four responses of 1, 2, 4 and 6 tokens, written out so
# that the sequence weights can be read off: exp(1.5) = 4.48 (above C = 3, truncated), exp(0.25),
# exp(0.6), exp(0.1). A token-weighted mean counts the last sequence six times and the first once,
# so verl's sequence-level mean and ESS move away from the suite's (each sequence once) by an amount
# a reader can check by hand.
UNEQUAL = ((1.5,), (0.5, -0.25), (0.3, 0.2, -0.1, 0.2), (0.1, -0.1, 0.05, 0.05, 0.1, -0.1))


def _unequal_pair(empty_row_at: int | None = None) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [list(r) for r in UNEQUAL]
    if empty_row_at is not None:
        rows.insert(empty_row_at, [])
    T = max(len(r) for r in rows)
    rollout = -2.0 - 0.1 * torch.arange(T, dtype=torch.float64).expand(len(rows), T)  # (B, T)
    delta = torch.tensor([r + [0.0] * (T - len(r)) for r in rows], dtype=torch.float64)
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return rollout + delta, rollout.clone(), mask


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
    add("neg_inf_padding", old.masked_fill(off, -math.inf), rollout.masked_fill(off, -math.inf),
        mask)
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
    # the same log-probs in float64, where the peers' float32 rounding (k3's exp(x) - x - 1 keeps
    # ~1e-7 absolute in float32, more than this pair's k3) no longer hides a difference of formula
    add("transformer_fp32_bf16_f64", old.double(), rollout.double(), mask)
    old, rollout, _ = _pair(5, 8, 12, 0.3)
    add("equal_lengths", old, rollout, torch.ones(8, 12, dtype=torch.long))
    add("all_masked", old, rollout, torch.zeros(8, 12, dtype=torch.long))
    add("unequal_lengths", *_unequal_pair())
    old, rollout, mask = _unequal_pair(empty_row_at=2)
    # every sequence weight above 1, one above C
    add("unequal_lengths_empty_row", old, rollout, mask)
    add("unequal_lengths_empty_row_swapped", rollout, old, mask)  # every sequence weight below 1
    # every sequence weight in (1, C]: none masked, so an empty row's weight 1 is the smallest, MIS
    # included
    add("unequal_lengths_empty_row_halved", (old + rollout) / 2, rollout, mask)
    for name in [n for n, c in cases.items() if _has_empty_row(c) and c["mask"].any()]:
        c = cases[name]
        keep = c["mask"].any(-1)
        add(f"{name}/nonempty", c["old"][keep], c["rollout"][keep], c["mask"][keep])
    return cases


def _has_empty_row(case: dict) -> bool:
    return not bool(case["mask"].any(-1).all())


# The `empty_rows` relation by hand: each of these suite keys reduces a per-sequence value over the
# n rows with a response token; the peer also counts the k rows without one, as sequences with
# log-ratio 0, whose value is this (chi2_seq: the mean of rho_seq^2 - 1; truncated_frac: the mean of
# [w > C], 0 as 1 <= C).
EMPTY_ROW_VALUE = {"mismatch/log_ppl_diff": 0.0, "mismatch/ppl_ratio": 1.0,
                   "mismatch/chi2_seq": 0.0, "is/weight/max": 1.0, "is/applied/mean": 1.0,
                   "is/applied/min": 1.0, "is/applied/max": 1.0, "is/truncated_frac": 0.0}


def counting_empty_rows(key: str, ours: float, case: dict) -> float:
    """The suite's `key` (over the rows with a response token) as the peer computes it, counting the
    rest."""
    has = case["mask"].bool().any(-1)
    n, k = int(has.sum()), int((~has).sum())
    row = EMPTY_ROW_VALUE[key]
    if key.endswith("/max"):
        return max(ours, row)
    if key.endswith("/min"):
        return min(ours, row)
    return (n * ours + k * row) / (n + k)


# ---- running the peers
# -------------------------------------------------------------------------------------
def _missing() -> str | None:
    pins = pinned()
    for name in ("verl", "trl"):
        if not (PEERS_DIR / f"{name}-{pins[name]}.dist-info").is_dir():
            return (f"{name}=={pins[name]} is not installed in {PEERS_DIR}: run `bash "
                    "scripts/conformance.sh` (it needs the package registry)")
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory, peers_ran):
    why = _missing()
    if why:
        peers_ran[""] = why  # conftest.py prints it at the end of the run
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    cases = build_cases()
    tmp = tmp_path_factory.mktemp("peers")
    torch.save(list(cases.values()), tmp / "cases.pt")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(PEERS_DIR), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "peer_runner.py"),
                           str(tmp / "cases.pt"), str(tmp / "out.pt")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = torch.load(tmp / "out.pt")
    # the pinned wheels ran, not another copy
    for peer, (version, path) in out.pop("versions").items():
        # as the runner imported it; printed at the end
        peers_ran[peer] = f"{version} ({Path(path).parent})"
        assert (version == peers.PEERS[peer].version
                and Path(path).is_relative_to(PEERS_DIR)), (peer, version, path)
    return cases, out


def test_the_released_peers_ran(run):
    cases, out = run
    assert set(out) == set(cases)


# ---- tolerance: 1e-6 relative, plus the rounding of the inputs' dtype
# ---------------------------------------
def _terms(case: dict) -> dict[str, float]:
    """A bound on the size of the terms each kind of metric sums, in float64. A peer computing in
    the inputs' dtype rounds each term to ~eps of that size (a log-ratio of two inputs to eps of
    itself, a mean of log-probs to eps of the log-probs), and a reduction over n terms adds ~log2(n)
    more."""
    m = case["mask"].bool()
    old, rollout = case["old"].double(), case["rollout"].double()
    lr = torch.where(m, old - rollout, 0.0)
    # verl's perplexities average the log-probs themselves
    a = torch.where(m, old.abs() + rollout.abs(), 0.0)
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


SCALE = {"mismatch/kl_k1": "log", "mismatch/logprob_diff/mean": "log",
         "mismatch/logprob_diff/max": "log", "mismatch/log_ppl_diff": "log_ppl",
         "mismatch/kl_k3": "k3", "mismatch/chi2_token": "chi2_token",
         "mismatch/chi2_seq": "chi2_seq", "mismatch/ppl_ratio": "ppl"}


def close(ours: float, theirs: float, case: dict, key: str, level: str = "",
          extra_rtol: float = 0.0) -> bool:
    terms = _terms(case)
    scale = terms.get(SCALE.get(key, ""), 1.0)
    if key.startswith("is/"):
        scale = terms["token_w" if level == "token" else "seq_w"]
        scale *= 4.0 if key == "is/ess" else 1.0  # ESS = a ratio of sums of w and w^2
    eps = torch.finfo(case["old"].dtype).eps
    atol = (8 + math.log2(terms["n"] + 1)) * eps * scale
    return math.isclose(ours, theirs, rel_tol=1e-6 + extra_rtol, abs_tol=atol)


# ---- the mismatch metrics
# ----------------------------------------------------------------------------------
def _peer_value(out_case: dict, peer: str, name: str) -> float:
    if peer == "TRL":
        return float(out_case["TRL"]["token_truncate"]["metrics"][name])
    src = out_case["verl"]["debug" if name.startswith("training/") else "offpolicy"]
    assert "error" not in src, src
    return src[name]


MISMATCH_PAIRS = [(key, c) for peer in ("verl", "TRL") for key, c in peers.counterparts(peer)]
CASES = ["identical", "small", "large", "neg_inf_padding", "empty_row", "one_token", "beyond_20",
         "float32", "transformer_fp32_bf16", "transformer_fp32_bf16_f64", "equal_lengths",
         "unequal_lengths", "unequal_lengths_empty_row", "unequal_lengths_empty_row_swapped",
         "unequal_lengths_empty_row_halved"]


def test_every_peer_named_mismatch_metric_is_checked():
    names = {(k, c.name) for k, c in MISMATCH_PAIRS}
    assert names >= {("mismatch/kl_k3", "rollout_corr/k3_kl"),
                     ("mismatch/ppl_ratio", "rollout_corr/ppl_ratio"),
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
        # the suite's number is the peer's on the rows that have a response
        elif c.relation == "empty_rows":
            assert close(ours[key], _peer_value(out[f"{name}/nonempty"], c.peer, c.name), case,
                         key), what
            assert close(theirs, counting_empty_rows(key, ours[key], case), case,
                         key), (what, theirs)
            # and the convention does move it here
            assert not close(ours[key], theirs, case, key), what
        elif c.relation == "sample_std":
            n = int(case["mask"].sum())
            assert (math.isnan(theirs) and ours[key] == 0.0) if n == 1 else \
                close(ours[key], theirs * math.sqrt((n - 1) / n), case, key), (what, ours[key],
                                                                               theirs)
        else:
            raise AssertionError(f"{what}: no check for relation {c.relation!r}")


def test_an_empty_batch_gives_what_the_table_says_for_each(run):
    """Each line of peers.EMPTY_BATCH (docs/metrics.md, "An empty batch"), on the suite's and the
    peers' code."""
    cases, out = run
    case, there = cases["all_masked"], out["all_masked"]
    assert set(peers.EMPTY_BATCH) == {"suite", "verl", "TRL"}
    # suite: NaN for every mismatch metric and IS diagnostic
    assert all(math.isnan(v)
               for v in mismatch_metrics(case["old"], case["rollout"], case["mask"]).values())
    for correction in TRL_IS:
        _, ours = is_weights(correction, case["old"], case["rollout"], case["mask"], C)
        assert all(math.isnan(v) for v in ours.values()), correction
    # verl: compute_offpolicy_metrics asserts, the IS entry point raises ValueError; the debug
    # metrics are NaN
    assert there["verl"]["offpolicy"]["error"].startswith("AssertionError")
    for level in ("token", "sequence"):
        assert there["verl"][f"is_{level}"]["error"].startswith("ValueError")
    assert all(math.isnan(there["verl"]["debug"][f"training/rollout_probs_diff_{r}"])
               for r in ("mean", "max", "std"))
    # TRL: 0.0 for the log-prob differences and the token-level ratios; 1.0 for the sequence-level
    # ratios
    assert set(there["TRL"]) == {"token_truncate", "token_mask", "sequence_truncate",
                                 "sequence_mask"}
    for mode, res in there["TRL"].items():
        got = res["metrics"]
        assert (got["sampling/sampling_logp_difference/mean"]
                == got["sampling/sampling_logp_difference/max"] == 0.0)
        ratio = 0.0 if mode.startswith("token") else 1.0
        assert all(got[f"sampling/importance_sampling_ratio/{r}"] == ratio
                   for r in ("min", "mean", "max")), mode


# ---- the IS corrections: applied weights and diagnostics
# ---------------------------------------------------
def _peer_is(out_case: dict, peer: str, correction: str) -> tuple[torch.Tensor, dict]:
    if peer == "verl":
        res = out_case["verl"][f"is_{VERL_IS[correction]}"]
        assert "error" not in res, res
        return res["weights"], res["metrics"]
    res = out_case["TRL"][TRL_IS[correction]]
    return res["weights"], res["metrics"]


def _is_value(metrics: dict, peer: str, name: str) -> float:
    return float(metrics[name])


def token_weighted(key: str, weight: torch.Tensor, m: torch.Tensor) -> tuple[float, float]:
    """The `token_weighted` relation by hand, from the suite's applied sequence weights w_s ((B, 1))
    and the response-token counts n_s: (the peer's number, each sequence counted n_s times; the
    suite's, once each)."""
    rows = m.any(-1)
    # (S,) over the rows with a response
    w, n = weight[:, 0][rows].double(), m.sum(-1)[rows].double()
    if key == "is/applied/mean":
        return float((n * w).sum() / n.sum()), float(w.mean())
    if key == "is/ess":
        return (float((n * w).sum() ** 2 / (n.sum() * (n * w.square()).sum())),
                float(w.sum() ** 2 / (w.numel() * w.square().sum())))
    raise AssertionError(f"no hand computation of the token_weighted relation for {key}")


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
        # every applied weight on a response token
        for a, b in zip(w_ours.tolist(), w_theirs.tolist()):
            assert close(a, b, case, "is/applied/max", level), (name, correction, peer, a, b)
        for key, c in peers.counterparts(peer, level):
            what = f"{name} {correction}: {key} vs {peer} {c.name} ({c.relation})"
            value = _is_value(theirs, peer, c.name)
            # verl's ESS normalises by (mean weight + 1e-8): 2e-8 / mean relative
            extra = 2e-8 / float(w_theirs.mean()) if c.name.endswith("eff_sample_size") else 0.0
            if c.relation == "identical" or (c.relation == "empty_rows"
                                             and not _has_empty_row(case)):
                assert close(ours[key], value, case, key, level, extra), (what, ours[key], value)
                continue
            # the suite's number is the peer's on the rows that have a response
            if c.relation == "empty_rows":
                suite_way = _is_value(_peer_is(out[f"{name}/nonempty"], peer, correction)[1], peer,
                                      c.name)
                peer_way = counting_empty_rows(key, ours[key], case)
            elif c.relation == "token_weighted":
                peer_way, suite_way = token_weighted(key, weight, m)
            else:
                raise AssertionError(f"{what}: no check for relation {c.relation!r}")
            assert close(value, peer_way, case, key, level,
                         extra), (what, "the peer's convention", value, peer_way)
            assert close(ours[key], suite_way, case, key, level,
                         extra), (what, "the suite's", ours[key], suite_way)
            # where the convention bites, it shows
            if not close(peer_way, suite_way, case, key, level, extra):
                assert not close(ours[key], value, case, key, level,
                                 extra), (what, ours[key], value)


def test_every_declared_is_difference_shows_on_some_case(run):
    """A declared difference is only tested if some case moves the number: the test above asserts it
    apart wherever the convention bites, and here every non-identical IS entry must bite at least
    once (the mean and ESS on unequal lengths, max on a batch whose sequence weights are all below
    1, min all above (and within C, for MIS), the truncated fraction where a sequence exceeds C)."""
    cases, out = run
    declared, shown = set(), set()
    for correction, by_peer in peers.CORRECTION_PEERS.items():
        level = "token" if correction.startswith("token") else "sequence"
        for peer in by_peer:
            declared |= {(correction, peer, k, c.name) for k, c in peers.counterparts(peer, level)
                         if c.relation != "identical"}
            for name in CASES:
                case = cases[name]
                _, ours = is_weights(correction, case["old"], case["rollout"], case["mask"], C)
                theirs = _peer_is(out[name], peer, correction)[1]
                shown |= {(correction, peer, k, c.name) for k, c in peers.counterparts(peer, level)
                          if c.relation != "identical"
                          and not close(ours[k], _is_value(theirs, peer, c.name), case, k, level,
                                        1e-6)}
    assert declared and shown == declared, sorted(declared - shown)


def test_pre_and_post_truncation_diagnostics_differ_where_truncation_bites(run):
    """The suite reports both: is/weight/* before truncation, is/applied/* after (the peers'
    numbers)."""
    cases, out = run
    case = cases["large"]
    _, ours = is_weights("token_tis", case["old"], case["rollout"], case["mask"], C)
    trl = out["large"]["TRL"]["token_truncate"]["metrics"]
    assert ours["is/truncated_frac"] > 0 and ours["is/weight/max"] > C
    assert ours["is/applied/max"] == C == trl["sampling/importance_sampling_ratio/max"]
