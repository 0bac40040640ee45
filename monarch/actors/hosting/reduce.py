"""Replies merged on their proc: a reducing call to a ``per_proc`` mesh.

``Accumulator(mesh.endpoint, identity, combine, reducer=add)`` sends its call
with a ``Mon-Reduce`` header that carries the reducer. Where the call reaches a
proc's whole group of a ``per_proc`` mesh (``k`` actors of the mesh in one
proc), the group's successful replies are merged here with the reducer before
they leave, and travel as one reply whose ``Mon-Ranks`` header names every rank
it answers for. The caller folds that one value into its accumulator as it
would fold each of them: the reducer must be associative and commutative (the
replies of one proc merge in the order they finish), and ``combine(a,
reducer(x, y))`` must equal ``combine(combine(a, x), y)``, as for the
accumulators of Monarch's Rust core (``Accumulator::reducer``).

What stays as it was:

* an error reply is never merged: it leaves alone, naming its rank (so a failed
  rank inside a group fails the call with that rank, as without a reducer);
* a reply is never held for a slow sibling: a merge leaves at the end of the
  first loop turn that brought no more replies to it (or at once when all ``k``
  have answered), so a proc sends one merged reply per call when its actors
  answer together, a few when they do not;
* lost replies: each rank's reply is kept by the process's
  :class:`~monarch.actors.messaging.lost_replies.ReplyLedger` as before (the
  merged message under every rank it covers; sent again, the caller takes it
  once or drops it as a duplicate).

If the reducer raises, or cannot be decoded, the ranks it would have merged
answer with that error instead, and the caller's accumulate raises it.

Any other call to a proc's whole group has its successful replies *gathered*
the same way (:meth:`GroupReducer.gather`): when each is one plain msgpack
body (no tensors, nothing out of band), they leave as one reply whose body is
the list of their values in rank order, under ``Mon-Ranks`` as above, and the
caller decodes the list in one go and takes each value as that rank's reply
(at 8,192 actors over 16 procs, ~7 us a reply less at the caller, NOTES 62).
Other replies leave one by one in the runtime's batch, as before.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from monarch.actors.messaging import messages as m
from monarch.actors.messaging.reduction import decode_reducer, encode_ranks, gathered_body
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps, loads
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import offload, stays_inline

if TYPE_CHECKING:  # annotations only
    from monarch.actors.hosting.instance import ActorInstance

log = logging.getLogger(__name__)

_by_rank = operator.attrgetter("rank")
_first = operator.itemgetter(0)

IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None)})
"""Reply types a merge may take as they are (nothing the actor keeps can change through them)."""


class Unencoded:
    """A reply to be merged on its proc, not encoded: a value of a type in :data:`IMMUTABLE`
    (encoding it only for the merge to decode it costs ~8 us a reply; NOTES 61)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def group_size(inst: ActorInstance) -> int:
    """How many actors of ``inst``'s mesh live in its proc (its trailing ``group_dims``)."""
    return math.prod(inst.extent.sizes[len(inst.extent.sizes) - inst.group_dims :])


class _Merge:
    """The replies to one call merged (or gathered: no reducer) so far in this proc."""

    __slots__ = ("reducer", "value", "bodies", "actors", "expected", "fresh", "error")

    def __init__(self, reducer: Callable[[Any, Any], Any] | None, expected: int) -> None:
        self.reducer = reducer
        self.value: Any = None
        self.bodies: list[tuple[int, bytes]] = []  # gathered: (rank, its actor's body)
        self.actors: list[ActorInstance] = []
        self.expected = expected
        self.fresh = True  # a reply came since the last end-of-turn check
        self.error: BaseException | None = None


