#!/usr/bin/env bash
# The test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
# The set-up leaves pip's byte-compilation out (scripts/setup.sh): the tests' processes compile what they
# import and write it, as Python does by default, even where the environment sets PYTHONDONTWRITEBYTECODE,
# which would have each of their hundreds of processes compile torch again.
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh
# The browser tests of the report and the leaderboard drive Debian's Chromium through Playwright (no
# browser download). CI installs it here; elsewhere nothing is installed and those tests skip, saying why.
if [ -n "${CI:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo "sudo -n")
  ($SUDO apt-get install -y -q chromium >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q chromium >/dev/null 2>&1; }) \
    || echo "test set-up: could not install chromium (apt); the browser tests will fail in CI" >&2
fi
# The conformance tests run the released verl and TRL (pinned, hash-checked, in .peers/): CI installs them
# here; elsewhere `bash scripts/conformance.sh` does, and without them those tests skip, saying why.
if [ -n "${CI:-}" ]; then
  bash scripts/conformance.sh --install-only || echo "test set-up: could not install the peers; the conformance tests will fail in CI" >&2
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/python -m ruff check suite tests scripts  # the rule set in pyproject.toml; a violation fails CI here
# Test files run side by side, one worker per core up to 4 (pytest-xdist; `-n 0` after the command runs
# them in one process). A file stays on one worker, in order (`--dist loadfile`): some tests read what
# the file's earlier tests measured. The workers share one cache (a policy is built once, the others
# wait for it). OpenMP threads that wait sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE; it
# changes no number): a test training with 2 threads beside another worker's test would otherwise
# spin on the core that test needs.
workers=$(nproc)
workers=$(( workers > 4 ? 4 : workers ))
export OMP_WAIT_POLICY=PASSIVE
exec .venv/bin/python -m pytest -q -n "$([ "$workers" -gt 1 ] && echo "$workers" || echo 0)" --dist loadfile "$@"
