"""Monarch 0.7 names added for issue 36: ``returns_future``, ``ProcId``/``Uid``,
``monarch.experimental.ThreadTimeout``, ``ProcMesh.to_table``/``from_host_mesh``,
``HostMesh.stream_logs``. Behaviour is checked on real procs where it involves them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import time

import pytest

from monarch.actor import (
    Actor,
    Extent,
    ProcId,
    ProcMesh,
    Uid,
    context,
    endpoint,
    returns_future,
    this_host,
)
from monarch.actors.procs.mesh_table import per_host_of
from monarch.experimental import ThreadTimeout, ThreadTimeoutError

# -- returns_future -------------------------------------------------------------------

ran: list[str] = []


@returns_future
async def rank_plus(offset: int) -> int:
    await asyncio.sleep(0)
    return context().actor_instance.rank.rank + offset


@returns_future
async def record(tag: str) -> str:
    ran.append(tag)
    return tag


@returns_future
async def fails() -> None:
    raise KeyError("from the body")


class AwaitsIt(Actor):
    @endpoint
    async def plus(self, offset: int) -> int:
        return await rank_plus(offset)


class GetsIt(Actor):
    @endpoint
    def plus(self, offset: int) -> int:
        return rank_plus(offset).get(timeout=30)


def test_returns_future_starts_its_body_at_the_first_observer_only():
    ran.clear()
    pending = record("get")
    assert ran == []  # calling it ran nothing
    assert pending.get(timeout=30) == "get" and pending.get(timeout=30) == "get"
    assert ran == ["get"]  # once, however often it is observed

    async def main() -> str:
        return await record("await")

    assert asyncio.run(main()) == "await"
    assert ran == ["get", "await"]

    record("dropped")
    gc.collect()
    assert ran == ["get", "await"]  # never observed: never run
    with pytest.raises(KeyError, match="from the body"):
        fails().get(timeout=30)


def test_returns_future_in_async_and_sync_endpoints_sees_the_callers_context(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="rf")
    try:
        awaits, gets = procs.spawn("rf_awaits", AwaitsIt), procs.spawn("rf_gets", GetsIt)
        assert sorted(awaits.plus.call(10).get(timeout=60).values()) == [10, 11]
        assert sorted(gets.plus.call(20).get(timeout=60).values()) == [20, 21]
    finally:
        procs.stop().get(timeout=60)


@returns_future
async def gets_another() -> str:
    return record("inner").get(timeout=5)


def test_returns_future_get_inside_a_body_that_get_runs_says_await_instead():
    with pytest.raises(RuntimeError, match="await it there instead"):
        gets_another().get(timeout=30)


def test_returns_future_refuses_a_plain_function():
    with pytest.raises(TypeError, match="async def"):
        returns_future(lambda: 1)  # type: ignore[arg-type]


# -- ProcId / Uid ---------------------------------------------------------------------


def test_uid_and_proc_id_round_trip_compare_and_pickle():
    uid = Uid.instance("service")
    assert uid.is_instance and not uid.is_singleton and uid.label == "service"
    assert Uid.from_string(str(uid)) == uid and hash(Uid.from_string(str(uid))) == hash(uid)
    assert Uid.instance("service") != uid  # fresh each time
    fixed = Uid.instance_from_value(0xC0FFEE, "w")
    assert str(fixed) == "w<0000000000c0ffee>" and fixed.instance_value == 0xC0FFEE
    assert Uid.instance_from_value(0xC0FFEE, "w") == fixed
    assert Uid.anonymous().label is None and str(Uid.anonymous()).startswith("<")
    singleton = Uid.from_string("service")
    assert (
        singleton.is_singleton and singleton.instance_value is None and str(singleton) == "service"
    )

    pid = ProcId(uid)
    assert pid.uid == uid and pid.label == "service" and str(pid) == str(uid)
    assert ProcId.from_string(str(pid)) == pid
    assert pickle.loads(pickle.dumps(pid)) == pid and pickle.loads(pickle.dumps(uid)) == uid
    assert len({pid, ProcId.from_string(str(pid))}) == 1


def test_uid_and_proc_id_refuse_bad_input_clearly():
    with pytest.raises(ValueError, match="not a uid"):
        Uid.from_string("bad uid<zz>")
    with pytest.raises(ValueError, match="2\\*\\*64"):
        Uid.instance_from_value(-1)
    with pytest.raises(ValueError, match="label"):
        Uid.instance("has space")
    with pytest.raises(TypeError, match="takes a Uid"):
        ProcId("service<01>")  # type: ignore[arg-type]


# -- ThreadTimeout --------------------------------------------------------------------


def spin_swallowing_exceptions(seconds: float) -> None:
    """Pure Python work whose ``except Exception`` must not hide the timeout."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sum(range(1000))
        except Exception:  # noqa: BLE001  (the point: ThreadTimeoutError gets through)
            pass