class GroupReducer:
    """The merges in progress in one proc, by reply subject (loop only)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._merges: dict[str, _Merge] = {}

    def add(self, inst: ActorInstance, msg: Msg, body: bytes | Unencoded) -> None:
        """``inst``'s successful reply ``body`` to ``msg`` (a reducing call to its whole group)."""
        subject = msg.reply
        merge = self._merges.get(subject)
        try:
            value = body.value if type(body) is Unencoded else loads(body)  # type: ignore[union-attr, arg-type]
            if merge is None:
                reducer = decode_reducer((msg.headers or {})[m.REDUCE])
                merge = self._merges[subject] = _Merge(reducer, group_size(inst))
                merge.value = value
                self.rt.loop.call_soon(self._end_of_turn, subject)
            elif merge.error is None:
                merge.value = merge.reducer(merge.value, value)
        except Exception as e:
            if merge is None:  # the reducer itself is unreadable: this reply says so
                inst._publish_reply(subject, "error", m.encode_error(e), batchable=True)
                return
            merge.error = merge.error or e
        merge.actors.append(inst)
        merge.fresh = True
        if len(merge.actors) >= merge.expected:
            self._send(subject)

    def gather(self, inst: ActorInstance, msg: Msg, body: bytes) -> None:
        """``inst``'s successful reply ``body`` (plain msgpack) to ``msg``, a call to its
        whole group without a reducer: it leaves with its siblings' as one list."""
        self.gather_all(msg, [inst], [body])

    def gather_all(self, msg: Msg, insts: list[ActorInstance], bodies: list[bytes]) -> None:
        """:meth:`gather` for several actors of the group at once (``bodies[i]`` is
        ``insts[i]``'s reply; :mod:`monarch.actors.hosting.group_call`)."""
        if not insts:
            return
        subject = msg.reply
        merge = self._merges.get(subject)
        if merge is None:
            merge = self._merges[subject] = _Merge(None, group_size(insts[0]))
            self.rt.loop.call_soon(self._end_of_turn, subject)
        merge.bodies.extend(zip([inst.rank for inst in insts], bodies))
        merge.actors.extend(insts)
        merge.fresh = True
        if len(merge.actors) >= merge.expected:
            self._send(subject)

    def _end_of_turn(self, subject: str) -> None:
        merge = self._merges.get(subject)
        if merge is None:
            return  # complete, and sent
        if merge.fresh:  # siblings still answering: wait one more turn
            merge.fresh = False
            self.rt.loop.call_soon(self._end_of_turn, subject)
            return
        self._send(subject)

    def _send(self, subject: str) -> None:
        merge = self._merges.pop(subject)
        if merge.reducer is None:
            self._send_gathered(subject, merge)
            return
        actors = sorted(merge.actors, key=_by_rank)
        if merge.error is None:
            try:
                body = offload(dumps(merge.value), readers=1, ttl=None)
                if len(body) > self.rt.max_payload:
                    raise ValueError(
                        f"the merged reply of {len(actors)} ranks is {len(body)} bytes, over "
                        f"the broker's max_payload of {self.rt.max_payload}"
                    )
            except Exception as e:
                merge.error = e
        if merge.error is not None:
            err = m.encode_error(merge.error)
            for inst in actors:
                inst._publish_reply(subject, "error", err, batchable=True)
            return
        first = actors[0]
        headers = first._reply_headers("reply", False, None)
        headers[m.RANKS] = encode_ranks(a.rank for a in actors)
        replies = actor_process(self.rt).replies
        if replies is not None:  # kept under each rank, should it be lost
            replies.sent(subject, [a.rank for a in actors], body, headers)
        self.rt.publish(subject, body, headers, batchable=True)

    def _send_gathered(self, subject: str, merge: _Merge) -> None:
        if len(merge.actors) == 1:  # alone in its turn: the plain reply, as without gathering
            merge.actors[0]._publish_reply(subject, "reply", merge.bodies[0][1], batchable=True)
            return
        pairs = sorted(merge.bodies, key=_first)
        body = gathered_body([b for _, b in pairs])
        if not stays_inline(len(body)) or len(body) > self.rt.max_payload:
            by_rank = {a.rank: a for a in merge.actors}
            for rank, part in pairs:  # too big together: each on its own, as without gathering
                by_rank[rank]._publish_reply(subject, "reply", part, batchable=True)
            return
        ranks = [r for r, _ in pairs]
        headers = min(merge.actors, key=_by_rank)._reply_headers("reply", False, None)
        headers[m.RANKS] = encode_ranks(ranks)
        replies = actor_process(self.rt).replies
        if replies is not None:  # kept under each rank, should it be lost
            replies.sent(subject, ranks, body, headers)
        self.rt.publish(subject, body, headers, batchable=True)


def group_reducer(rt: Runtime) -> GroupReducer:
    """This process's :class:`GroupReducer` (made on first use)."""
    state = actor_process(rt)
    if state.group_reducer is None:
        state.group_reducer = GroupReducer(rt)
    return state.group_reducer
