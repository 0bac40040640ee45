"""Mesh references inside ordinary Python objects: to actors, back, on again, and still usable.

Actor, proc and host meshes (sliced or not) travel as endpoint arguments and
return values inside dataclasses and plain objects (which go by pickle), not
only at top level; where they land they keep their view and work.
"""

from __future__ import annotations

import os

import pytest

from monarch.actor import (
    ActorError,
    ActorMesh,
    HostMesh,
    NoActorError,
    ProcMesh,
    SupervisionError,
    this_host,
    this_proc,
)
from monarch.broker.bodies.codec import dumps, loads
from tests.actors.ref_actors import Box, FreshProcs, Holder, Hop, Where
from tests.helpers import pid_alive, proc_mesh_fixture, wait_until

procs = proc_mesh_fixture({"gpus": 3}, name="refs")


@pytest.fixture
def hops(procs):
    """Two Hop actors on different procs: a, b."""
    hop = procs.slice(gpus=slice(0, 2)).spawn("hop", Hop)
    return hop.slice(gpus=0), hop.slice(gpus=1)


@pytest.fixture
def where(procs):
    return procs.spawn("where", Where)


def _pids(mesh) -> list[int]:
    return [v["pid"] for v in mesh.where.call().get(timeout=60).values()]


def test_sliced_actor_mesh_in_dataclass_survives_two_hops(hops, where):
    a, b = hops
    part = where.slice(gpus=slice(1, 3))
    back = a.via.call_one(Holder(mesh=part, note="x"), b).get(timeout=60)
    assert isinstance(back, Holder) and back.note == "x"
    assert isinstance(back.mesh, ActorMesh)
    assert len(back.mesh) == 2
    # the same two actors, and the view is kept: rank 0 of the slice is gpus=1
    assert _pids(back.mesh) == _pids(part)
    assert back.mesh.slice(gpus=0).where.call_one().get(timeout=60)["pid"] == _pids(where)[1]
    assert [dict(p) for p, _ in back.mesh.where.call().get(timeout=60).items()] == [
        {"gpus": 0},
        {"gpus": 1},
    ]


def test_actor_mesh_in_object_is_callable_where_it_lands(hops, where):
    a, _ = hops
    got = a.use_mesh.call_one(Holder(mesh=where.slice(gpus=2))).get(timeout=60)
    assert len(got) == 1
    _, value = got[0]
    assert value["pid"] == _pids(where)[2]
    # what the actor sees is what a call from the client makes it see
    assert value == where.slice(gpus=2).where.call_one().get(timeout=60)


def test_proc_mesh_in_plain_object_round_trips_and_spawns(hops, procs, where):
    a, b = hops
    part = procs.slice(gpus=slice(1, 3))
    back = a.via.call_one(Box(procs=part), b).get(timeout=60)
    assert isinstance(back, Box)
    got = back.get("procs")
    assert isinstance(got, ProcMesh)
    assert dict(got.extent) == {"gpus": 2}
    # it is the owner's mesh again: spawning from the client lands on the same procs
    mesh = got.spawn("again", Where)
    assert _pids(mesh) == _pids(where)[1:]


def test_actor_spawns_on_received_proc_mesh_and_returns_the_new_mesh(hops, procs, where):
    a, b = hops
    holder = a.spawn_on.call_one(Box(procs=procs.slice(gpus=slice(0, 2)))).get(timeout=60)
    assert holder.note == "spawned by Hop"
    assert isinstance(holder.mesh, ActorMesh) and isinstance(holder.procs, ProcMesh)
    assert _pids(holder.mesh) == _pids(where)[:2]
    assert list(holder.mesh.add.call(41).get(timeout=60).values()) == [42, 42]
    # and on again to another actor, which can call it too
    used = b.use_mesh.call_one(holder).get(timeout=60)
    assert [v["pid"] for _, v in used] == _pids(where)[:2]
    # the spawner owns it: it can stop it (before the procs go, so their stop is quick)
    a.stop_spawned.call_one().get(timeout=60)
    with pytest.raises(Exception, match="stopped|no actor"):
        holder.mesh.add.call(1).get(timeout=60)


