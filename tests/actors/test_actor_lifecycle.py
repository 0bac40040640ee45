"""An actor's life as Monarch runs it: async ``__cleanup__``, cleanup after
cancelled concurrent endpoints, ``__del__`` at proc stop, ``abort``, and the
one thread its sync endpoints run on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from monarch.actor import (
    Actor,
    SupervisionError,
    concurrent_endpoint,
    context,
    endpoint,
    this_host,
)
from tests.actors.lifecycle_actors import (
    Aborter,
    AsyncAborter,
    AsyncCleanup,
    CancelledThenCleanup,
    Finalized,
    KeepsAGlobal,
    LocalChildOwner,
    ProcInfo,
    SyncEndpointsAsyncCleanup,
    SyncEndpointsAsyncSupervise,
    ThreadLocal,
)
from tests.helpers import pid_alive, proc_mesh_fixture, run_client, wait_until

ROOT = Path(__file__).resolve().parents[2]

procs = proc_mesh_fixture({"gpus": 2})


def test_async_cleanup_is_awaited_when_the_proc_mesh_stops(nats_url, tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("acleanup", AsyncCleanup, str(tmp_path / "mark"))
    assert list(mesh.ping.call().get(timeout=30).values()) == ["pong", "pong"]
    pm.stop().get(timeout=60)
    for rank in (0, 1):
        assert (tmp_path / f"mark.{rank}").read_text() == "async cleanup exc=None"


def test_async_cleanup_is_awaited_when_the_actor_mesh_stops(procs, tmp_path):
    mesh = procs.spawn("acleanup_mesh", AsyncCleanup, str(tmp_path / "mark"))
    mesh.ping.call().get(timeout=30)
    mesh.stop().get(timeout=60)
    for rank in (0, 1):
        assert (tmp_path / f"mark.{rank}").read_text() == "async cleanup exc=None"


@pytest.mark.parametrize("how", ["proc_mesh", "actor_mesh"])
def test_stop_reaches_a_child_the_actor_spawned_in_its_own_process(nats_url, tmp_path, caplog, how):
    # The owner's stop stops its children first; this child's stop request goes to the
    # owner's own process, which must serve it while it serves the owner's stop (it
    # once waited behind it until the stop timeout, and the proc was killed before
    # the child's __cleanup__ ran).
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    owner = pm.spawn("owner", LocalChildOwner)
    assert owner.spawn_here.call_one(str(tmp_path / "here")).get(timeout=30) == "pong"
    if how == "proc_mesh":
        pm.stop().get(timeout=60)
    else:
        owner.stop().get(timeout=60)
    assert (tmp_path / "here.0").read_text() == "async cleanup exc=None"
    assert "incomplete" not in caplog.text
    pm.stop().get(timeout=60)


def test_stop_reaches_children_on_the_owners_own_proc_mesh(nats_url, tmp_path, caplog):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    owner = pm.spawn("owner", LocalChildOwner).slice(gpus=0)
    got = owner.spawn_on_own_procs.call_one(str(tmp_path / "sib")).get(timeout=30)
    assert got == ["pong", "pong"]
    pm.stop().get(timeout=60)
    for rank in (0, 1):
        assert (tmp_path / f"sib.{rank}").read_text() == "async cleanup exc=None"
    assert "incomplete" not in caplog.text


def test_concurrent_endpoint_is_cancelled_before_async_cleanup(nats_url, tmp_path):
    path = tmp_path / "log"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    gate = pm.spawn("gate", CancelledThenCleanup, str(path))
    assert gate.wait.call_one().get(timeout=30) == "started"
    pm.stop().get(timeout=60)
    assert path.read_text() == "cancelled\ncleanup\n"


def test_finalizers_run_when_the_proc_mesh_stops(nats_url, tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("finalized", Finalized, str(tmp_path))
    pids = sorted(mesh.pid.call().get(timeout=30).values())
    pm.stop().get(timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"del-{pid}" for pid in pids]


def test_a_stopped_proc_finalizes_like_a_python_program(nats_url, tmp_path):
    # As Monarch's procs (Py_FinalizeEx): atexit handlers run and module globals are
    # released, so an actor that keeps a resource in one gets to close it.
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("keeps", KeepsAGlobal, str(tmp_path))
    pids = sorted(mesh.pid.call().get(timeout=30).values())
    pm.stop().get(timeout=60)
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 30)
    expected = sorted([f"atexit-{p}" for p in pids] + [f"global-{p}" for p in pids])
    assert sorted(p.name for p in tmp_path.iterdir()) == expected
    for pid in pids:
        assert (tmp_path / f"global-{pid}").read_text() == "released at exit"


def printed_words(script: str, *args: str) -> list[str]:
    """What a fresh interpreter running ``script`` prints (it changes process-wide state)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def test_finalizing_releases_the_users_modules_and_leaves_monarch_and_libraries_alone(tmp_path):
    # Daemon threads of monarch (heartbeats, log forwarding) still run while a stopped
    # proc finalizes: every monarch module keeps its globals, not only monarch.actors'.
    (tmp_path / "users_module.py").write_text("RESOURCE = object()\n")
    script = """
import sys
sys.path.insert(0, sys.argv[1])
import json
import users_module
import monarch.broker.bodies.codec, monarch.core.runtime, monarch.supervision.heartbeat
from monarch.actors.hosting.proc import release_user_module_globals
release_user_module_globals()
print(users_module.RESOURCE, monarch.broker.bodies.codec.dumps is not None,
      monarch.core.runtime.Runtime is not None, monarch.supervision.heartbeat.__name__,
      json.dumps is not None)
"""
    out = printed_words(script, str(tmp_path))
    assert out == ["None", "True", "True", "monarch.supervision.heartbeat", "True"]


