#!/usr/bin/env bash
# Downstream check: torchstore's own CPU tests, unchanged, against this checkout's monarch.
#
# Why: torchstore (meta-pytorch/torchstore) is a real library built on Monarch's
# public API; running its tests on ours catches API drift that our own tests miss.
# Only the package index is reachable in CI, so torchstore comes from PyPI: the
# pinned release's sdist (it ships tests/) and wheel, installed with --no-deps into
# a throwaway folder put on PYTHONPATH in front of our venv (torch and the rest are
# ours; torchstore's pin on an old torchmonarch is ignored on purpose: it only uses
# monarch.actor / monarch.rdma). If the release cannot be fetched the check prints
# why and exits 0 ("skipped"). Time bound: TORCHSTORE_CI_TIMEOUT seconds (default 1500).
#
# usage: .ci/downstream-torchstore.sh   (env: PY=python of our venv, TORCHSTORE_VERSION)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$REPO/.venv/bin/python}"
VERSION="${TORCHSTORE_VERSION:-}"   # empty: the newest release on the index
BOUND="${TORCHSTORE_CI_TIMEOUT:-1500}"
TESTS="${TORCHSTORE_TESTS:-test_utils.py test_store.py test_keys.py test_tensor_slice.py test_state_dict.py test_resharding_basic.py}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/downstream-torchstore.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/dl" "$WORK/site" "$WORK/run"   # run/: no monarch/ folder beside the tests

SPEC="torchstore${VERSION:+==$VERSION}"
if ! "$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK/dl" "$SPEC" \
    || ! "$PY" -m pip install -q --no-deps --target "$WORK/site" "$SPEC" \
        pygtrie portpicker psutil pytest-asyncio pytest-unordered pytest-timeout; then
  echo "downstream-torchstore: SKIPPED: $SPEC or its test deps not reachable on the package index"
  exit 0
fi
# Releases up to 0.1.2 (the newest on PyPI in 2026-12) predate Monarch 0.7's rule that
# an actor is all-sync or all-async: their Controller mixes both, which Monarch 0.7
# itself refuses at spawn (ValueError). Such a release cannot run on 0.7's API, real or
# ours, so the check is skipped rather than failed.
if ! probe=$(PYTHONPATH="$REPO:$WORK/site" "$PY" -c '
import torchstore.controller as c
from monarch.actors.calls.actor import _check_hooks_match_endpoints
_check_hooks_match_endpoints(c.Controller)' 2>&1); then
  echo "downstream-torchstore: SKIPPED: $(ls "$WORK"/dl) does not fit Monarch 0.7's API: ${probe##*$'\n'}"
  exit 0
fi
tar -xzf "$WORK"/dl/torchstore-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/torchstore-*/)"
cp -r "$SRC/tests" "$WORK/run/tests"

cd "$WORK/run"
args=()
for t in $TESTS; do args+=("tests/$t"); done
set +e
# The tests pick MonarchRPC, not RDMA, unless TORCHSTORE_RDMA_ENABLED=1 (CPU CI).
PYTHONPATH="$REPO:$WORK/site" TORCHSTORE_RDMA_ENABLED=0 timeout -k 30 "$BOUND" \
  "$PY" -m pytest -q -p no:cacheprovider --timeout 300 -o asyncio_default_fixture_loop_scope=function "${args[@]}"
rc=$?
set -e
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "downstream-torchstore: FAILED: ran past ${BOUND}s"
fi
exit "$rc"