class Guarded(Actor):
    @endpoint
    def work(self, seconds: float, limit: float) -> str:
        try:
            with ThreadTimeout(limit):
                spin_swallowing_exceptions(seconds)
        except ThreadTimeoutError:
            return "timed out"
        return "finished"


def test_thread_timeout_stops_a_sync_endpoint_on_its_own_thread(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="tt")
    try:
        guarded = procs.spawn("guarded", Guarded)
        assert list(guarded.work.call(60.0, 0.2).get(timeout=60).values()) == ["timed out"]
        assert list(guarded.work.call(0.0, 30.0).get(timeout=60).values()) == ["finished"]
    finally:
        procs.stop().get(timeout=60)


def test_thread_timeout_is_single_use_not_nested_and_positive():
    with pytest.raises(ValueError, match="positive"):
        ThreadTimeout(0)
    guard = ThreadTimeout(30)
    with guard:
        with pytest.raises(RuntimeError, match="nested"):
            with ThreadTimeout(30):
                pass
    with pytest.raises(RuntimeError, match="used once"):
        with guard:
            pass
    with pytest.raises(ZeroDivisionError):  # the block's own error goes through
        with ThreadTimeout(30):
            1 / 0  # noqa: B018
    assert issubclass(ThreadTimeoutError, BaseException)
    assert not issubclass(ThreadTimeoutError, Exception)


# -- ProcMesh.to_table / from_host_mesh, HostMesh.stream_logs ------------------------


class Says(Actor):
    @endpoint
    def say(self, text: str) -> int:
        print(text, flush=True)
        return os.getpid()

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def set_marker() -> None:
    os.environ["NAMES36_SETUP"] = "ran"


def test_from_host_mesh_starts_procs_and_to_table_says_where_each_runs(nats_url):
    hosts = this_host()
    procs = ProcMesh.from_host_mesh(hosts, None, Extent(["hosts", "gpus"], [1, 3]), set_marker)
    try:
        assert dict(procs.extent.items()) == {"hosts": 1, "gpus": 3}
        says = procs.spawn("says_env", Says)
        assert list(says.env.call("NAMES36_SETUP").get(timeout=60).values()) == ["ran"] * 3
        assert len(set(says.say.call("up").get(timeout=60).values())) == 3  # three processes
        print(procs.to_table())
        table = procs.to_table().splitlines()
        assert [c.strip() for c in table[1].split("|")[2:5]] == ["gpus=0", "gpus=1", "gpus=2"]
        assert [c.strip() for c in table[3].split("|")[2:5]] == ["0.gpu[0]", "0.gpu[1]", "0.gpu[2]"]
        # a slice keeps each proc's place
        sliced = procs.slice(gpus=slice(1, 3)).to_table()
        assert "0.gpu[1]" in sliced and "0.gpu[2]" in sliced and "0.gpu[0]" not in sliced
    finally:
        procs.stop().get(timeout=60)
    with pytest.raises(NotImplementedError, match="no Rust proc mesh"):
        ProcMesh.from_host_mesh(hosts, object())
    # a region for a two-host mesh: its dimensions first, or only the per-host ones
    two_hosts = Extent(["hosts"], [2])
    assert per_host_of(two_hosts, Extent(["hosts", "gpus"], [2, 4])) == {"gpus": 4}
    assert per_host_of(two_hosts, {"gpus": 4}) == {"gpus": 4}
    with pytest.raises(ValueError, match="repeats dimensions"):
        per_host_of(two_hosts, {"gpus": 2, "hosts": 3})


def test_to_table_of_three_dimensions_has_a_table_per_outer_coordinate(nats_url):
    procs = this_host().spawn_procs(per_host={"racks": 2, "nodes": 1, "gpus": 2}, name="tbl")
    try:
        table = procs.to_table()
    finally:
        procs.stop().get(timeout=60)
    blocks = table.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["racks=0", "racks=1"]
    assert "0.gpu[0]" in blocks[0] and "0.gpu[1]" in blocks[0]
    assert "0.gpu[2]" in blocks[1] and "0.gpu[3]" in blocks[1]
    assert table.count(".gpu[") == 4


def test_host_mesh_stream_logs_is_true_and_procs_output_reaches_the_client(nats_url, capsys):
    hosts = this_host()
    assert hosts.stream_logs is True
    procs = hosts.spawn_procs(per_host={"gpus": 1}, name="streamed")
    try:
        procs.spawn("says", Says).say.call("streamed to the client").get(timeout=60)
        deadline = time.monotonic() + 30
        out = ""
        while "streamed to the client" not in out and time.monotonic() < deadline:
            out += capsys.readouterr().out
            time.sleep(0.05)
        assert "[says[0]] streamed to the client" in out
    finally:
        procs.stop().get(timeout=60)
