"""``monarch stacks``: the stacks of real procs' threads, read over the side channel (even
while a proc's event loop is blocked) or by py-spy (when a C call holds a proc's GIL), and
clear answers for an unknown mesh, a rank out of range and a dead proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.cli.stacks import py_spy
from tests.actors.activity_actors import Busy, Hog
from tests.actors.stats_requests import wait_for_actor
from tests.helpers import proc_mesh_fixture

ROOT = Path(__file__).resolve().parents[2]

procs = proc_mesh_fixture({"gpus": 2})


def stacks(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "MONARCH_NATS_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", "stacks", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_a_sync_endpoint_blocked_in_sleep_shows_its_frame_and_actor(procs, nats_url):
    mesh = procs.spawn("stk_nap", Busy)
    napping = mesh.slice(gpus=1).nap.call_one(8.0)
    wait_for_actor(nats_url, "stk_nap", rank=1, until=lambda p, a: bool(a["in_flight"]))
    done = stacks(nats_url, "stk_nap[1]")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("=== proc ") == 1  # rank 1's proc only
    assert "stk_nap[1].nap for" in out  # the thread is marked with the call it runs
    assert "nap (" in out and "time.sleep(seconds)" in out
    assert "Thread " in out and '"actor stk_nap.' in out
    assert napping.get(timeout=60) == "rested"


def test_a_proc_whose_loop_is_blocked_still_answers(procs, nats_url):
    mesh = procs.spawn("stk_hog", Hog)
    hogging = mesh.slice(gpus=0).hog_loop.call_one(8.0)
    wait_for_actor(
        nats_url, "stk_hog", until=lambda p, a: bool(a["in_flight"]) and p["loop_stall"] > 0
    )
    done = stacks(nats_url, "stk_hog")
    assert done.returncode == 0, done.stderr
    assert "Event loop: has not turned for" in done.stdout
    assert "hog_loop (" in done.stdout and "stk_hog[0].hog_loop for" in done.stdout
    assert hogging.get(timeout=60) == "done"


def test_no_argument_shows_every_proc_and_the_client(procs, nats_url):
    from monarch.core.process_runtime import runtime

    procs.spawn("stk_all", Busy).work.call(1).get(timeout=30)
    done = stacks(nats_url)
    # (Not the status: procs of other tests on this broker may be starting or stopping.)
    assert "Traceback" not in done.stderr
    assert f"proc {runtime().proc_uid} " in done.stdout  # the client answers too
    assert "stk_all[0] Busy" in done.stdout and "stk_all[1] Busy" in done.stdout


@pytest.mark.parametrize(
    "target, message",
    [
        ("no_such_mesh", "no actor mesh named 'no_such_mesh'"),
        ("stk_range[7]", "mesh 'stk_range' has ranks 0..1: there is no rank 7"),
        ("bad name!", "is not MESH or MESH[RANK]"),
    ],
)
def test_unknown_mesh_or_rank_is_exit_2_with_a_message(procs, nats_url, target, message):
    procs.spawn("stk_range", Busy).work.call(1).get(timeout=30)
    done = stacks(nats_url, target)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_dead_proc_is_named_as_dead(nats_url, root_faults):
    from monarch.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pm.spawn("stk_dead", Busy).work.call(1).get(timeout=30)
    proc, _ = wait_for_actor(nats_url, "stk_dead")
    os.kill(proc["pid"], signal.SIGKILL)
    done = stacks(nats_url, "--proc", proc["uid"])
    assert done.returncode == 1
    assert f"proc {proc['uid']} (pid {proc['pid']}) has died" in done.stderr
    root_faults.wait(1)
    pm.stop().get(timeout=60)


def test_py_spy_reads_a_local_proc(procs, nats_url):
    assert py_spy() is not None, "py-spy is installed with the test extra"
    mesh = procs.spawn("stk_spy", Busy)
    napping = mesh.slice(gpus=0).nap.call_one(8.0)
    wait_for_actor(nats_url, "stk_spy", until=lambda p, a: bool(a["in_flight"]))
    done = stacks(nats_url, "--py-spy", "stk_spy[0]")
    assert done.returncode == 0, done.stderr
    assert "(read by py-spy)" in done.stdout
    assert "Busy.nap (" in done.stdout  # py-spy's own format
    assert napping.get(timeout=60) == "rested"


HOLDER = textwrap.dedent("""
    import json, os, sys, time
    from monarch.actor import this_host
    from tests.actors.activity_actors import Busy
    from tests.actors.stats_requests import wait_for_actor

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    one = pm.spawn("stk_gil", Busy).slice(gpus=0)
    one.work.call_one(0).get(timeout=60)
    flag = sys.argv[1]
    holding = one.hold_gil.call_one(15, flag)
    proc, _ = wait_for_actor(os.environ["MONARCH_NATS_URL"], "stk_gil",
                             until=lambda p, a: bool(a["in_flight"]))
    open(flag, "w").close()  # now hold the GIL
    deadline = time.monotonic() + 60
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the removal is the actor's last Python before the hold
    print(json.dumps({"uid": proc["uid"]}), flush=True)
    assert holding.get(timeout=120) == "released"
    pm.stop().get(timeout=60)
""")


def test_a_proc_whose_gil_is_held_is_read_by_py_spy(nats_url, tmp_path):
    assert py_spy() is not None, "py-spy is installed with the test extra"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    # Its heartbeats stop while the GIL is held: a long timeout keeps it from being called dead.
    env = {**os.environ, "MONARCH_NATS_URL": nats_url, "PYTHONPATH": str(ROOT),
           "MONARCH_HEARTBEAT_TIMEOUT": "60"}  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "hold-now")], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = holder.stdout.readline()
        assert line, "the holder script ended early"
        uid = json.loads(line)["uid"]
        done = stacks(nats_url, "--proc", uid, "--timeout", "2", "--window", "1")
        assert "did not answer in 2 s: its interpreter is held" in done.stderr
        assert done.returncode == 0, done.stderr  # py-spy read it instead
        assert "(read by py-spy)" in done.stdout and "Busy.hold_gil (" in done.stdout
        assert holder.wait(timeout=120) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
