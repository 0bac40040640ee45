"""What kind an actor is (sync or async), what it is called, and which proc mesh it runs on,
as in Monarch: scripts written for Monarch see the same answers."""

from __future__ import annotations

import os

import pytest

import monarch.actor
from monarch.actor import Channel, context, get_or_spawn_controller, send
from tests.actors.kind_actors import (
    AsyncSibling,
    AsyncThreadLocal,
    AsyncWithSyncCleanup,
    BesideTheClient,
    MixedKinds,
    Named,
    Ranks,
    Sibling,
    SyncThreadLocal,
    log_text,
)
from tests.helpers import proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 2}, scope="module", wait_ready=True)
procs4 = proc_mesh_fixture({"gpus": 4})


def test_mixing_sync_and_async_endpoints_is_refused_at_spawn(procs):
    with pytest.raises(ValueError, match="mixes both async and sync endpoints") as info:
        procs.spawn("mixed", MixedKinds)
    assert "sync: ['plain'] async: ['coroutine']" in str(info.value)
    with pytest.raises(ValueError, match="async endpoints, but a synchronous __cleanup__"):
        procs.spawn("sync_cleanup", AsyncWithSyncCleanup)


@pytest.mark.parametrize("cls", [AsyncThreadLocal, SyncThreadLocal])
def test_init_runs_on_the_thread_that_runs_the_endpoints(procs, cls):
    actor = procs.slice(gpus=0).spawn(f"tls_{cls.__name__.lower()}", cls)
    # a thread-local made in __init__ is there in every endpoint
    assert [actor.incr.call_one().get(timeout=60) for _ in range(3)] == [1, 2, 3]
    # sync actors: the very same thread; async actors: __init__ ran on a thread of its
    # own (so it cannot freeze the proc's loop), its thread-locals carried to the loop's
    assert actor.same_thread_as_init.call_one().get(timeout=60) is (cls is SyncThreadLocal)


def test_instances_are_named_by_their_chain_of_spawns(procs):
    me = context().actor_instance
    assert (str(me), repr(me), me.name, me.creator) == ("<root>", "<root>", "root", None)
    named = procs.spawn("the_name", Named)
    report = named.slice(gpus=0).report.call_one().get(timeout=60)
    expected = "<root>.<tests.actors.kind_actors.Named the_name{'gpus': 0/2}>"
    assert report["str"] == report["repr"] == expected
    assert report["class_name"] == "tests.actors.kind_actors.Named"
    assert (report["creator"], report["creator_name"]) == ("<root>", "root")
    assert report["log"] == f"[actor={expected}] hello\n"
    child = named.slice(gpus=0).child_report.call_one().get(timeout=60)
    grandchild = f"{expected}.<tests.actors.kind_actors.Named child{{'gpus': 1/2}}>"
    assert child["str"] == grandchild
    assert (child["creator"], child["creator_name"]) == (expected, "the_name")
    assert child["log"] == f"[actor={grandchild}] hello\n"


def test_client_log_lines_start_with_root_unless_turned_off(monkeypatch):
    context()  # the client's code has used monarch
    assert log_text("HUH") == "[actor=<root>] HUH\n"
    monkeypatch.setattr(monarch.actor.config, "prefix_python_logs_with_actor", False)
    assert log_text("HUH") == "HUH\n"


def test_proc_mesh_inside_an_actor_is_the_one_it_was_spawned_on(procs):
    pids = list(procs.spawn("pids", Sibling).pid.call().get(timeout=60).values())
    got = procs.spawn("siblings", Sibling).slice(gpus=1).spawn_siblings.call_one().get(timeout=60)
    assert got == {"type": "ProcMesh", "extent": {"gpus": 2}, "pids": pids}
    # spawned on a slice: that slice
    one = procs.slice(gpus=1).spawn("on_one", Sibling)
    got = one.spawn_siblings.call_one().get(timeout=60)
    assert got == {"type": "ProcMesh", "extent": {}, "pids": [pids[1]]}
    # from an async endpoint, on the proc's loop, too
    spawner = procs.spawn("async_spawner", AsyncSibling).slice(gpus=0)
    assert spawner.spawn_siblings.call_one().get(timeout=60) == pids


def test_a_controllers_proc_mesh_is_the_client_process(nats_url):
    controller = get_or_spawn_controller("kinds_beside_the_client", BesideTheClient).get(timeout=60)
    assert controller.spawn_beside.call_one().get(timeout=60) == os.getpid()


def test_ranked_ports_give_the_rank_within_the_slice_a_message_went_to(procs4):
    ranks = procs4.spawn("ranks", Ranks)
    tail = ranks.slice(gpus=slice(2, 4))  # global ranks 2 and 3: ranks 0 and 1 of the slice

    def received(endpoint, *args) -> list:
        port, receiver = Channel.open_ranked()
        send(endpoint, args, {}, port=port)
        return sorted(receiver.recv().get(timeout=60) for _ in range(2))

    # (rank in the slice, what the actor says its rank in the whole mesh is)
    assert received(tail.rank) == [(0, 2), (1, 3)]
    assert received(tail.rank_to_port) == [(0, 2), (1, 3)]
    port, receiver = Channel.open_ranked()
    tail.rank_to_given_port.broadcast(port)  # a port passed as an argument
    assert sorted(receiver.recv().get(timeout=60) for _ in range(2)) == [(0, 2), (1, 3)]
    # a call's value mesh is indexed by the slice, as before
    assert list(tail.rank_to_port.call().get(timeout=60).values()) == [2, 3]
    port, receiver = Channel.open_ranked()
    send(ranks.slice(gpus=3).rank, (), {}, port=port)
    assert receiver.recv().get(timeout=60) == (0, 3)
