"""Several actors of one mesh in each proc (``ProcMesh.per_proc``), and their replies.

Real procs and a real nats-server: the actors' ranks and places, one reply
message per proc for a call to the whole mesh (watched on the wire as a NATS
client would see it), per-rank failure inside such a message, slices, a proc
that dies with several ranks, a failing ``__init__``, and stopping.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from monarch.actor import Actor, ActorError, SpawnError, SupervisionError, context, endpoint
from monarch.actors.messaging.reduction import decode_ranks
from monarch.broker.bodies.codec import loads
from monarch.broker.vocabulary import headers as hdr
from monarch.core.process_runtime import runtime
from tests.helpers import captured_traffic, proc_mesh_fixture, wait_until
from tests.hosts.agents import ROOT

procs = proc_mesh_fixture({"gpus": 2}, name="pp_procs")


class Worker(Actor):
    def __init__(self, tag: str, seen: list) -> None:
        self.tag = tag
        seen.append(self.tag)  # each actor its own copy of the arguments
        self.seen = seen

    @endpoint
    async def where(self) -> tuple[int, int, dict, str, int]:
        point = context().message_rank  # where the message went: the slice's coordinates
        me = context().actor_instance.rank.rank
        return me, os.getpid(), dict(point), self.tag, len(self.seen)

    @endpoint
    async def ping(self, x: int) -> int:
        return x

    @endpoint
    async def suspend(self) -> tuple[bool, str, bool, int]:
        """Awaits across a timeout: the task it runs in, before and after, is one."""
        task = asyncio.current_task()
        try:
            async with asyncio.timeout(0.05):  # cancels the task it was entered in
                await asyncio.sleep(30)
            timed_out = False
        except TimeoutError:
            timed_out = True
        await asyncio.sleep(0)
        same = asyncio.current_task() is task
        return same, task.get_name(), timed_out, context().actor_instance.rank.rank

    @endpoint
    async def text(self, n: int) -> str:
        return str(context().actor_instance.rank.rank) * n

    @endpoint
    async def tensor(self, x: int):
        import torch

        return torch.tensor([context().actor_instance.rank.rank, x])

    @endpoint
    async def fail_on(self, rank: int) -> int:
        me = context().message_rank.rank
        if me == rank:
            raise ValueError(f"rank {me} fails on purpose")
        return me

    @endpoint
    async def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    async def keep(self, label: str, pair: tuple, items: list | None = None) -> tuple:
        """Keeps its arguments (so no id is reused meanwhile) and tells their ids."""
        if items is not None:
            items.append(context().actor_instance.rank.rank)  # only this actor's copy changes
        self.kept = (label, pair, items)
        return id(label), id(pair), items


def proc_subscriptions() -> tuple[list[str], int]:
    """In an actor: its proc's subjects subscribed once for its mesh's group, and the
    actor's own subscription count."""
    from monarch.actors.hosting.server import local_server

    server = local_server(runtime())
    me = str(context().actor_instance.actor_id)
    mine = next(i for i in server.actors.values() if i.actor_id == me)
    shared = [s for s in server.group_fanout.subjects() if f".{mine.uid}." in s]
    return shared, len(mine.subscriptions)


class Counter(Actor):
    """Counts what it hears, and reports its proc's subscriptions for this mesh."""

    def __init__(self) -> None:
        self.heard = 0

    @endpoint
    async def hear(self) -> None:
        self.heard += 1

    @endpoint
    async def heard_so_far(self) -> int:
        return self.heard

    @endpoint
    async def subscriptions(self) -> tuple[list[str], int]:
        """(this proc's subjects subscribed once for a group, this actor's own count)."""
        return proc_subscriptions()


class SyncCounter(Actor):
    """Counter with sync endpoints: each actor has its own thread."""

    def __init__(self) -> None:
        self.heard = 0

    @endpoint
    def hear(self) -> None:
        self.heard += 1

    @endpoint
    def heard_so_far(self) -> int:
        return self.heard

    @endpoint
    def subscriptions(self) -> tuple[list[str], int]:
        return proc_subscriptions()


