#!/usr/bin/env bash
# The nats-py fast paths (monarch/broker/natspy_internals) read nats-py's private
# names, so every nats-py our range in pyproject.toml allows must still have them.
# For the OLDEST and the NEWEST nats-py the range allows: a throwaway virtual
# environment with the project installed with its dependencies, that nats-py
# put in place of the resolved one (--no-deps), and the broker tests run in it
# (tests/broker/test_natspy_internals.py checks each private name, and each fast
# path off and on against a real nats-server).
#
#   bash .ci/natspy-range.sh            # both ends of the range
#   NATSPY_VERSIONS="2.9.0" bash .ci/natspy-range.sh   # just these
#
# Last run (2026-12-05, range >=2.9,<3): nats-py 2.16.0 passed (230 tests);
# 2.9.0 failed: it lacks Client._parse_header_lines, Client._skip_subject_validation
# and nats.aio.client._validate_subject (2.15.0 still lacks the last two), so
# fast_headers, fast_delivery, sync_publish and direct_write stay off there.
#
# Exit status: 0 when every version passed. Needs Python 3.10+ and the package index.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=${NATSPY_RANGE_DIR:-$(mktemp -d /tmp/natspy-range.XXXXXX)}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

spec=$(sed -nE 's/^[[:space:]]*"nats-py([^"]*)",?.*$/\1/p' pyproject.toml | head -1)
[ -n "$spec" ] || { echo "no nats-py dependency in pyproject.toml"; exit 2; }

# One venv for the project's own install; its pip lists nats-py's versions.
"$PY" -m venv "$WORK/base" && "$WORK/base/bin/python" -m pip install --quiet --upgrade "pip>=23" packaging
if [ -z "${NATSPY_VERSIONS:-}" ]; then
    NATSPY_VERSIONS=$("$WORK/base/bin/python" - "$spec" <<'PYEOF'
import json, subprocess, sys
from packaging.specifiers import SpecifierSet
from packaging.version import Version
out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "nats-py", "--json"],
                     capture_output=True, text=True, check=True).stdout
allowed = sorted(v for v in map(Version, json.loads(out)["versions"])
                 if v in SpecifierSet(sys.argv[1]) and not v.is_prerelease)
print(allowed[0], allowed[-1])
PYEOF
    ) || { echo "could not list nats-py's versions"; exit 2; }
fi
echo "nats-py range in pyproject.toml: '$spec'; testing: $NATSPY_VERSIONS"

status=0
summary=""
for version in $NATSPY_VERSIONS; do
    venv="$WORK/nats-py-$version"
    start=$(date +%s)
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade "pip>=23"
    # torch==2.13.0: the CPU build .ci/run installs (the codec tests encode tensors).
    if ! "$venv/bin/python" -m pip install --quiet torch==2.13.0 -e '.[torch,test]' ||
       ! "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "nats-py==$version"; then
        echo "nats-py $version: install failed"
        status=1; summary="$summary\nnats-py $version: install failed"; continue
    fi
    got=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('nats-py'))")
    echo "=== nats-py $got: tests/broker (with test_natspy_internals.py)"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/broker
    rc=$?
    took=$(( $(date +%s) - start ))
    [ $rc -eq 0 ] || status=1
    summary="$summary\nnats-py $got: pytest exit $rc (${took}s with the install)"
done
echo -e "=== summary$summary"
exit $status
