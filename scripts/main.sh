#!/usr/bin/env bash
# The main job: the main flows and the controls (known-bad recipes beside their fixes), three seeds, into
# runs/main and runs/controls (git-ignored), then the controls' judgement (exit 3 when one misbehaves), the
# table, the reproduction checks against results/reference/<machine class>/, report and leaderboard.
set -euo pipefail
cd "$(dirname "$0")/.."
# The set-up leaves pip's byte-compilation out (scripts/setup.sh): the job's processes compile what they
# import and write it, as Python does by default, also where the environment sets PYTHONDONTWRITEBYTECODE
# (which would have each of its ~30 processes compile torch again).
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh core  # torch and the package: the job needs none of the extras
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# The main job keeps its policies and datasets in the checkout (git-ignored), so a fresh clone rebuilds
# everything it reports; every other command uses the user cache (~/.cache/lowprec-rl-suite).
export SUITE_CACHE="${SUITE_CACHE:-$PWD/.cache}"
exec .venv/bin/suite main "$@"