def test_finalizing_skips_only_torchs_own_operator_library_finalizers():
    # ~130 of them cost a proc forked with torch 30-70 ms at exit for nothing a user sees;
    # every other weakref.finalize (a user's) still runs at exit.
    script = """
import weakref, torch.library
from monarch.actors.hosting.proc import skip_torch_library_finalizers
class Resource: pass
kept = Resource()
users = weakref.finalize(kept, print, "released")
skip_torch_library_finalizers()
torchs = [f for f in weakref.finalize._registry if f.peek()[1] is torch.library._del_library]
print(len(torchs) > 10, any(f.atexit for f in torchs), users.atexit)
"""
    out = printed_words(script)
    assert out == ["True", "False", "True", "released"]


@pytest.mark.parametrize(
    ("cls", "reason"),
    [(Aborter, None), (Aborter, "the data is corrupt"), (AsyncAborter, "the disk is full")],
)
def test_abort_fails_the_actor_and_tells_its_owner(procs, root_faults, cls, reason):
    mesh = procs.spawn("aborter", cls)
    target = mesh.slice(gpus=1)
    # The aborting call may finish before the failure, or be refused by it.
    try:
        assert target.abort.call_one(reason).get(timeout=30) == "abort requested"
    except SupervisionError:
        pass
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "aborter" and failure.ranks == [1]
    assert cls.__name__ in failure.report()
    assert (reason or "no reason provided") in failure.report()
    with pytest.raises(SupervisionError, match="aborted"):
        target.ping.call_one().get(timeout=30)
    assert mesh.slice(gpus=0).ping.call_one().get(timeout=30) == "pong"


def test_client_cannot_abort_itself(nats_url):
    with pytest.raises(RuntimeError, match="cannot abort"):
        context().actor_instance.abort("no")


def test_sync_endpoints_keep_their_thread_and_its_thread_locals(procs):
    one = procs.spawn("tls", ThreadLocal).slice(gpus=0)
    replies = [one.incr.call_one().get(timeout=30) for _ in range(5)]
    assert [count for count, _ in replies] == [1, 2, 3, 4, 5]
    assert len({thread for _, thread in replies}) == 1


def test_proc_mesh_of_the_client_and_inside_an_actor(procs):
    assert dict(context().actor_instance.proc_mesh.extent) == {}
    info = procs.spawn("procinfo", ProcInfo).slice(gpus=1)
    # inside an actor: the proc mesh it was spawned on (as in Monarch); .proc is its own proc
    got = info.info.call_one().get(timeout=30)
    assert got["proc_mesh_extent"] == dict(procs.extent)
    assert got["proc_extent"] == {}


# -- what Monarch refuses where a class is defined or spawned -------------------------


def test_concurrent_endpoint_refuses_a_sync_method():
    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class SyncConcurrent(Actor):
            @concurrent_endpoint
            def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class SyncConcurrentWithOptions(Actor):
            @concurrent_endpoint(explicit_response_port=True)
            def ping(self, port) -> None:
                port.send("pong")


def test_concurrent_endpoint_refuses_to_wrap_an_endpoint():
    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Chained(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class ChainedWithOptions(Actor):
            @concurrent_endpoint(explicit_response_port=True)
            @endpoint
            async def ping(self, port) -> None:
                port.send("pong")


@pytest.mark.parametrize(
    ("cls", "hook"),
    [(SyncEndpointsAsyncCleanup, "__cleanup__"), (SyncEndpointsAsyncSupervise, "__supervise__")],
)
def test_spawn_refuses_sync_endpoints_with_an_async_hook(procs, cls, hook):
    with pytest.raises(ValueError, match=f"has sync endpoints, but an async {hook}") as info:
        procs.spawn("refused", cls)
    assert "sync: ['ping']" in str(info.value)


def test_a_script_logging_at_info_sees_no_record_of_ours_when_it_ends_normally(tmp_path):
    # The client's end closes its broker connection; that disconnect is expected, so it
    # is not reported at INFO (Monarch 0.7 prints nothing here either). A lost broker is.
    rc, out, err = run_client(
        tmp_path,
        """
        import logging
        logging.basicConfig(level=logging.INFO)
        from monarch.actor import this_host
        from tests.actors.actors_for_tests import Echo
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        print(list(pm.spawn("echo", Echo).ping.call(7).get(timeout=60).values()))
        pm.stop().get(timeout=60)
        """,
    )
    assert rc == 0, err
    assert out.strip() == "[7, 7]"
    assert "disconnected from the broker" not in err, err


def test_initialized_completes_once_the_mesh_is_spawned_and_leaves_init_failures_to_supervision(
    procs, root_faults
):
    """Monarch 0.7's ActorMesh.initialized: a Future of None; an __init__ that raised is
    reported to the owner (here the root's hook) and to calls, not by this future."""
    from monarch.actor import SupervisionError
    from tests.actors.actors_for_tests import BadInit, Echo

    echo = procs.spawn("init_echo", Echo)
    assert echo.initialized.get(timeout=60) is None
    assert echo.slice(gpus=1).initialized.get(timeout=60) is None
    assert list(echo.ping.call(7).get(timeout=30).values()) == [7, 7]
    bad = procs.spawn("init_bad", BadInit)
    assert bad.initialized.get(timeout=60) is None
    failures = root_faults.wait(2)
    assert {f.mesh_name for f in failures} == {"init_bad"}
    with pytest.raises(SupervisionError, match="init exploded"):
        bad.ping.call(1).get(timeout=30)
