"""Calling actors: adverbs, futures, value meshes, slices, context, errors."""

from __future__ import annotations

import asyncio
import os

import pytest

from monarch.actor import (
    ActorError,
    Extent,
    MeshStoppedError,
    NotAnEndpointError,
    Point,
    ValueMesh,
    this_host,
)
from tests.actors.actors_for_tests import AsyncEcho, AsyncRelay, Echo, Relay
from tests.helpers import pid_alive, proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 4})


@pytest.fixture
def echo(procs):
    return procs.spawn("echo", Echo)


def test_call_returns_value_mesh_in_rank_order(echo):
    vm = echo.whoami.call().get(timeout=30)
    assert isinstance(vm, ValueMesh)
    assert len(vm) == 4
    assert [v["rank"] for v in vm.values()] == [0, 1, 2, 3]
    assert [p.rank for p, _ in vm.items()] == [0, 1, 2, 3]
    assert vm.item(gpus=2)["point"] == {"gpus": 2}
    assert len({v["pid"] for v in vm.values()}) == 4  # four real processes
    assert [dict(p) for p, _ in vm] == [{"gpus": i} for i in range(4)]


def test_call_one_on_sliced_mesh(echo):
    assert echo.slice(gpus=2).ping.call_one(7).get(timeout=30) == 7
    info = echo.slice(gpus=2).whoami.call_one().get(timeout=30)
    assert info["rank"] == 2


def test_call_one_needs_exactly_one_actor(echo):
    with pytest.raises(ValueError, match="exactly one actor"):
        echo.ping.call_one(1)
    with pytest.raises(ValueError, match="exactly one actor"):
        echo.slice(gpus=slice(0, 2)).ping.call_one(1)


def test_slice_with_range_keeps_dimension_and_message_rank(echo):
    part = echo.slice(gpus=slice(1, 3))
    assert part.extent == Extent(["gpus"], [2])
    vm = part.whoami.call().get(timeout=30)
    assert [v["rank"] for v in vm.values()] == [1, 2]
    assert [v["message_rank"] for v in vm.values()] == [0, 1]
    assert [v["message_extent"] for v in vm.values()] == [{"gpus": 2}, {"gpus": 2}]
    assert [v["size"] for v in vm.values()] == [{"gpus": 4}, {"gpus": 4}]


def test_choose_reaches_one_actor(echo):
    assert echo.ping.choose("x").get(timeout=30) == "x"


def test_stream_yields_one_future_per_actor(echo):
    values = sorted(f.get(timeout=30)["rank"] for f in echo.whoami.stream())
    assert values == [0, 1, 2, 3]


def test_broadcast_is_delivered_before_a_later_call(echo):
    for i in range(20):
        echo.record.broadcast("b", i)
    logs = echo.seen_log.call().get(timeout=30)
    for log in logs.values():
        assert log == [("b", i) for i in range(20)]


def test_async_endpoint(procs):
    aecho = procs.spawn("aecho", AsyncEcho)
    assert list(aecho.aping.call(3).get(timeout=30).values()) == [3, 3, 3, 3]


def test_future_await_and_as_asyncio(echo):
    async def main():
        a = await echo.slice(gpus=0).ping.call_one(1)
        b = await echo.slice(gpus=1).ping.call_one(2).as_asyncio()
        return a, b

    assert asyncio.run(main()) == (1, 2)


def test_get_timeout_raises_and_future_stays_usable(procs):
    class_ = procs.spawn("slow", Echo)
    fut = class_.slice(gpus=0).ping.call_one(5)
    # A zero timeout on a call that needs a network round trip cannot be done yet.
    with pytest.raises(TimeoutError):
        fut.get(timeout=0)
    assert fut.get(timeout=30) == 5
    assert fut.get() == 5


def test_endpoint_error_is_actor_error_and_actor_keeps_serving(echo):
    with pytest.raises(ActorError) as info:
        echo.slice(gpus=1).fail.call_one("boom").get(timeout=30)
    err = info.value
    assert isinstance(err.exception, ValueError)
    assert str(err.exception) == "boom"
    assert "raise ValueError(message)" in err.traceback
    assert "[1]" in err.actor_id
    assert echo.slice(gpus=1).ping.call_one(2).get(timeout=30) == 2


