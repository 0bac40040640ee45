"""A call to a proc's whole ``per_proc`` group, begun for its idle actors in one pass
(:mod:`monarch.actors.hosting.group_call`).

Real procs and a real nats-server (and the client's own proc for what only its
process can see): the pass is taken for a plain call to the whole mesh and not
for a slice or while calls are recorded; what each actor sees is its own (its
rank, its context variables, its task across awaits); a busy actor gets the call
after what it is doing; each actor's activity counts its calls and its lost-message
check refuses a call after lost sends; a reply that cannot be encoded, an endpoint
that raises SystemExit and one that suspends inside a reducing call each answer as
on the general path.
"""

from __future__ import annotations

import asyncio
import contextvars
import operator
import threading

import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    SupervisionError,
    context,
    current_rank,
    endpoint,
    this_proc,
)
from monarch.actors.calls.activity import call_listeners
from monarch.actors.errors import MessageLostError
from monarch.actors.hosting.server import local_server
from monarch.actors.process_state import actor_process
from monarch.core.process_runtime import runtime
from tests.helpers import proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 2}, name="gc_procs")

seen_by: contextvars.ContextVar[int | None] = contextvars.ContextVar("seen_by", default=None)


class Member(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []

    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def whoami(self) -> tuple[int, dict, int | None]:
        """This actor's rank, where the message went, and what its previous call set."""
        before = seen_by.get()
        seen_by.set(current_rank().rank)
        return current_rank().rank, dict(context().message_rank), before

    @endpoint
    async def slow(self, seconds: float) -> str:
        self.log.append("slow begins")
        await asyncio.sleep(seconds)
        self.log.append("slow ends")
        return "slow"

    @endpoint
    async def note(self, what: str) -> list[str]:
        self.log.append(what)
        return list(self.log)

    @endpoint
    async def lock_on(self, rank: int) -> object:
        """A reply no codec can encode, from ``rank`` only."""
        return threading.Lock() if current_rank().rank == rank else current_rank().rank

    @endpoint
    async def exit_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise SystemExit(3)
        return current_rank().rank

    @endpoint
    async def cancelled_on(self, rank: int, after_an_await: bool) -> int:
        """CancelledError raised by the endpoint itself (nobody cancelled its task)."""
        if current_rank().rank == rank:
            if after_an_await:
                await asyncio.sleep(0.01)
            raise asyncio.CancelledError()
        return current_rank().rank

    @endpoint
    async def times(self, x: int) -> int:
        """Odd ranks await before answering, even ones answer at once."""
        task = asyncio.current_task()
        if current_rank().rank % 2:
            await asyncio.sleep(0.01)
        assert asyncio.current_task() is task
        return current_rank().rank * x


def _count_dispatches(mesh_name: str) -> dict[int, int]:
    """Hang a counter on the general path (``_on_loop``) of each local actor of a mesh:
    rank -> how many messages it dispatched (the dict fills as they do)."""
    counts: dict[int, int] = {}
    for inst in local_server(runtime()).actors.values():
        if inst.name != mesh_name:
            continue
        counts[inst.rank] = 0
        runner = inst._runner
        general = runner._handle

        def counting(item, general=general, rank=inst.rank):
            counts[rank] += 1
            return general(item)

        runner._handle = counting
    return counts


def test_a_call_to_the_whole_group_skips_each_actors_dispatch_and_a_slice_does_not(nats_url):
    mesh = this_proc().per_proc(workers=4).spawn("gc_local", Member)
    assert list(mesh.ping.call(4).get(timeout=60).values()) == [4] * 4  # spawned
    counts = _count_dispatches("gc_local")
    assert sorted(counts) == [0, 1, 2, 3]
    assert list(mesh.ping.call(5).get(timeout=60).values()) == [5] * 4
    assert counts == {0: 0, 1: 0, 2: 0, 3: 0}  # one pass for the group
    assert list(mesh.slice(workers=slice(1, 3)).ping.call(6).get(timeout=60).values()) == [6, 6]
    assert counts == {0: 0, 1: 1, 2: 1, 3: 0}  # a slice: each actor's own subscription
    call_listeners.append(lambda record: None)  # someone records calls: the general path
    try:
        assert list(mesh.ping.call(7).get(timeout=60).values()) == [7] * 4
    finally:
        call_listeners.pop()
    assert counts == {0: 1, 1: 2, 2: 2, 3: 1}
    mesh.stop().get(timeout=60)


def test_each_actors_calls_in_the_group_pass_are_in_its_activity(nats_url):
    mesh = this_proc().per_proc(workers=4).spawn("gc_activity", Member)
    for x in range(3):
        assert list(mesh.ping.call(x).get(timeout=60).values()) == [x] * 4
    books = {
        inst.rank: inst.activity
        for inst in local_server(runtime()).actors.values()
        if inst.name == "gc_activity"
    }
    assert sorted(books) == [0, 1, 2, 3]
    for book in books.values():
        stats = book.endpoints["ping"]
        assert (stats.calls, stats.errors, sum(stats.hist)) == (3, 0, 3)
        assert not book.in_flight  # each call begun in the pass was ended there
    mesh.stop().get(timeout=60)


def test_a_group_call_after_lost_sends_is_refused_by_each_actor_and_runs_nowhere(procs):
    mesh = procs.per_proc(workers=3).spawn("gc_lost", Member)
    mesh.note.broadcast("sent")
    assert list(mesh.note.call("called").get(timeout=60).values()) == [["sent", "called"]] * 6
    # Two more sends to the group "died with a broker node": the next call says so.
    counts = actor_process(runtime()).sends._count
    [subject] = [s for s in counts if ".gc_lost." in s]
    counts[subject] += 2
    with pytest.raises(MessageLostError, match="2 earlier message"):
        mesh.note.call("refused").get(timeout=60)
    got = mesh.note.call("after").get(timeout=60)  # the refused call ran on no rank
    assert list(got.values()) == [["sent", "called", "after"]] * 6
    mesh.stop().get(timeout=60)


def test_each_actor_sees_its_own_rank_place_and_context_variables(procs):
    mesh = procs.per_proc(workers=3).spawn("gc_who", Member)
    places = [{"gpus": g, "workers": w} for g in range(2) for w in range(3)]
    first = list(mesh.whoami.call().get(timeout=60).values())
    assert first == [(r, places[r], None) for r in range(6)]
    # what an actor's endpoint set is its own next time, never a sibling's
    second = list(mesh.whoami.call().get(timeout=60).values())
    assert second == [(r, places[r], r) for r in range(6)]
    mesh.stop().get(timeout=60)


def test_a_busy_actor_gets_the_group_call_after_what_it_is_doing(procs):
    mesh = procs.per_proc(workers=3).spawn("gc_busy", Member)
    slow = mesh.slice(gpus=0, workers=1).slow.call_one(0.5)
    logs = mesh.note.call("group").get(timeout=60)
    assert slow.get(timeout=60) == "slow"
    got = list(logs.values())
    assert got[1] == ["slow begins", "slow ends", "group"]
    assert got[:1] + got[2:] == [["group"]] * 5
    mesh.stop().get(timeout=60)


def test_a_reply_that_cannot_be_encoded_fails_its_rank_only(procs):
    mesh = procs.per_proc(workers=3).spawn("gc_lock", Member)
    outcomes = {}
    for fut in mesh.lock_on.stream(4):
        try:
            outcomes[fut.get(timeout=60)] = "ok"
        except ActorError as e:
            outcomes[e.rank] = "lock" if "lock" in str(e) else str(e)
    assert outcomes == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 4: "lock", 5: "ok"}
    assert list(mesh.ping.call(1).get(timeout=60).values()) == [1] * 6  # all still serving
    mesh.stop().get(timeout=60)


