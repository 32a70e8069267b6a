"""Rule-based rewards for math answers: extraction, normalisation, and a symbolic check that
can never hang the run.

The published sanity test (arXiv 2510.26788; Precision-RL runs it with Oat's
``r1_distill_qwen_math_reward_fn``, github.com/sail-sg/oat ``oat/utils/math_grader.py``) scores a
response 1 iff

1. it was not truncated (it ended with EOS),
2. it contains exactly one ``</think>`` (the R1-distill chat template opens ``<think>`` in the
   prompt, so the response holds the end of the thinking and then the answer),
3. the last ``\\boxed{...}`` after that ``</think>`` equals the ground truth: first as normalised
   strings, then symbolically with ``math-verify`` (HuggingFace), under a timeout that scores 0.

Normalisation follows Hendrycks et al.'s MATH ``is_equiv``/``_strip_string``
(github.com/hendrycks/math ``modeling/math_equivalence.py``), which Oat's ``mathd_normalize_answer``
and VeRL's ``verl/utils/reward_score/math.py`` copy, plus the unit/``\\text{}`` clean-up of
Minerva's ``normalize_final_answer`` (arXiv 2206.14858, p. 18; VeRL ``math_dapo.py``). The symbolic
step mirrors VeRL's ``math_verify.py`` reward: both sides wrapped in ``\\boxed{}`` and parsed with
``math_verify.parse``, then ``math_verify.verify(gold, pred)``.

Why a separate process: sympy can spend unbounded time *inside C code* (``9^{9^{9^{9}}}`` asks it
for 9^(9^9), an integer of ~370 million digits, on the way), where no Python signal (math-verify's
own ``signal.alarm`` timeout, Oat's ``timeout`` context) can interrupt it, and a deep parse can
exhaust the stack. So the check runs in one persistent worker process (a fresh interpreter, never
a fork of a process holding torch threads; see ``SymbolicVerifier``); a call that exceeds its hard
timeout kills the worker, scores 0 and is counted (``counters()["timeouts"]``, logged by the run as
``reward/timeouts``); a replacement starts at once in the background. Inputs are also refused before
any parsing when a box is longer than ``MAX_ANSWER_CHARS`` (counted as ``refused``): no real answer
is that long, and the parse time of math-verify grows superlinearly with length (a 200-deep
``\\frac`` tower takes ~4 s).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import queue
import re
import subprocess
import sys
import threading
from collections import Counter
from decimal import Decimal, InvalidOperation

# A box (or ground truth) longer than this scores 0 without being parsed. The longest answers in
# MATH are small matrices and tuples (a few hundred characters); AIME answers are integers.
MAX_ANSWER_CHARS = 1000
# Default hard timeout of one symbolic check, in seconds. Oat uses 1 s per response on idle
# GPU hosts; 5 s leaves room for a busy CPU. Each task file may set its own (`reward.timeout`).
DEFAULT_TIMEOUT = 5.0
# How long a (re)started worker may take to import sympy/math-verify before we give up loudly.
STARTUP_TIMEOUT = 120.0

log = logging.getLogger(__name__)
# the directory holding `suite/`
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------- extraction

def think_answer(response: str) -> str | None:
    """The text after the single ``</think>``, or None when there are zero or several (Oat's
    ``r1_distill_qwen_math_reward_fn``: ``len(response.split("</think>")) == 2``)."""
    parts = response.split("</think>")
    return parts[1] if len(parts) == 2 else None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (nested braces kept),
    ``"5"`` for ``\\boxed 5``, ``""`` for an empty box; None when there is no box or the last box
    is never closed (e.g. a response cut inside it). The last box wins even if an earlier one
    is well formed: that is the answer the model committed to (Hendrycks'
    ``last_boxed_only_string``)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    j = i
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        for k in range(j, len(text)):
            c = text[k]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k]
        return None
    if j == i:  # "\boxedx" is another macro name, not a box
        return None
    # "\boxed 5$": the argument is the next token (Hendrycks' ``remove_boxed`` "\\boxed " case).
    m = re.match(r"[^\s$]+", text[j:])
    return m.group(0).rstrip(".") if m else None


# ---------------------------------------------------------------------------- normalisation

# Trailing unit words removed after a number (subset of Minerva's REMOVED_EXPRESSIONS).
_UNITS = ("units", "unit", "cm", "meters", "meter", "inches", "inch", "feet", "foot", "ft", "miles",
          "mile", "mph", "km", "hours", "hour", "minutes", "minute", "seconds", "second", "days",
          "day", "degrees", "degree", "dollars", "dollar", "cents", "cent", "points", "ways",
          "square")
_TRAILING_UNIT = re.compile(r"^(.*?\d)\s*(?:" + "|".join(_UNITS) + r")(?:\^?\{?[23]\}?)?$")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm|mathbf)\{([^{}]*)\}")
_TRAILING_TEXT = re.compile(r"^(.*\S)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$")


def strip_string(s: str) -> str:
    """Normalise an answer string for exact comparison (Hendrycks MATH ``_strip_string``, plus
    Minerva's unit and ``\\text{}`` clean-up). Purely syntactic: ``0.5`` vs ``\\frac{1}{2}`` is
    left to math-verify. Call only on strings of at most ``MAX_ANSWER_CHARS``."""
    s = s.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    # Units: "10\text{ cm}" -> "10" (a trailing text group after a value), then "\text{east}" ->
    # "east".
    m = _TRAILING_TEXT.match(s)
    if m and any(ch.isdigit() for ch in m.group(1)):
        s = m.group(1)
    s = _TEXT.sub(r"\1", s).strip()
    m = _TRAILING_UNIT.match(s)
    if m:
        s = m.group(1)
    # Thin spaces and friends are only layout.
    for space in ("\\,", "\\;", "\\:", "\\ ", "~"):
        s = s.replace(space, " ")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    # "x = 5", "k=5" -> "5": a short left side is a variable name (Hendrycks).
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0].strip()) <= 2:
        s = parts[1]
    s = s.replace(" ", "")
    # \sqrt3 -> \sqrt{3}; \frac12 -> \frac{1}{2}; \frac1{7} -> \frac{1}{7}; \frac{1}7 ->
    # \frac{1}{7}.
    s = re.sub(r"\\sqrt([^{\\\[])", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac([^{\\])([^{\\])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([^{\\])\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}([^{\\])", r"\\frac{\1}{\2}", s)
    s = s.rstrip(".")
    # "1,000,000" -> "1000000" (thousands separators, not tuples: every group has 3 digits).
    if re.fullmatch(r"-?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?", s):
        s = s.replace("{,}", "").replace(",", "")
    # "3/4" -> "\frac{3}{4}" for plain integer ratios (the MATH answers write fractions as \frac).
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    if m:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    return s


def _numbers_equal(a: str, b: str) -> bool:
    """Exact decimal equality of two plain numbers ("5.0" == "5"); False when either is not one."""
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return False


# ---------------------------------------------------------------------------- the guarded symbolic
# check

_COUNTS: Counter = Counter()
_COUNT_LOCK = threading.Lock()  # rewards may be graded from several threads (reward_workers)


def _count(key: str) -> None:
    with _COUNT_LOCK:
        _COUNTS[key] += 1


def counters() -> dict:
    """Cumulative counts since the process started: ``timeouts`` (a symbolic check killed after its
    hard timeout), ``refused`` (an answer over ``MAX_ANSWER_CHARS``), ``crashes`` (the worker died),
    ``symbolic`` (checks that reached math-verify). Log deltas per step (``reward/timeouts``)."""
    return {k: _COUNTS[k] for k in ("timeouts", "refused", "crashes", "symbolic")}


def _worker_main(conn) -> None:
    """Worker loop: receive (gold, pred), answer math-verify's verdict. Timeouts live in the
    parent."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify", "latex2sympy2_extended"):
        # "timeout is disabled" warnings: the parent owns it
        logging.getLogger(name).setLevel(logging.CRITICAL)
    config = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
    conn.send("ready")
    while True:
        try:
            gold, pred = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        try:
            g = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=None)
            p = parse("\\boxed{" + pred + "}", extraction_config=config, parsing_timeout=None)
            ok = bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))
        except BaseException:  # noqa: BLE001 - RecursionError on deep nesting, sympy internals: not equal
            ok = False
        conn.send(ok)


