"""Math rewards: extraction, normalisation, the published R1 reward, and a symbolic check that
never hangs (hard timeout in a worker process that is killed and restarted)."""

import time

import pytest

from suite.tasks import math_reward as mr
from suite.tasks.math_reward import (
    gsm8k_answer,
    gsm8k_extract,
    gsm8k_reward,
    last_boxed,
    r1_reward,
    strip_string,
    think_answer,
)

TIMEOUT = 2.0  # seconds per symbolic check in these tests
MARGIN = 3.0  # killing the worker and returning; generous for a busy 2-core machine


@pytest.fixture(scope="module", autouse=True)
def worker():
    """Pay the worker's imports once, outside any timed call."""
    mr.verifier().warm_up()
    yield mr.verifier()


def r1(answer_part: str, truth: str, truncated: bool = False) -> float:
    return r1_reward("Let me think... 1+1=2, so</think>\n\n" + answer_part, truth, truncated,
                     timeout=TIMEOUT)


def timed(fn, *args, **kwargs):
    mr.verifier().warm_up()  # a restart after an earlier timeout is not part of the timed call
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


# ---------------------------------------------------------------------------- extraction

@pytest.mark.parametrize("text, box", [
    (r"so \boxed{\frac{1}{\sqrt{2}}}.", r"\frac{1}{\sqrt{2}}"),  # nested braces
    (r"\boxed{1} or rather \boxed{2}", "2"),  # the last box wins
    (r"\boxed{}", ""),  # empty
    (r"$\boxed 5$", "5"),
    (r"\fbox{7}", "7"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"\boxed{3} and then \boxed{4", None),  # the last box never closes: truncated inside it
    ("no box here", None),
    (r"\boxedx{3}", None),  # another macro
])
def test_last_boxed(text, box):
    assert last_boxed(text) == box


def test_think_answer_needs_exactly_one_close_tag():
    assert think_answer("a</think>b") == "b"
    assert think_answer("ab") is None
    assert think_answer("a</think>b</think>c") is None


@pytest.mark.parametrize("raw, norm", [
    (r"\dfrac{3}{4}", r"\frac{3}{4}"),
    (r"\tfrac12", r"\frac{1}{2}"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"10\text{ cm}", "10"),
    (r"5 \text{ inches}", "5"),
    ("12 ways", "12"),
    (r"\text{(A)}", "(A)"),
    (r"90^\circ", "90"),
    (r"50\%", "50"),
    (r"\$5.00", "5.00"),
    ("x = 2", "2"),
    (r"\sqrt3", r"\sqrt{3}"),
    (r"\sqrt[3]{2}", r"\sqrt[3]{2}"),
    ("1,000,000", "1000000"),
    ("3/4", r"\frac{3}{4}"),
    (".5", "0.5"),
    ("7.", "7"),
])
def test_strip_string(raw, norm):
    assert strip_string(raw) == norm


# ---------------------------------------------------------------------------- the R1 reward

