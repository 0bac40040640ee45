"""Failures flow up the owner tree, fast, and never hang a caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.actor import MeshFailure, SpawnError, SupervisionError
from tests.helpers import descendants, pid_alive, proc_mesh_fixture, wait_until
from tests.supervision.sup_actors import BadInit, Owner, Worker

ROOT = Path(__file__).resolve().parents[2]


procs = proc_mesh_fixture({"gpus": 2})


def test_broadcast_exception_fails_the_actor_and_reaches_the_root(procs, root_faults):
    w = procs.spawn("bcast", Worker)
    w.slice(gpus=1).boom.broadcast("nobody is listening")
    (failure,) = root_faults.wait(1)
    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == "bcast" and failure.ranks == [1]
    assert failure.reason == "actor_failed"
    assert "nobody is listening" in failure.report()
    assert "raise ValueError(message)" in failure.report()
    with pytest.raises(SupervisionError, match=r"bcast.*\[1\]"):
        w.slice(gpus=1).ping.call_one(1).get(timeout=30)
    with pytest.raises(SupervisionError):
        w.ping.call(1).get(timeout=30)
    assert w.slice(gpus=0).ping.call_one(2).get(timeout=30) == 2  # the other rank lives on


def test_exception_escaping_explicit_port_endpoint_fails_the_actor(procs, root_faults):
    w = procs.spawn("portboom", Worker).slice(gpus=0)
    with pytest.raises(SupervisionError):
        w.port_boom.call_one("escaped").get(timeout=30)
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "portboom" and "escaped" in failure.report()


def test_failing_init_is_reported_and_calls_raise(procs, root_faults):
    bad = procs.spawn("badinit", BadInit)
    with pytest.raises(SpawnError, match="init exploded") as info:
        bad.ping.call().get(timeout=30)
    assert isinstance(info.value, SupervisionError)
    failures = root_faults.wait(2)  # the hook runs once per failed rank, as in Monarch
    assert sorted(f.ranks for f in failures) == [[0], [1]]
    assert all(f.reason == "init_failed" for f in failures)


@pytest.mark.parametrize("how", ["sigkill", "exit", "segfault"])
def test_process_death_fails_in_flight_calls_and_reaches_the_owner(procs, root_faults, how):
    w = procs.spawn(f"dies_{how}", Worker)
    target = w.slice(gpus=1)
    pid = target.pid.call_one().get(timeout=30)
    if how == "sigkill":
        in_flight = target.block.call_one()
        os.kill(pid, signal.SIGKILL)
    else:
        in_flight = target.die.call_one(how)  # the call in flight is the one that kills it
    # the process's end (Monarch's "Killed(sig=9)" / "Stopped(exit=7)") when the call was
    # running, or "gone" from a heartbeat; "no actor" if the kill beat its delivery
    with pytest.raises(SupervisionError, match=r"Killed\(sig=|Stopped\(exit=|gone|no actor"):
        in_flight.get(timeout=30)
    (failure,) = root_faults.wait(1)
    assert failure.reason == "proc_died" and failure.ranks == [1]
    with pytest.raises(SupervisionError):
        target.ping.call_one().get(timeout=30)
    assert w.slice(gpus=0).ping.call_one(5).get(timeout=30) == 5


def test_silent_proc_is_declared_dead_after_heartbeat_timeout(procs, root_faults):
    w = procs.spawn("silent", Worker)
    pid = w.slice(gpus=0).pid.call_one().get(timeout=30)
    in_flight = w.slice(gpus=0).ping.call_one(1)
    in_flight.get(timeout=30)
    os.kill(pid, signal.SIGSTOP)  # alive, but it says nothing any more
    try:
        stuck = w.slice(gpus=0).ping.call_one(2)
        with pytest.raises(SupervisionError, match="no heartbeat"):
            stuck.get(timeout=60)
        (failure,) = root_faults.wait(1)
        assert failure.reason == "heartbeat_lost"
        assert wait_until(lambda: not pid_alive(pid), timeout=10)  # and it is not left behind
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_chain_of_three_owners_middle_one_handles(procs, tmp_path):
    log = tmp_path / "log"
    top = procs.spawn("top", Owner, "top", True, str(log), False).slice(gpus=0)
    top.break_leaf.call_one().get(timeout=60)
    # the middle owner did not handle it: it failed, and the top owner handled that
    assert wait_until(lambda: log.exists() and "top supervise" in log.read_text(), timeout=30)
    seen = top.seen.call_one().get(timeout=30)
    assert seen == [("top_mid", "owner_failed", [0], "top_mid_leaf")]
    text = log.read_text()
    assert "top_mid supervise top_mid_leaf actor_failed handled=False" in text
    # children clean up before their owner
    assert text.index("worker cleanup") < text.index("top_mid cleanup")


def test_nobody_handles_and_the_root_hook_fires(procs, root_faults, tmp_path):
    top = procs.spawn("top2", Owner, "top2", False, str(tmp_path / "log"), False).slice(gpus=0)
    top.break_leaf.call_one().get(timeout=60)
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "top2" and failure.reason == "owner_failed"
    chain = []
    f = failure
    while f is not None:
        chain.append(f.mesh_name)
        f = f.cause
    assert chain == ["top2", "top2_mid", "top2_mid_leaf"]
    assert "leaf failed" in failure.report()


def test_owner_stopping_stops_owned_meshes_children_first(procs, tmp_path):
    log = tmp_path / "log"
    owner = procs.slice(gpus=0).spawn("stopper", Owner, "stopper", True, str(log))
    child_pid = owner.child_pid.call_one().get(timeout=60)
    owner.stop().get(timeout=60)
    text = log.read_text().splitlines()
    assert text == ["worker cleanup None", "stopper cleanup"]
    assert wait_until(lambda: not pid_alive(child_pid), timeout=15)


def test_supervision_events_are_durable_in_jetstream(procs, root_faults, nats_url):
    import asyncio

    import nats

    w = procs.spawn("durable", Worker)
    w.slice(gpus=0).boom.broadcast("kept for later")
    root_faults.wait(1)

    async def read_back():
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            sub = await js.subscribe("mon.default.sup.>", ordered_consumer=True)
            found = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=2)
                except Exception:
                    break
                found.append(msg)
            return found
        finally:
            await nc.close()

    msgs = asyncio.run(read_back())
    mine = [m for m in msgs if (m.headers or {}).get("Mon-Mesh") == "durable"]
    assert mine and mine[0].headers["Mon-Reason"] == "actor_failed"


def test_client_death_makes_its_procs_exit_through_heartbeats(tmp_path, nats_url):
    """With the kernel's parent-death signal off, the procs notice the silent owner."""
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from monarch.actor import this_host
            from tests.supervision.sup_actors import Worker
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            print(list(pm.spawn("w", Worker).pid.call().get().values()), flush=True)
            time.sleep(120)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), MONARCH_DIE_WITH_PARENT="0",
               MONARCH_HEARTBEAT_TIMEOUT="1.5", MONARCH_HEARTBEAT_INTERVAL="0.2")  # fmt: skip
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = eval(p.stdout.readline())
        assert len(pids) == 2 and all(pid_alive(x) for x in pids)
        p.kill()
        p.wait(timeout=10)
        assert wait_until(lambda: not any(pid_alive(x) for x in pids), timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        for x in pids + sorted(descendants(p.pid)):
            if pid_alive(x):
                os.kill(x, signal.SIGKILL)


def test_call_through_a_reference_fails_when_the_proc_dies(procs):
    """The caller is not the owner: it learns of the death from the heartbeat subject."""
    from tests.supervision.sup_actors import Holder

    holder = procs.slice(gpus=0).spawn("holder", Holder)
    worker = holder.ref.call_one().get(timeout=60)  # first use right away: it is ready
    pid = worker.pid.call_one().get(timeout=30)
    in_flight = worker.block.call_one()
    os.kill(pid, signal.SIGKILL)
    # the process's end (Monarch's "Killed(sig=9)" / "Stopped(exit=7)") when the call was
    # running, or "gone" from a heartbeat; "no actor" if the kill beat its delivery
    with pytest.raises(SupervisionError, match=r"Killed\(sig=|Stopped\(exit=|gone|no actor"):
        in_flight.get(timeout=30)


def test_a_handled_failure_prints_nothing_from_the_failed_proc(procs, tmp_path, capsys):
    """As in Monarch 0.7: the failure goes to the owner (and, unhandled, to the client, which
    prints it once); the failed actor's proc does not also log it to the user's terminal."""
    log = tmp_path / "log"
    top = procs.spawn("quiet", Owner, "quiet", True, str(log)).slice(gpus=0)
    top.break_leaf.call_one().get(timeout=60)
    assert wait_until(lambda: top.seen.call_one().get(timeout=30), timeout=30)
    printed = capsys.readouterr()  # the leaf's output came before the owner's reply
    assert "quiet supervise quiet_leaf actor_failed handled=True" in log.read_text()
    assert "failed: ValueError('leaf failed')" not in printed.out + printed.err