class SymbolicVerifier:
    """One persistent math-verify worker with a hard per-call timeout (state: the process).

    The worker is a fresh interpreter (``python -m suite.tasks.math_reward FD``) that talks over a
    ``multiprocessing.Pipe`` whose child end it inherits: the same pickled messages and ``poll``
    as a ``spawn`` Process, without spawn's re-import of the parent's ``__main__`` (which re-runs
    an unguarded training script, and costs a guarded one its torch imports on every restart).
    POSIX only (``pass_fds``).
    """

    def __init__(self, startup_timeout: float = STARTUP_TIMEOUT):
        self.startup_timeout = startup_timeout
        self._proc = self._conn = None
        self._ready = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Launch a worker without waiting for it (its imports take ~1-3 s)."""
        parent, child = mp.Pipe()
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join([_ROOT,
                                               os.environ.get("PYTHONPATH",
                                                              "")]).rstrip(os.pathsep))
        self._proc = subprocess.Popen([sys.executable, "-m", "suite.tasks.math_reward",
                                       str(child.fileno())],
                                      pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env,
                                      cwd=_ROOT)
        child.close()
        self._conn, self._ready = parent, False

    def warm_up(self) -> None:
        """Block until the worker is ready (so that no timed call pays for its imports)."""
        with self._lock:
            self._wait_ready()

    def _wait_ready(self) -> None:
        if self._proc is None:
            self.start()
        if self._ready:
            return
        msg = None
        try:
            if self._conn.poll(self.startup_timeout):
                msg = self._conn.recv()
        except (EOFError, OSError):
            pass
        if msg != "ready":
            self._kill()
            raise RuntimeError("the math-verify worker did not start (is `math-verify[antlr4_9_3]` "
                               "installed? try `python -c 'import math_verify'`); waited up to "
                               f"{self.startup_timeout:.0f} s")
        self._ready = True

    def check(self, gold: str, pred: str, timeout: float) -> bool:
        """math-verify's verdict on ``pred`` against ``gold``; False after ``timeout`` seconds."""
        with self._lock:
            self._wait_ready()
            _count("symbolic")
            try:
                self._conn.send((gold, pred))
                if self._conn.poll(timeout):
                    return bool(self._conn.recv())
                _count("timeouts")
                log.warning("math-verify check exceeded %.1f s: scored 0, worker restarted (pred "
                            "%.80r)", timeout, pred)
            except (EOFError, OSError):
                _count("crashes")
                log.warning("math-verify worker died: scored 0, worker restarted (pred %.80r)",
                            pred)
            self._kill()
            self.start()  # the replacement imports while the caller carries on
            return False

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._conn.close()
        self._proc = self._conn = None
        self._ready = False

    def close(self) -> None:
        with self._lock:
            self._kill()