def test_sync_endpoint_blocking_on_another_actor_does_not_deadlock(procs, echo):
    relay = procs.spawn("relay", Relay, echo)
    vm = relay.relay_sync.call(9).get(timeout=60)
    assert [list(v.values()) for v in vm.values()] == [[9] * 4] * 4
    relay = procs.spawn("arelay", AsyncRelay, echo)
    vm = relay.relay_async.call(4).get(timeout=60)
    assert [list(v.values()) for v in vm.values()] == [[4] * 4] * 4


def test_point_and_extent_print_like_monarch():
    e = Extent(["hosts", "gpus"], [2, 4])
    assert repr(Point(1, e)) == "{'hosts': 0/2, 'gpus': 1/4}"
    assert repr(e) == "{hosts: 2, gpus: 4}"  # as Monarch prints an Extent
    assert e.nelements == 8
    assert dict(Point(6, e)) == {"hosts": 1, "gpus": 2}


def test_proc_mesh_stop_leaves_no_process(nats_url):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("e", Echo)
    pids = [v["pid"] for v in mesh.whoami.call().get(timeout=30).values()]
    pm.stop().get(timeout=30)
    assert not any(pid_alive(p) for p in pids)
    assert pm.stop().get(timeout=5) is None  # stopping twice is harmless


# -- bad input: a precise exception at the caller, never a hang ----------------------


def test_unknown_and_non_endpoint_attributes(echo):
    with pytest.raises(NotAnEndpointError, match="not an endpoint"):
        echo.helper.call_one()
    with pytest.raises(NotAnEndpointError, match="as_endpoint"):
        echo.helper()
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        echo.nope


def test_wrong_arguments_fail_at_the_caller(echo):
    with pytest.raises(TypeError, match="Echo.ping"):
        echo.ping.call()
    with pytest.raises(TypeError, match="unexpected keyword"):
        echo.ping.call(1, y=2)
    with pytest.raises(TypeError, match="Echo"):
        echo.ping(1)  # an endpoint is not called directly


def test_wrong_init_arguments_fail_at_the_caller(procs):
    with pytest.raises(TypeError, match="Echo"):
        procs.spawn("bad", Echo, 1, 2, 3)


def test_unpicklable_argument_fails_at_the_caller(echo):
    import threading

    with pytest.raises(TypeError, match="lock"):
        echo.ping.call(threading.Lock())
    assert list(echo.ping.call(1).get(timeout=30).values()) == [1] * 4


def test_unpicklable_return_value_is_an_error_at_the_caller(echo):
    with pytest.raises(ActorError, match="lock"):
        echo.slice(gpus=0).returns_unpicklable.call_one().get(timeout=30)


def test_call_to_stopped_mesh_raises(nats_url):
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("e", Echo)
    assert mesh.ping.call_one(1).get(timeout=30) == 1
    pm.stop().get(timeout=30)
    with pytest.raises(MeshStoppedError):
        mesh.ping.call_one(1)
    with pytest.raises(MeshStoppedError):
        pm.spawn("again", Echo)


def test_procs_get_rank_environment(echo):
    assert os.environ.get("MONARCH_RANK") is None


def test_procs_are_forked_from_the_zygote(echo):
    from monarch.actors.procs import zygote_client

    zygote = zygote_client._the_zygote
    assert zygote is not None and zygote.popen.poll() is None
    # The zygote itself, or (once it has imported torch) its torch zygote.
    forkers = {zygote.popen.pid, zygote.torch_zygote}
    for info in echo.whoami.call().get(timeout=30).values():
        with open(f"/proc/{info['pid']}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        assert ppid in forkers


def test_a_future_of_a_coroutine_resolves_without_a_runtime_loop():
    """Monarch's private ``Future._from_coro``: scripts and tests build futures from coroutines."""
    from monarch.actor import Future

    async def add(a, b):
        await asyncio.sleep(0.01)
        return a + b

    async def boom():
        raise ValueError("from the coroutine")

    assert Future._from_coro(add(2, 3)).get(timeout=10) == 5
    with pytest.raises(ValueError, match="from the coroutine"):
        Future._from_coro(boom()).get(timeout=10)

    async def awaited():
        return await Future._from_coro(add(1, 1))

    assert asyncio.run(awaited()) == 2
