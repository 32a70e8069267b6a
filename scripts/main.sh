#!/usr/bin/env bash
# The main job: the sanity grid (every precision flow x 3 algorithms) into runs/sanity (git-ignored),
# then its table, the reproduction check against results/reference/<machine class>/, report and leaderboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/suite main "$@"