# The process's math-verify workers: a pool that threads take a worker from and give it back to, so
# ``reward_workers`` responses are checked side by side (suite/rl/step.py: sample and evaluate).
_POOL: list[SymbolicVerifier] = []
_FREE: queue.Queue = queue.Queue()
_POOL_LOCK = threading.Lock()


def set_workers(n: int) -> None:
    """Make the pool ``n`` workers (each started on first use). Call it while no check is running: a
    shrinking pool closes the workers it drops."""
    with _POOL_LOCK:
        if not _POOL:
            atexit.register(lambda: [v.close() for v in _POOL])
        while len(_POOL) < n:
            _POOL.append(SymbolicVerifier())
            _FREE.put(_POOL[-1])
        if len(_POOL) > n:
            for v in _POOL[n:]:
                v.close()
            del _POOL[n:]
            while not _FREE.empty():
                _FREE.get_nowait()
            for v in _POOL:
                _FREE.put(v)


def verifier() -> SymbolicVerifier:
    """The first worker of the pool (started on first use; ``verifier().warm_up()`` to pay
    early)."""
    if not _POOL:
        set_workers(1)
    return _POOL[0]


# ---------------------------------------------------------------------------- rewards

def is_equiv(pred: str | None, gold: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Normalised string match, then exact decimal match, then math-verify under a hard timeout.
    An empty answer, or one longer than ``MAX_ANSWER_CHARS``, is not equivalent to anything."""
    if pred is None or not pred.strip():
        return False
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        _count("refused")
        return False
    a, b = strip_string(pred), strip_string(gold)
    if a and (a == b or _numbers_equal(a, b)):
        return True
    if not _POOL:
        set_workers(1)
    worker = _FREE.get()  # a free worker (blocks while all are busy)
    try:
        return worker.check(gold, pred, timeout)
    finally:
        _FREE.put(worker)


def boxed_reward(response: str, ground_truth: str, truncated: bool,
                 timeout: float = DEFAULT_TIMEOUT, require_think: bool = False) -> float:
    """1.0 iff the response finished and its last box (after the single ``</think>`` when
    ``require_think``) is equivalent to the ground truth; else 0.0."""
    if truncated:
        return 0.0
    if require_think:
        response = think_answer(response)
        if response is None:
            return 0.0
    return 1.0 if is_equiv(last_boxed(response), str(ground_truth), timeout) else 0.0


def r1_reward(response: str, ground_truth: str, truncated: bool,
              timeout: float = DEFAULT_TIMEOUT) -> float:
    """The published sanity-test reward (arXiv 2510.26788, Precision-RL's Oat reward): exactly one
    ``</think>``, last box after it equivalent to the ground truth, not truncated."""
    return boxed_reward(response, ground_truth, truncated, timeout, require_think=True)


# ---------------------------------------------------------------------------- GSM8K

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _clean_number(s: str) -> str:
    s = s.replace(",", "")
    return s[:-1] if s.endswith(".") else s


def gsm8k_answer(solution: str) -> str:
    """The ground truth of a GSM8K ``answer`` field: the text after ``####``, commas stripped."""
    return _clean_number(solution.rsplit("####", 1)[-1].strip())


def gsm8k_extract(response: str) -> str | None:
    """The response's final number: the first number after the last ``####`` if there is one
    (the dataset's own format), else the number in the last box, else the last number anywhere
    (lm-eval's "flexible-extract"). Commas and ``$`` are dropped; None when there is no number."""
    if "####" in response:
        m = _NUMBER.search(response.rsplit("####", 1)[1])
        return _clean_number(m.group(0)) if m else None
    box = last_boxed(response)
    if box is not None:
        m = _NUMBER.search(box)
        return _clean_number(m.group(0)) if m else None
    found = _NUMBER.findall(response[-10_000:])  # the final number sits at the end; bounds the work
    return _clean_number(found[-1]) if found else None


def gsm8k_reward(response: str, ground_truth: str, truncated: bool,
                 require_think: bool = False) -> float:
    """1.0 iff the response finished and its final number equals the ground truth exactly."""
    if truncated:
        return 0.0
    if require_think:
        response = think_answer(response)
        if response is None:
            return 0.0
    pred = gsm8k_extract(response)
    return 1.0 if pred is not None and _numbers_equal(pred,
                                                      _clean_number(str(ground_truth))) else 0.0


if __name__ == "__main__":  # the worker process: `python -m suite.tasks.math_reward FD`
    from multiprocessing.connection import Connection

    _worker_main(Connection(int(sys.argv[1])))
