#!/usr/bin/env bash
# The main job: the embedded sanity test in fp32, bf16 and fp16, ending in the outcome table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/suite main "$@"
