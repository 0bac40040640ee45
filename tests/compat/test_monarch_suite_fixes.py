"""Behaviours of Monarch 0.7 found missing by running its own test suite on ours
(benchmarks/compare/monarch_suite.sh, docs/compatibility.md), each in our own words."""

from __future__ import annotations

import threading

import pytest

from monarch.actor import Actor, Channel, endpoint, this_host
from tests.helpers import proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 1}, name="compat_procs")


class Echo(Actor):
    def __init__(self, value: int) -> None:
        self.value = value

    @endpoint
    async def get(self) -> int:
        return self.value


class StuckInInit(Actor):
    """An async actor whose constructor hands out a sibling, then never returns."""

    def __init__(self, send) -> None:
        send.send(7)
        threading.Event().wait()

    @endpoint
    async def never(self) -> None:
        pass


def test_an_async_actor_stuck_in_init_leaves_the_rest_of_its_proc_serving(procs):
    # (`procs`: the client runtime is up before this test; the stuck actor gets its own mesh)
    stuck_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="stuck_procs")
    send, recv = Channel.open()
    stuck = stuck_procs.spawn("stuck", StuckInInit, send)
    # its __init__ ran (the port message left the proc) and never ended ...
    assert recv.recv().get(timeout=60) == 7
    # ... yet the same proc spawns and serves another actor, and the stuck one stops
    echo = stuck_procs.spawn("echo", Echo, 5)
    assert echo.get.call_one().get(timeout=60) == 5
    stuck.stop().get(timeout=60)
    assert echo.get.call_one().get(timeout=60) == 5
    # the stuck mesh is stopped, so the proc mesh's stop does not wait for its spawn's
    # answer (it would wait up to MONARCH_SPAWN_TIMEOUT for a mesh still wanted): it
    # ends the proc, stuck thread and all
    stuck_procs.stop().get(timeout=300)
    with pytest.raises(Exception, match="stopped"):
        echo.get.call_one().get(timeout=60)


class StartsATaskInInit(Actor):
    """``asyncio.create_task`` in ``__init__`` starts a task where the endpoints run."""

    def __init__(self) -> None:
        import asyncio

        self.ticks = 0
        self.task = asyncio.create_task(self._tick())
        self.local = threading.local()
        self.local.mark = "from __init__"

    async def _tick(self) -> None:
        self.ticks += 1

    @endpoint
    async def state(self) -> tuple[bool, int, str]:
        await self.task
        return self.task.done(), self.ticks, self.local.mark


def test_an_async_actors_init_still_sees_the_loop_and_its_thread_locals_carry_over(procs):
    actor = procs.spawn("tasks", StartsATaskInInit)
    assert actor.state.call_one().get(timeout=60) == (True, 1, "from __init__")