class SyncWorker(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


class FailsOnRank(Actor):
    def __init__(self, rank: int) -> None:
        if context().actor_instance.rank.rank == rank:
            raise RuntimeError(f"__init__ of rank {rank} fails on purpose")

    @endpoint
    async def ping(self) -> int:
        return 1


def test_per_proc_places_k_actors_in_each_proc_in_row_major_order(procs):
    mesh = procs.per_proc(workers=3).spawn("pp_where", Worker, "t", [])
    assert dict(mesh.extent) == {"gpus": 2, "workers": 3}
    got = list(mesh.where.call().get(timeout=60).values())
    assert [g[0] for g in got] == list(range(6))
    assert [g[2] for g in got] == [{"gpus": i, "workers": j} for i in range(2) for j in range(3)]
    pids = [g[1] for g in got]
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5]
    assert [g[4] for g in got] == [1] * 6  # no actor saw another's copy of `seen`
    mesh.stop().get(timeout=60)


def test_a_call_to_the_whole_mesh_leaves_each_proc_as_one_message(procs):
    mesh = procs.per_proc(workers=3).spawn("pp_bundle", Worker, "t", [])
    assert list(mesh.ping.call(0).get(timeout=60).values()) == [0] * 6  # spawned, answering
    ns = runtime().namespace
    with captured_traffic(os.environ["MONARCH_NATS_URL"], f"mon.{ns}.port.>") as seen:
        for i in range(5):
            assert list(mesh.ping.call(i).get(timeout=60).values()) == [i] * 6
    replies = [(h, body) for _, h, body in seen if h.get(hdr.KIND) in ("batch", "reply")]
    # Async endpoints answer within one turn of their proc's loop: each proc's three
    # replies to a call leave as one message, gathered there: Mon-Ranks names the
    # ranks, the body is the list of their values (as a NATS client sees it).
    gathered = [(decode_ranks(h[hdr.RANKS]), loads(body)) for h, body in replies]
    assert sorted(r for r, _ in gathered) == [[0, 1, 2]] * 5 + [[3, 4, 5]] * 5, gathered
    assert sorted(v for _, v in gathered) == sorted([[i] * 3 for i in range(5)] * 2)
    mesh.stop().get(timeout=60)


def test_replies_that_cannot_be_gathered_leave_one_by_one_and_errors_keep_their_rank(procs):
    """A tensor reply (its bytes out of band in a frame) is not gathered, nor are
    replies too big together (three of 100 KB: over the 256 KiB a body may carry
    inline); an error never is (a failing rank is named, its siblings' values are
    not lost)."""
    import torch

    mesh = procs.per_proc(workers=3).spawn("pp_ungathered", Worker, "t", [])
    ns = runtime().namespace
    with captured_traffic(os.environ["MONARCH_NATS_URL"], f"mon.{ns}.port.>") as seen:
        got = mesh.tensor.call(2).get(timeout=60)
        texts = mesh.text.call(100_000).get(timeout=60)
    assert [t.tolist() for t in got.values()] == [[r, 2] for r in range(6)]
    assert list(texts.values()) == [str(r) * 100_000 for r in range(6)]
    assert not [h for _, h, _ in seen if hdr.RANKS in h]
    small = mesh.text.call(1000).get(timeout=60)  # together under 256 KiB: gathered
    assert list(small.values()) == [str(r) * 1000 for r in range(6)]
    with pytest.raises(ActorError) as caught:
        mesh.fail_on.call(4).get(timeout=60)
    assert caught.value.rank == 4 and "rank 4 fails on purpose" in str(caught.value)
    assert torch.is_tensor(got.item(gpus=0, workers=0))
    mesh.stop().get(timeout=60)


def test_what_the_whole_group_hears_is_subscribed_once_per_proc_and_heard_once(procs):
    mesh = procs.per_proc(workers=4).spawn("pp_fanout", Counter)  # 2 dims, 1 of them per proc
    subs = list(mesh.subscriptions.call().get(timeout=60).values())
    for shared, own in subs:
        # (gpus, workers) subjects: (g, _) and (_, _) once for the proc's four actors;
        # (g, w) and (_, w) each actor's own, beside its two memberships
        tails = sorted(t.rsplit(".", 2)[1:] for t in shared)
        assert tails in ([["0", "_"], ["_", "_"]], [["1", "_"], ["_", "_"]]), shared
        assert own == 4
    # every actor hears each message once, whatever slice it was sent to
    mesh.hear.broadcast()  # (_, _): shared
    mesh.slice(gpus=1).hear.broadcast()  # (1, _): shared, proc 1 only
    mesh.slice(workers=2).hear.broadcast()  # (_, 2): each actor's own
    mesh.slice(gpus=0, workers=3).hear.broadcast()  # (0, 3): one actor
    heard = list(mesh.heard_so_far.call().get(timeout=60).values())
    assert heard == [1, 1, 2, 2, 2, 2, 3, 2], heard
    mesh.stop().get(timeout=60)
    other = procs.per_proc(workers=2).spawn("pp_fanout_after", Counter)
    for shared, _ in other.subscriptions.call().get(timeout=60).values():
        assert len(shared) == 2  # its own two; the stopped mesh's were unsubscribed
    left = other.subscriptions.call().get(timeout=60)
    assert all("pp_fanout." not in t for shared, _ in left.values() for t in shared)
    other.stop().get(timeout=60)


