"""Replies merged on their proc: ``Accumulator(..., reducer=...)`` on a ``per_proc`` mesh.

Real procs and a real nats-server: the merged value equals the plain fold, each
proc's group answers a call with one merged reply (watched on the wire with a raw
NATS subscriber, its ``Mon-Ranks`` naming the ranks), sync actors too, a failing
rank is named and not merged away, a reducer that raises on the proc fails the
call with its error, and a mesh of one actor per proc folds as before.
"""

from __future__ import annotations

import operator
import os

import pytest

from monarch.actor import Accumulator, Actor, ActorError, current_rank, endpoint
from monarch.actors.messaging.reduction import decode_ranks
from monarch.broker.vocabulary import headers as hdr
from monarch.core.process_runtime import runtime
from tests.helpers import captured_traffic, proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 2}, name="ppr_procs")


class Scaled(Actor):
    @endpoint
    async def times(self, x: int) -> int:
        return current_rank().rank * x

    @endpoint
    async def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ValueError(f"rank {rank} fails on purpose")
        return 1


class Keeps(Actor):
    """Returns a list it keeps (and a number): a merge must not change what it keeps."""

    def __init__(self) -> None:
        self.items = [current_rank().rank]

    @endpoint
    async def items_list(self) -> list[int]:
        return self.items

    @endpoint
    async def count(self) -> int:
        return len(self.items)


class SyncScaled(Actor):
    @endpoint
    def times(self, x: int) -> int:
        return current_rank().rank * x


def refuses(a: int, b: int) -> int:
    raise ArithmeticError("this reducer refuses to merge")


def merged_replies(seen: list) -> list[list[int]]:
    """The ranks of each reply on the wire that carries ``Mon-Ranks``."""
    return [decode_ranks(h[hdr.RANKS]) for _, h, _ in seen if hdr.RANKS in h]


def test_a_reducing_accumulate_folds_to_the_plain_value_with_one_reply_per_proc(procs):
    mesh = procs.per_proc(workers=4).spawn("ppr_async", Scaled)  # 2 procs x 4 actors
    want = sum(range(8)) * 3
    assert Accumulator(mesh.times, 0, operator.add).accumulate(3).get(timeout=60) == want
    summed = Accumulator(mesh.times, 0, operator.add, reducer=operator.add)
    ns = runtime().namespace
    with captured_traffic(os.environ["MONARCH_NATS_URL"], f"mon.{ns}.port.>") as seen:
        for _ in range(3):
            assert summed.accumulate(3).get(timeout=60) == want
    merged = merged_replies(seen)
    # async endpoints that do not await answer in one turn of their proc's loop: each
    # proc's four replies leave as one message, whose Mon-Ranks names its ranks
    assert sorted(map(tuple, merged)) == [(0, 1, 2, 3)] * 3 + [(4, 5, 6, 7)] * 3, merged
    # on a slice that spans a group too (current_rank() is the rank within the slice)
    half = mesh.slice(gpus=1)
    plain = Accumulator(half.times, 0, operator.add).accumulate(1).get(timeout=60)
    sliced = Accumulator(half.times, 0, operator.add, reducer=operator.add)
    assert sliced.accumulate(1).get(timeout=60) == plain == 0 + 1 + 2 + 3
    mesh.stop().get(timeout=60)


def test_sync_actors_merge_what_finishes_together_and_lose_no_rank(procs):
    mesh = procs.per_proc(workers=4).spawn("ppr_sync", SyncScaled)
    mesh.times.call(0).get(timeout=60)
    summed = Accumulator(mesh.times, 0, operator.add, reducer=operator.add)
    ns = runtime().namespace
    with captured_traffic(os.environ["MONARCH_NATS_URL"], f"mon.{ns}.port.>") as seen:
        for x in range(1, 6):
            assert summed.accumulate(x).get(timeout=60) == sum(range(8)) * x
    covered = [r for ranks in merged_replies(seen) for r in ranks]
    plain = [h for _, h, _ in seen if h.get(hdr.KIND) == "reply" and hdr.RANKS not in h]
    # each thread answers when it is done: a proc merges what finished by the end of a
    # loop turn; every rank is answered exactly once per call, merged or alone
    assert len(covered) + len(plain) == 5 * 8
    assert sorted(set(covered)) == sorted(set(covered) & set(range(8)))
    assert covered, "no reply was merged"
    mesh.stop().get(timeout=60)


def test_a_failing_rank_is_named_and_not_merged_away(procs):
    mesh = procs.per_proc(workers=3).spawn("ppr_fail", Scaled)
    counted = Accumulator(mesh.fail_on, 0, operator.add, reducer=operator.add)
    with pytest.raises(ActorError) as failed:
        counted.accumulate(4).get(timeout=60)
    assert failed.value.rank == 4
    assert "rank 4 fails on purpose" in str(failed.value)
    assert counted.accumulate(99).get(timeout=60) == 6  # nobody failed: all six answer
    mesh.stop().get(timeout=60)


def test_a_reducer_that_raises_on_the_proc_fails_the_call_with_its_error(procs):
    mesh = procs.per_proc(workers=2).spawn("ppr_refuse", Scaled)
    with pytest.raises(ActorError) as failed:
        Accumulator(mesh.times, 0, operator.add, reducer=refuses).accumulate(1).get(timeout=60)
    assert isinstance(failed.value.exception, ArithmeticError)
    assert "this reducer refuses to merge" in str(failed.value)
    # the actors live on
    assert Accumulator(mesh.times, 0, operator.add).accumulate(1).get(timeout=60) == 6
    mesh.stop().get(timeout=60)


def test_one_actor_per_proc_folds_each_reply_as_before(procs):
    mesh = procs.spawn("ppr_single", Scaled)
    ns = runtime().namespace
    with captured_traffic(os.environ["MONARCH_NATS_URL"], f"mon.{ns}.port.>") as seen:
        summed = Accumulator(mesh.times, 10, operator.add, reducer=operator.add)
        assert summed.accumulate(5).get(timeout=60) == 10 + 5
    assert merged_replies(seen) == []  # nothing to merge: one actor of the mesh per proc
    mesh.stop().get(timeout=60)


def test_a_reducer_that_is_not_callable_is_refused_where_it_is_given(procs):
    mesh = procs.spawn("ppr_bad", Scaled)
    with pytest.raises(TypeError, match="reducer must be callable"):
        Accumulator(mesh.times, 0, operator.add, reducer=3)  # type: ignore[arg-type]
    mesh.stop().get(timeout=60)


def test_a_reducer_that_works_in_place_never_changes_what_an_actor_keeps(procs):
    # operator.iadd extends its left list in place: on the proc, the left list is the
    # first reply. Replies are merged as copies (only immutable values skip encoding),
    # so each actor's own list keeps its one item.
    mesh = procs.per_proc(workers=3).spawn("ppr_keeps", Keeps)
    merged = Accumulator(mesh.items_list, [], operator.add, reducer=operator.iadd)
    assert sorted(merged.accumulate().get(timeout=60)) == list(range(6))
    assert sorted(merged.accumulate().get(timeout=60)) == list(range(6))
    assert list(mesh.count.call().get(timeout=60).values()) == [1] * 6
    mesh.stop().get(timeout=60)
