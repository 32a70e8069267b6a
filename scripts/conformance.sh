#!/usr/bin/env bash
# Conformance with the peers: run the released verl and TRL on the same log-probs as the suite's metrics
# (tests/test_conformance.py; the table it checks is suite/numerics/peers.py, docs/metrics.md).
#   bash scripts/conformance.sh                 install the pinned peers into .peers/ and run the tests
#   bash scripts/conformance.sh --install-only  only install (scripts/test.sh does this in CI)
#   bash scripts/conformance.sh --lock          re-pin scripts/peers-requirements.txt for this platform
# The peers come from the package registry, versions pinned and wheel hashes checked (pip
# --require-hashes), without their dependencies, into .peers/ (git-ignored), never into .venv: the test
# runs them in a process of its own with .peers/ first on PYTHONPATH. Without them the tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
REQ=scripts/peers-requirements.txt
PEERS=${SUITE_PEERS:-.peers}
if [ "${1:-}" = --lock ]; then
  tmp=$(mktemp -d)
  pins=$(grep -v '^#' "$REQ" | cut -d' ' -f1)
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps -d "$tmp" $pins
  { grep '^#' "$REQ"; for p in $pins; do
      f=$(ls "$tmp" | grep -i "^$(echo "${p%%==*}" | tr - _)-${p##*==}-")
      echo "$p $("$PY" -m pip hash "$tmp/$f" | tail -1)"; done; } > "$REQ.new"
  mv "$REQ.new" "$REQ"; rm -rf "$tmp"; echo "re-pinned $REQ"; exit 0
fi
stamp="$PEERS/.installed"
want=$(sha256sum "$REQ" | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$PEERS"
  "$PY" -m pip install -q --no-deps --require-hashes --target "$PEERS" -r "$REQ"
  echo "$want" > "$stamp"
fi
[ "${1:-}" = --install-only ] && exit 0
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 SUITE_PEERS="$PEERS"
exec "$PY" -m pytest -q tests/test_conformance.py "$@"