def test_a_groups_actors_share_unchangeable_arguments_and_each_gets_its_own_list(procs):
    """A call to a whole group is decoded once per proc where nothing in its arguments
    can change (a str, a tuple of numbers and strings), and by each actor where
    something can (a list): an actor changing its list never changes a sibling's."""
    mesh = procs.per_proc(workers=3).spawn("pp_share", Worker, "t", [])
    label, pair = "x" * 100, (1, "a")

    def ids_per_proc(got: list) -> list[tuple[int, int]]:
        return [(len({g[0] for g in p}), len({g[1] for g in p})) for p in (got[:3], got[3:])]

    for _ in range(2):
        got = list(mesh.keep.call(label, pair).get(timeout=60).values())
        assert ids_per_proc(got) == [(1, 1), (1, 1)]  # one decoding per proc
        got = list(mesh.keep.call(label, pair, [9]).get(timeout=60).values())
        assert [g[2] for g in got] == [[9, r] for r in range(6)]
        assert ids_per_proc(got) == [(3, 3), (3, 3)]  # a list among them: each its own
    # a slice of the group: each actor's own subscription, its own decoding
    got = list(mesh.slice(workers=slice(0, 2)).keep.call(label, pair).get(timeout=60).values())
    assert len({g[0] for g in got[:2]}) == 2
    mesh.stop().get(timeout=60)


def test_an_endpoint_that_suspends_runs_in_its_actors_task_from_start_to_end(procs):
    """An idle actor's message starts inside the delivery itself (mailbox.LoopRunner):
    its endpoint still sees its actor's task as the current one before and after an
    await, so asyncio.timeout cancels that endpoint's wait and nothing else."""
    mesh = procs.per_proc(workers=3).spawn("pp_suspend", Worker, "t", [])
    for _ in range(2):
        first, second = mesh.suspend.call(), mesh.suspend.call()  # the second waits its turn
        for got in (first.get(timeout=60), second.get(timeout=60)):
            seen = sorted(
                (same, name.startswith("actor pp_suspend.") and name.endswith(f"[{r}]"), out, r)
                for same, name, out, r in got.values()
            )
            assert seen == [(True, True, True, r) for r in range(6)], list(got.values())
    assert list(mesh.ping.call(7).get(timeout=60).values()) == [7] * 6  # all still serving
    mesh.stop().get(timeout=60)


def test_actors_with_threads_keep_their_own_subscriptions_and_hear_each_message_once(procs):
    # Handing a burst to hundreds of actor threads at once starved the proc's loop and
    # heartbeat (benchmarks/NOTES.md 59): such actors take their own copies instead.
    mesh = procs.per_proc(workers=3).spawn("pp_sync_subs", SyncCounter)
    for shared, own in mesh.subscriptions.call().get(timeout=60).values():
        assert shared == [] and own == 4
    mesh.hear.broadcast()
    mesh.slice(workers=1).hear.broadcast()
    assert list(mesh.heard_so_far.call().get(timeout=60).values()) == [1, 2, 1, 1, 2, 1]
    mesh.stop().get(timeout=60)


def test_sync_endpoints_of_a_group_answer_every_rank(procs):
    mesh = procs.per_proc(workers=4).spawn("pp_sync", SyncWorker)
    for i in range(3):
        assert list(mesh.ping.call(i).get(timeout=60).values()) == [i] * 8
    mesh.stop().get(timeout=60)


def test_one_failing_rank_inside_a_proc_is_named_and_the_others_answer(procs):
    mesh = procs.per_proc(workers=3).spawn("pp_fail", Worker, "t", [])
    with pytest.raises(ActorError) as caught:
        mesh.fail_on.call(4).get(timeout=60)
    assert "rank 4 fails on purpose" in str(caught.value)
    assert caught.value.rank == 4
    # streamed, every rank's outcome arrives, the failure where it happened
    outcomes = {}
    for fut in mesh.fail_on.stream(4):
        try:
            r = fut.get(timeout=60)
            outcomes[r] = "ok"
        except ActorError as e:
            outcomes[e.rank] = "failed"
    assert outcomes == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 4: "failed", 5: "ok"}
    assert list(mesh.ping.call(7).get(timeout=60).values()) == [7] * 6  # the actor lives on
    mesh.stop().get(timeout=60)


