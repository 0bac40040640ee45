"""Inside an endpoint, ``current_rank()``/``current_size()`` describe the message's
point in the mesh (or slice) it was sent to, as in Monarch."""

from __future__ import annotations

import operator

import pytest

from monarch.actor import Accumulator, Channel, current_actor_name, current_rank, send
from tests.actors.lifecycle_actors import AsyncWhere, SyncWhere
from tests.helpers import proc_mesh_fixture

# Every test here runs on a 2 x 2 mesh: global rank = 2 * hosts + procs.


procs = proc_mesh_fixture({"hosts": 2, "procs": 2})


@pytest.fixture
def sync_mesh(procs):
    return procs.spawn("where", SyncWhere)


def _by_own_rank(vm) -> dict:
    """Replies of a call, keyed by the replying actor's point in the whole mesh."""
    return {tuple(v["own_point"].values()): v for v in vm.values()}


def test_whole_mesh_rank_is_the_actor_point(sync_mesh):
    vm = sync_mesh.where.call().get(timeout=60)
    for point, v in vm.items():
        assert v["point"] == v["own_point"] == dict(point)
        assert v["size"] == {"hosts": 2, "procs": 2}


def test_range_slice_renumbers_ranks_from_zero(sync_mesh):
    part = sync_mesh.slice(procs=slice(1, 2))
    replies = _by_own_rank(part.where.call().get(timeout=60))
    assert sorted(replies) == [(0, 1), (1, 1)]
    assert replies[(0, 1)]["point"] == {"hosts": 0, "procs": 0}
    assert replies[(1, 1)]["point"] == {"hosts": 1, "procs": 0}
    assert [replies[k]["rank"] for k in sorted(replies)] == [0, 1]
    assert {tuple(sorted(v["size"].items())) for v in replies.values()} == {
        (("hosts", 2), ("procs", 1))
    }
    for v in replies.values():
        assert v["point"] == v["message_point"]  # current_rank() is context().message_rank


def test_integer_index_drops_its_dimension(sync_mesh):
    replies = _by_own_rank(sync_mesh.slice(procs=1).where.call().get(timeout=60))
    assert replies[(0, 1)]["point"] == {"hosts": 0}
    assert replies[(1, 1)]["point"] == {"hosts": 1}
    assert all(v["size"] == {"hosts": 2} for v in replies.values())

    row = _by_own_rank(sync_mesh.slice(hosts=1, procs=slice(0, 2)).where.call().get(timeout=60))
    assert [row[k]["point"] for k in sorted(row)] == [{"procs": 0}, {"procs": 1}]
    assert all(v["size"] == {"procs": 2} for v in row.values())

    one = sync_mesh.slice(hosts=1, procs=0).where.call_one().get(timeout=60)
    assert (one["point"], one["rank"], one["size"]) == ({}, 0, {})
    assert one["own_point"] == {"hosts": 1, "procs": 0}


def test_init_sees_the_actor_point_in_its_mesh(sync_mesh):
    init = sync_mesh.slice(hosts=1, procs=1).init_where.call_one().get(timeout=60)
    assert init["point"] == init["own_point"] == {"hosts": 1, "procs": 1}
    assert init["size"] == {"hosts": 2, "procs": 2}


def test_async_and_concurrent_endpoints_see_slice_ranks(procs):
    mesh = procs.spawn("awhere", AsyncWhere)
    part = mesh.slice(hosts=slice(1, 2))
    for replies in (
        _by_own_rank(part.where.call().get(timeout=60)),
        _by_own_rank(part.concurrent_where.call().get(timeout=60)),
    ):
        assert replies[(1, 0)]["point"] == {"hosts": 0, "procs": 0}
        assert replies[(1, 1)]["point"] == {"hosts": 0, "procs": 1}
        assert all(v["size"] == {"hosts": 1, "procs": 2} for v in replies.values())


def test_explicit_port_endpoint_sees_slice_ranks(sync_mesh):
    one = sync_mesh.slice(hosts=0, procs=slice(1, 2)).where_to_port.call_one().get(timeout=60)
    assert (one["point"], one["size"], one["own_point"]) == (
        {"procs": 0},
        {"procs": 1},
        {"hosts": 0, "procs": 1},
    )


def test_accumulator_on_a_slice_folds_slice_ranks(sync_mesh):
    part = sync_mesh.slice(procs=slice(1, 2))
    acc = Accumulator(part.run, 0, operator.add)
    assert acc.accumulate(lambda: current_rank()["hosts"]).get(timeout=60) == 0 + 1
    assert acc.accumulate(lambda: current_rank().rank).get(timeout=60) == 0 + 1
    assert acc.accumulate(lambda: current_rank()["procs"]).get(timeout=60) == 0


def test_send_to_a_port_and_stream_on_a_slice_see_slice_ranks(sync_mesh):
    part = sync_mesh.slice(hosts=slice(0, 2), procs=1)
    port, receiver = Channel.open()
    send(part.where, (), {}, port=port)
    sent = [receiver.recv().get(timeout=60) for _ in range(2)]
    streamed = [f.get(timeout=60) for f in part.where.stream()]
    for replies in (sent, streamed):
        by_own = {tuple(v["own_point"].values()): v["point"] for v in replies}
        assert by_own == {(0, 1): {"hosts": 0}, (1, 1): {"hosts": 1}}


def test_actor_name_is_per_rank(sync_mesh):
    vm = sync_mesh.where.call().get(timeout=60)
    names = [v["name"] for v in vm.values()]
    assert len(set(names)) == 4
    for v in vm.values():
        assert v["name"] == v["actor_id"]
        assert v["name"].startswith("where.")
    assert current_actor_name() == "client"
