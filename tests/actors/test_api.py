"""The rest of Monarch's actor API: actors calling and spawning actors, this_proc,
ports and channels, send, Accumulator, concurrent endpoints, as_endpoint,
lifecycle, controllers and the exported names."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import monarch.actor as api
from monarch.actor import (
    Accumulator,
    Channel,
    MeshStoppedError,
    as_endpoint,
    get_or_spawn_controller,
    send,
    this_host,
    this_proc,
)
from tests.actors import flood_actors
from tests.actors.api_actors import (
    Concurrent,
    ControllerUser,
    Counter,
    Lifecycle,
    PortPasser,
    Replier,
    Spawner,
)
from tests.actors.flood_actors import Counted, Sender
from tests.helpers import proc_mesh_fixture, wait_until

ROOT = Path(__file__).resolve().parents[2]


procs = proc_mesh_fixture({"gpus": 3})


# -- actors talking to and spawning actors ---------------------------------------


def test_actor_spawns_its_own_procs_and_actors(procs):
    spawner = procs.spawn("spawner", Spawner).slice(gpus=0)
    values, pids, spawner_pid = spawner.spawn_and_call.call_one(2).get(timeout=120)
    assert values == [15, 15]
    assert len(set(pids)) == 2 and spawner_pid not in pids
    assert os.getpid() not in pids


def test_actor_spawns_sibling_in_its_own_process(procs):
    spawner = procs.spawn("spawner2", Spawner).slice(gpus=1)
    value, sibling_pid = spawner.local_actor.call_one().get(timeout=60)
    assert value == 2
    assert sibling_pid != os.getpid()


def test_this_proc_runs_actors_in_the_client_process(nats_url):
    local = this_proc().spawn("local_counter", Counter, 5)
    pid, actor_id = local.where.call_one().get(timeout=30)
    assert pid == os.getpid()
    assert actor_id.startswith("local_counter.")
    futures = [local.incr.call_one() for _ in range(200)]
    assert [f.get(timeout=30) for f in futures] == list(range(6, 206))  # order kept
    local.stop().get(timeout=30)
    with pytest.raises(MeshStoppedError):
        local.incr.call_one()


# -- ports and channels -------------------------------------------------------------


def test_channel_port_travels_to_actors_and_back(procs):
    replier = procs.spawn("replier", Replier)
    port, receiver = Channel.open()
    replier.tell.broadcast(port, "hi")
    assert [receiver.recv().get(timeout=30) for _ in range(3)] == ["hi"] * 3


def test_port_exception_raises_at_recv(procs):
    replier = procs.spawn("replier_err", Replier).slice(gpus=0)
    port, receiver = Channel.open()
    replier.tell_error.broadcast(port, "missing")
    with pytest.raises(KeyError, match="missing"):
        receiver.recv().get(timeout=30)


def test_port_values_are_read_when_asked_for_not_when_they_arrive(procs):
    # A value is unpickled by the recv() that takes it: a flood of arrivals costs its reader
    # no decoding until it asks (Monarch's grpo_yield.py stalled when the reader's loop
    # decoded every arrival first: tests/actors/test_port_flood.py).
    port, receiver = Channel.open()
    procs.spawn("counted", Sender).slice(gpus=0).send_counted.call_one(port, 40).get(timeout=60)
    assert wait_until(lambda: len(receiver._arrived) == 40, timeout=30)
    assert flood_actors.UNPICKLED == []
    assert receiver.recv().get(timeout=30) == Counted(0)
    assert flood_actors.UNPICKLED == [0]
    assert [receiver.recv().get(timeout=30).i for _ in range(39)] == list(range(1, 40))
    assert flood_actors.UNPICKLED == list(range(40))


def test_ranked_channel_gives_sender_ranks(procs):
    replier = procs.spawn("replier_rank", Replier)
    port, receiver = Channel.open_ranked()
    send(replier.rank, (), {}, port=port)
    got = sorted(receiver.recv().get(timeout=30) for _ in range(3))
    assert got == [(0, 0), (1, 1), (2, 2)]


def test_send_with_choose_reaches_one_actor(procs):
    replier = procs.spawn("replier_choose", Replier)
    port, receiver = Channel.open()
    send(replier.rank, (), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=30) in (0, 1, 2)
    with pytest.raises(ValueError, match="selection"):
        send(replier.rank, (), {}, port=port, selection="some")


def test_once_port_takes_one_message(nats_url):
    port, receiver = Channel.open(once=True)
    port.send(1)
    port.send(2)
    assert receiver.recv().get(timeout=10) == 1
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.5)


def test_port_handed_from_actor_to_actor(procs):
    replier = procs.spawn("replier_peer", Replier)
    passer = procs.spawn("passer", PortPasser, replier).slice(gpus=0)
    port, receiver = Channel.open()
    passer.forward.broadcast(port, 42)
    assert [receiver.recv().get(timeout=30) for _ in range(3)] == [42] * 3


def test_explicit_response_port_endpoint(procs):
    replier = procs.spawn("replier_explicit", Replier)
    assert replier.slice(gpus=1).twice.call_one(3).get(timeout=30) == 3
    assert list(replier.twice.call(2).get(timeout=30).values()) == [2, 2, 2]


def test_accumulator_folds_every_reply(procs):
    counters = procs.spawn("acc", Counter, 10)
    total = Accumulator(counters.incr, 0, lambda acc, x: acc + x).accumulate(2)
    assert total.get(timeout=30) == 36


def test_as_endpoint_calls_a_plain_method(procs):
    replier = procs.spawn("replier_plain", Replier)
    assert list(as_endpoint(replier.plain).call(1).get(timeout=30).values()) == [1001] * 3
    with pytest.raises(TypeError, match="as_endpoint"):
        as_endpoint(42)


# -- concurrent endpoints -------------------------------------------------------------


def test_concurrent_endpoint_starts_in_order_and_overlaps(procs, tmp_path):
    c = procs.spawn("conc", Concurrent, str(tmp_path / "log")).slice(gpus=0)
    slow = [c.slow.call_one(i, 0.3 if i == 0 else 0.0) for i in range(10)]
    # the long first call does not hold back the nine short ones
    done_first = []
    for f in slow[1:]:
        f.get(timeout=30)
        done_first.append(slow[0].done())
    assert not all(done_first)
    assert slow[0].get(timeout=30) == 0
    assert c.started_order.call_one().get(timeout=30) == list(range(10))


def test_concurrent_tasks_are_cancelled_before_cleanup(nats_url, tmp_path):
    path = tmp_path / "log"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    c = pm.spawn("conc_stop", Concurrent, str(path))
    c.forever.broadcast()
    c.started_order.call_one().get(timeout=30)
    pm.stop().get(timeout=60)
    assert path.read_text().splitlines() == ["cancelled", "cleanup"]


# -- lifecycle ---------------------------------------------------------------------


def test_context_instance_logger_and_names(procs, tmp_path):
    life = procs.spawn("life", Lifecycle, str(tmp_path / "l")).slice(gpus=2)
    info = life.info.call_one().get(timeout=30)
    assert info["name"] == "life"
    assert info["current_actor_name"] == info["actor_id"]  # one per rank, as in Monarch
    assert info["rank"] == 2
    assert info["actor_id"].startswith("life.") and info["actor_id"].endswith("[2]")
    assert info["proc"].startswith("<ProcMesh")
    assert info["logger"].endswith("life")


def test_stop_drains_pending_messages_then_runs_cleanup(nats_url, tmp_path):
    path = tmp_path / "cleanup"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    life = pm.spawn("drain", Lifecycle, str(path))
    for _ in range(20):
        life.work.broadcast(0.01)
    pm.stop().get(timeout=60)
    assert path.read_text().strip() == "cleanup handled=20 exc=None"


def test_actor_mesh_stop_runs_cleanup_and_refuses_calls(procs, tmp_path):
    path = tmp_path / "cleanup"
    life = procs.spawn("mesh_stop", Lifecycle, str(path))
    life.work.call(0).get(timeout=30)
    life.stop().get(timeout=60)
    assert path.read_text().count("cleanup handled=1 exc=None") == 3
    with pytest.raises(MeshStoppedError):
        life.info.call()


def test_actor_can_stop_itself(procs, tmp_path):
    path = tmp_path / "self"
    life = procs.spawn("self_stop", Lifecycle, str(path)).slice(gpus=0)
    assert life.stop_self.call_one().get(timeout=30) == "stopping"
    assert wait_until(lambda: path.exists() and "cleanup" in path.read_text(), timeout=30)
    with pytest.raises(Exception):  # noqa: B017 - stopping or no longer listening
        life.info.call_one().get(timeout=30)


def test_async_with_proc_mesh(nats_url):
    async def main():
        async with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
            c = pm.spawn("awith", Counter, 1)
            return list((await c.incr.call()).values())

    assert asyncio.run(main()) == [2, 2]


def test_stop_is_bounded_when_an_endpoint_never_returns(tmp_path):
    result = run_client(
        tmp_path,
        """
        from monarch.actor import this_host
        from tests.actors.api_actors import Lifecycle
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        life = pm.spawn("stuck", Lifecycle, "PATH")
        life.work.call(0).get()
        life.stuck.broadcast()
        pm.stop().get(timeout=60)
        print("stopped")
        """.replace("PATH", str(tmp_path / "c")),
        MONARCH_STOP_TIMEOUT="1",
    )
    assert result.returncode == 0, result.stderr
    assert "stopped" in result.stdout


def test_shutdown_context_stops_everything_and_allows_a_fresh_start(tmp_path):
    result = run_client(
        tmp_path,
        """
        import os
        from monarch.actor import this_host, shutdown_context
        from tests.actors.api_actors import Counter
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        print(list(pm.spawn("c", Counter, 0).incr.call().get().values()))
        shutdown_context().get(timeout=60)
        print("url after shutdown:", os.environ.get("MONARCH_NATS_URL"))
        pm2 = this_host().spawn_procs(per_host={"gpus": 1})
        print(list(pm2.spawn("c", Counter, 7).incr.call().get().values()))
        shutdown_context().get(timeout=60)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[1, 1]", "url after shutdown: None", "[8]"]
    assert list((tmp_path / "tmp").iterdir()) == []