def test_received_proc_mesh_cannot_be_stopped_by_its_receiver(hops, procs, where):
    a, _ = hops
    pids = _pids(where)
    said = a.stop_procs.call_one(Holder(procs=procs)).get(timeout=60)
    assert said.startswith("ValueError") and "owner" in said
    assert all(pid_alive(p) for p in pids)
    assert _pids(where) == pids  # still working
    # and the receiver can still spawn on it after the refusal
    holder = a.spawn_on.call_one(Box(procs=procs.slice(gpus=2))).get(timeout=60)
    assert _pids(holder.mesh) == pids[2:]
    a.stop_spawned.call_one().get(timeout=60)


def test_meshes_spawned_through_a_reference_fail_calls_once_the_owner_stops_the_procs(hops):
    a, b = hops
    other = this_host().spawn_procs(per_host={"gpus": 2}, name="others")
    holder = a.spawn_on.call_one(Box(procs=other)).get(timeout=60)
    assert list(holder.mesh.add.call(1).get(timeout=60).values()) == [2, 2]
    other.stop().get(timeout=60)
    # An orderly stop is no failure (root_faults would see one). Calls raise at once
    # (nobody listens), and SupervisionError once the procs' heartbeats have ended.
    with pytest.raises((SupervisionError, NoActorError)) as info:
        holder.mesh.add.call(1).get(timeout=60)
    if isinstance(info.value, NoActorError):  # names the mesh and endpoint, not our port
        assert "no actor of mesh 'spawned_here' is listening for 'add'" in str(info.value), info.value

    def supervised() -> bool:
        try:
            holder.mesh.add.call(1).get(timeout=60)
        except SupervisionError:
            return True
        except NoActorError:
            return False
        raise AssertionError("a call on stopped actors succeeded")

    assert wait_until(supervised, timeout=30, interval=0.2)
    said = b.use_mesh.call_one(holder)  # from another actor that received it, too
    with pytest.raises((SupervisionError, NoActorError)):
        said.get(timeout=60)
    # the spawner learns it from the procs' heartbeats (through its reference)
    assert wait_until(
        lambda: a.call_spawned.call_one().get(timeout=60) == "SupervisionError",
        timeout=30,
        interval=0.2,
    )


def test_proc_mesh_sent_from_an_async_endpoint_must_be_up_first(procs):
    a = procs.slice(gpus=0).spawn("fresh_starter", FreshProcs)
    with pytest.raises(ActorError, match="still starting: `await procs.initialized`"):
        a.fresh_procs.call_one(False).get(timeout=60)
    box = a.fresh_procs.call_one(True).get(timeout=60)
    mesh = box.get("procs").spawn("fresh_where", Where)
    assert mesh.add.call_one(1).get(timeout=60) == 2


def test_this_proc_travels_both_ways(hops):
    a, _ = hops
    box = a.own_proc.call_one().get(timeout=60)
    theirs = box.get("procs")
    assert isinstance(theirs, ProcMesh) and dict(theirs.extent) == {}
    # the client spawns next to the actor, in the actor's process
    assert _pids(theirs.spawn("beside", Where)) == [box.get("pid")]
    # and the actor spawns in the client's process, through the client's this_proc()
    holder = a.spawn_on.call_one(Box(procs=this_proc())).get(timeout=60)
    assert _pids(holder.mesh) == [os.getpid()]


def test_host_mesh_in_object_starts_procs_where_it_lands(hops):
    a, b = hops
    back = a.via.call_one(Holder(hosts=this_host()), b).get(timeout=60)
    assert isinstance(back.hosts, HostMesh)
    assert dict(back.hosts.extent) == {}
    said = a.procs_on_host.call_one(Box(hosts=this_host())).get(timeout=60)
    assert len(said) == 1 and said[0]["rank"] == 0


def test_top_level_proc_and_host_meshes_travel_as_ext_types(procs):
    # without pickle: the msgpack extension types
    for value in (procs.slice(gpus=1), this_host()):
        body = dumps([value], allow_pickle=False)
        (back,) = loads(body, allow_pickle=False)
        assert type(back) is type(value)
        assert back.extent == value.extent


def test_references_in_objects_and_at_top_level_decode_alike(where, procs):
    part = where.slice(gpus=slice(0, 2))
    pickled = loads(dumps(Holder(mesh=part, procs=procs.slice(gpus=2))))
    plain = loads(dumps([part, procs.slice(gpus=2)], allow_pickle=False))
    assert pickled.mesh._state is plain[0]._state is part._state
    assert pickled.mesh._view == plain[0]._view == part._view
    assert pickled.procs._state is plain[1]._state is procs._state
    assert pickled.procs._view == plain[1]._view