@pytest.mark.parametrize("answer, truth", [
    (r"The answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"$\boxed{0.5}$", r"\frac{1}{2}"),  # decimal vs fraction: math-verify
    (r"$\boxed{\dfrac{1}{2}}$", r"\frac12"),
    (r"$\boxed{\frac{\sqrt2}{2}}$", r"\sqrt{2}/2"),  # equivalent forms: math-verify
    (r"$\boxed{\frac{1}{\sqrt{2}}}$", r"\frac{\sqrt{2}}{2}"),  # nested braces, rationalised
    (r"$\boxed{x=2}$", "2"),
    (r"$\boxed{10\text{ cm}}$", "10"),  # units in the box
    (r"$\boxed{\text{(B)}}$", r"\text{(B)}"),
    (r"$\boxed{1{,}000}$", "1000"),
    (r"First \boxed{3}, no wait: \boxed{4}", "4"),  # several boxes: the last wins
    (r"\boxed{(x+1)^2}", "x^2+2x+1"),
])
def test_r1_reward_accepts_equivalent_answers(answer, truth):
    assert r1(answer, truth) == 1.0


@pytest.mark.parametrize("answer, truth", [
    (r"First \boxed{4}, no wait: \boxed{3}", "4"),  # the last box is wrong
    (r"\boxed{}", "4"),  # empty box
    ("The answer is 4.", "4"),  # no box
    (r"\boxed{0.33}", r"\frac{1}{3}"),
    (r"\boxed{5}", "4"),
])
def test_r1_reward_rejects_wrong_answers(answer, truth):
    assert r1(answer, truth) == 0.0


def test_r1_reward_format_rules():
    good = r"reasoning</think> so $\boxed{4}$"
    assert r1_reward(good, "4", truncated=False) == 1.0
    assert r1_reward(good, "4", truncated=True) == 0.0  # truncated
    assert r1_reward(r"reasoning so $\boxed{4}$", "4", truncated=False) == 0.0  # no </think>
    assert r1_reward(r"a</think>b</think> $\boxed{4}$", "4", truncated=False) == 0.0  # two </think>
    # box before </think>
    assert r1_reward(r"$\boxed{4}$ reasoning</think> none after", "4", truncated=False) == 0.0


# ---------------------------------------------------------------------------- adversarial inputs

def test_huge_expression_is_refused_quickly():
    before = mr.counters()
    # Refused before math-verify sees it (the counters say so), not timed out: no wall-clock bound
    # needed.
    score = r1(r"\boxed{" + "1+" * 50_000 + "1}", "100001")  # 100 kB
    after = mr.counters()
    assert score == 0.0
    assert after["refused"] == before["refused"] + 1 and after["timeouts"] == before["timeouts"]
    # a long response is fine (a timeout would score 0)
    assert r1("x" * 100_000 + r"\boxed{2}", "2") == 1.0
    assert mr.counters()["timeouts"] == before["timeouts"]


def test_deep_fraction_tower_is_refused_quickly():
    before = mr.counters()
    tower = "\\frac{1}{" * 300 + "1" + "}" * 300  # 3 kB, 300 deep
    assert r1("$\\boxed{" + tower + "}$", "1") == 0.0
    after = mr.counters()
    assert after["refused"] == before["refused"] + 1 and after["timeouts"] == before["timeouts"]


def test_moderate_tower_returns_within_timeout():
    tower = "\\frac{1}{" * 60 + "1" + "}" * 60  # under the size limit: math-verify gets it
    (score, dt) = timed(r1, "$\\boxed{" + tower + "}$", "1")
    assert score in (0.0, 1.0) and dt < TIMEOUT + MARGIN  # the right answer, or a timeout


def test_pathological_power_times_out_and_the_worker_recovers(worker):
    before = mr.counters()
    pid = worker._proc.pid
    # sympy computes 9^(9^9) in C: only a kill stops it
    (score, dt) = timed(r1, r"$\boxed{9^{9^{9^{9}}}}$", "1")
    assert score == 0.0 and TIMEOUT <= dt < TIMEOUT + MARGIN
    assert mr.counters()["timeouts"] == before["timeouts"] + 1
    # A fresh worker answers the next check.
    (score, _) = timed(r1, r"$\boxed{0.5}$", r"\frac{1}{2}")
    assert score == 1.0 and worker._proc.pid != pid
    assert mr.counters()["timeouts"] == before["timeouts"] + 1


def test_dead_worker_scores_zero_and_restarts(worker):
    before = mr.counters()
    worker._proc.kill()
    worker._proc.wait()
    # the worker was gone mid-call: 0, never a crash
    assert r1(r"$\boxed{0.5}$", r"\frac{1}{2}") == 0.0
    assert mr.counters()["crashes"] == before["crashes"] + 1
    assert r1(r"$\boxed{0.5}$", r"\frac{1}{2}") == 1.0


# ---------------------------------------------------------------------------- GSM8K

def test_gsm8k_answer():
    assert gsm8k_answer("She has 3+4=<<3+4=7>>7 apples.\n#### 1,234") == "1234"
    assert gsm8k_answer("#### -5") == "-5"


@pytest.mark.parametrize("response, number", [
    ("so the total is 72.\n#### 72", "72"),
    ("#### 1,234 dollars", "1234"),
    ("#### 12 then more text 99", "12"),  # the first number after the last ####
    ("#### 5\nno wait\n#### 6", "6"),
    (r"Total: $\boxed{\$18}$.", "18"),
    (r"\boxed{18 \text{ apples}}", "18"),
    ("first 3 then 4 and finally 5.", "5"),  # the last number
    ("The answer is -2.5.", "-2.5"),
    ("no number", None),
    (r"\boxed{x}", None),
])
def test_gsm8k_extract(response, number):
    assert gsm8k_extract(response) == number


def test_gsm8k_reward():
    assert gsm8k_reward("#### 72", "72", truncated=False) == 1.0
    assert gsm8k_reward("#### 72.00", "72", truncated=False) == 1.0
    assert gsm8k_reward("#### 72", "72", truncated=True) == 0.0
    assert gsm8k_reward("#### 71", "72", truncated=False) == 0.0
    assert gsm8k_reward("thinking 72</think> \\boxed{72}", "72", truncated=False,
                        require_think=True) == 1.0
    assert gsm8k_reward("thinking 72 \\boxed{72}", "72", truncated=False, require_think=True) == 0.0