# -- controllers --------------------------------------------------------------------


def test_get_or_spawn_controller_returns_one_actor_to_every_caller(procs):
    users = procs.spawn("ctrl_users", ControllerUser)
    mine = get_or_spawn_controller("shared_counter", Counter, 0).get(timeout=60)
    ids = set(users.controller_id.call().get(timeout=60).values())
    ids |= set(users.controller_id.call().get(timeout=60).values())
    assert ids == {mine.where.call_one().get(timeout=30)[1]}
    # six increments from three procs, racing, and one more from here
    assert mine.incr.call_one().get(timeout=30) == 7
    assert mine.where.call_one().get(timeout=30)[0] == os.getpid()


# -- the exported names ---------------------------------------------------------------

MONARCH_ACTOR_ALL = [
    "Accumulator", "Actor", "ActorError", "current_actor_name", "as_endpoint", "current_rank",
    "current_size", "endpoint", "Future", "local_proc_mesh", "Point", "proc_mesh", "ProcMesh",
    "Channel", "send", "shutdown_context", "sim_proc_mesh", "ValueMesh", "debug_controller",
    "get_or_spawn_controller", "this_host", "this_proc", "HostMesh", "context",
    "hosts_from_config", "Port", "PortReceiver", "Endpoint", "Extent", "run_worker_loop_forever",
    "attach_to_workers", "enable_transport", "Context", "ChannelTransport",
    "unhandled_fault_hook", "MeshFailure", "config", "gpu_direct_rdma_supported",
    "ProcId", "Uid", "returns_future",
]  # fmt: skip


def test_every_monarch_actor_name_exists():
    missing = [name for name in MONARCH_ACTOR_ALL if not hasattr(api, name)]
    assert missing == []


@pytest.mark.parametrize("name", ["sim_proc_mesh", "debug_controller"])
def test_unsupported_names_say_so(name):
    with pytest.raises(NotImplementedError, match="not available"):
        getattr(api, name)("x")


def run_client(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(code))
    store = tmp_path / "tmp"
    store.mkdir(exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    full_env.update(TMPDIR=str(store), PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, str(script)], env=full_env, capture_output=True, text=True, timeout=120
    )