def test_system_exit_in_one_endpoint_fails_that_actor_and_its_siblings_answer(procs, root_faults):
    mesh = procs.per_proc(workers=3).spawn("gc_exit", Member)
    with pytest.raises(SupervisionError) as caught:
        mesh.exit_on.call(2).get(timeout=60)
    assert caught.value.rank == 2
    [failure] = root_faults.wait()  # the owner hears of it (here: the root's hook)
    assert failure.ranks == [2]
    others = mesh.slice(gpus=1)
    assert list(others.ping.call(9).get(timeout=60).values()) == [9] * 3
    with pytest.raises(SupervisionError):  # the failed actor refuses what comes next
        mesh.slice(gpus=0, workers=2).ping.call_one(1).get(timeout=60)


@pytest.mark.parametrize("after_an_await", [False, True], ids=["first-step", "after-an-await"])
def test_cancelled_error_raised_by_an_endpoint_fails_its_actor_instead_of_hanging_its_callers(
    procs, root_faults, after_an_await
):
    # Monarch 0.7 leaves this call, and every later one to the actor, waiting for their
    # timeouts; ours took its first step's CancelledError for a cancellation and logged
    # it, and one raised after an await ended the actor's runner task silently.
    mesh = procs.per_proc(workers=3).spawn("gc_cancel", Member)
    with pytest.raises(SupervisionError, match="CancelledError") as caught:  # the group pass
        mesh.cancelled_on.call(4, after_an_await).get(timeout=60)
    assert caught.value.rank == 4
    assert [f.ranks for f in root_faults.wait()] == [[4]]  # the owner hears of it
    with pytest.raises(SupervisionError):  # the failed actor refuses what comes next
        mesh.slice(gpus=1, workers=1).ping.call_one(1).get(timeout=60)
    one = mesh.slice(gpus=0, workers=2)  # the general path: one actor's own subscription
    with pytest.raises(SupervisionError, match="CancelledError"):
        one.cancelled_on.call_one(0, after_an_await).get(timeout=60)  # (its rank in the slice)
    assert [f.ranks for f in root_faults.wait(2)] == [[4], [2]]
    siblings = mesh.slice(gpus=0, workers=slice(0, 2))
    assert list(siblings.ping.call(9).get(timeout=60).values()) == [9, 9]


def test_endpoints_that_suspend_inside_a_reducing_call_are_merged_with_those_that_do_not(procs):
    mesh = procs.per_proc(workers=4).spawn("gc_merge", Member)
    merged = Accumulator(mesh.times, 0, operator.add, reducer=operator.add)
    for x in (1, 3):
        assert merged.accumulate(x).get(timeout=60) == sum(range(8)) * x
    assert list(mesh.times.call(2).get(timeout=60).values()) == [2 * r for r in range(8)]
    mesh.stop().get(timeout=60)
