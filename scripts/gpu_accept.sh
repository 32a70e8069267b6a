#!/usr/bin/env bash
# The GPU acceptance, stage by stage: scripts/gpu_accept.sh STAGE [STAGE ...] (suite/experiments/accept.py, docs/gpu.md).
#
#   PYTHON=.venv/bin/python scripts/gpu_accept.sh prepare   # on the CPU: wheels, policies, provenance, size check
#   scripts/gpu_accept.sh numerics cells                     # on the GPU, with .whl and .gpu carried
#
# On the GPU machine python3 is the image's (torch with CUDA, no hydra-core/omegaconf): the wheels that prepare put
# in .whl/ are installed into a scratch folder first. Results go to $ACCEPT_OUT (default runs/accept), one folder
# per stage plus work/ (the runs); the device returns at most 8 files, so pack them there:
#   ACCEPT_OUT=/tmp/accept scripts/gpu_accept.sh numerics cells; tar czf $OUT/accept.tgz --exclude=ckpt -C /tmp accept
# Each stage's budget in seconds can be set as BUDGET_<STAGE>, e.g. BUDGET_CELLS=200; WHEELS=DIR: the wheels
# (default .whl).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
if [ "${1:-}" != prepare ] && ls "$wheels"/*.whl >/dev/null 2>&1 && ! $PY -c 'import hydra, omegaconf' 2>/dev/null; then
  site=${TMPDIR:-/tmp}/accept-site
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl || exit 2
  export PYTHONPATH=$site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -d .gpu/cache ] && export SUITE_CACHE=${SUITE_CACHE:-$PWD/.gpu/cache}
# The commit prepare recorded: the device's copy of the checkout cannot say it (env.json source_commit)
[ -f .gpu/provenance.json ] && export SUITE_SOURCE_COMMIT=$($PY -c 'import json; print(json.load(open(".gpu/provenance.json"))["commit"] or "")')
out=${ACCEPT_OUT:-runs/accept}
mkdir -p "$out"
rc=0
for stage in "$@"; do
  var=BUDGET_$(echo "$stage" | tr a-z A-Z) more=ACCEPT_$(echo "$stage" | tr a-z A-Z)
  # ACCEPT_NUMERICS="only=gemm", ACCEPT_CELLS="tier=smoke steps=2": more arguments of one stage (word-split)
  $PY -m suite accept "$stage" "out=$out" ${!var:+budget=${!var}} ${!more:-} 2>&1 | tee "$out/$stage.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
done
exit $rc