def test_a_slice_along_the_per_proc_dimension_reaches_only_its_actors(procs):
    mesh = procs.per_proc(workers=3).spawn("pp_slice", Worker, "t", [])
    one_each = mesh.slice(workers=1)
    got = list(one_each.where.call().get(timeout=60).values())
    assert [g[0] for g in got] == [1, 4]  # the actors' ranks in the whole mesh
    assert [g[2] for g in got] == [{"gpus": 0}, {"gpus": 1}]  # their places in the slice
    assert mesh.slice(gpus=1, workers=2).ping.call_one(5).get(timeout=60) == 5
    # the whole mesh again, then the slice: each message's own place (an actor keeps
    # its context for whole-mesh messages and sets it only when it changes)
    whole = [{"gpus": i, "workers": j} for i in range(2) for j in range(3)]
    for _ in range(2):
        assert [g[2] for g in mesh.where.call().get(timeout=60).values()] == whole
        got = list(one_each.where.call().get(timeout=60).values())
        assert [g[2] for g in got] == [{"gpus": 0}, {"gpus": 1}]
    mesh.stop().get(timeout=60)


def test_bad_dimensions_are_refused_with_a_clear_error(procs):
    with pytest.raises(TypeError, match="at least one dimension"):
        procs.per_proc()
    with pytest.raises(ValueError, match="already a dimension"):
        procs.per_proc(gpus=2)
    with pytest.raises(ValueError, match="whole number >= 1"):
        procs.per_proc(workers=0)


def test_a_failing_init_names_its_rank(procs, root_faults):
    mesh = procs.per_proc(workers=3).spawn("pp_init", FailsOnRank, 4)
    with pytest.raises(SpawnError, match="rank 4"):
        mesh.ping.call().get(timeout=60)
    root_faults.wait(1)


def test_a_proc_that_dies_fails_all_its_ranks_and_only_those(root_faults):
    from monarch.actor import this_host

    own = this_host().spawn_procs(per_host={"gpus": 2}, name="pp_dying")
    try:
        mesh = own.per_proc(workers=3).spawn("pp_die", Worker, "t", [])
        assert list(mesh.ping.call(1).get(timeout=60).values()) == [1] * 6
        mesh.slice(gpus=1, workers=0).die.broadcast()
        failures = root_faults.wait(1, timeout=60)
        ranks = {r for f in failures if f.mesh_name == "pp_die" for r in f.ranks}
        assert ranks == {3, 4, 5}, failures
        assert wait_until(lambda: _raises(mesh.slice(gpus=1).ping.call(2)), timeout=30)
        assert list(mesh.slice(gpus=0).ping.call(3).get(timeout=60).values()) == [3] * 3
    finally:
        own.stop().get(timeout=60)


def _raises(fut) -> bool:
    try:
        fut.get(timeout=30)
    except SupervisionError:
        return True
    return False


LEFT_RUNNING = textwrap.dedent("""
    from monarch.actor import Actor, endpoint, this_proc

    class Tidy(Actor):
        @endpoint
        async def ping(self) -> int:
            return 1

        async def __cleanup__(self, exc) -> None:
            print("cleanup", flush=True)

    mesh = this_proc().per_proc(workers=3).spawn("left", Tidy)
    print(sum(mesh.ping.call().get(timeout=60).values()), flush=True)
""")


def test_a_local_per_proc_mesh_left_running_stops_cleanly_at_exit(tmp_path):
    # The script ends without stopping its mesh: at exit each actor still runs its
    # __cleanup__, and asyncio reports no task destroyed while pending (it did, once per
    # actor: the stop's mailbox marker went through the default executor, which takes
    # no more work once the interpreter is exiting).
    script = tmp_path / "left_running.py"
    script.write_text(LEFT_RUNNING)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MONARCH_OPEN_BROKER_OK="1")
    env.pop("MONARCH_NATS_URL", None)  # its own embedded broker, as a user's script
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "cleanup", "cleanup", "cleanup"], done.stdout
    assert "Task was destroyed" not in done.stderr, done.stderr
