"""One subscription per proc for what a ``per_proc`` mesh's whole local group hears.

An actor listens on the 2^d subjects of its coordinates (each dimension its own
coordinate or ``_``, :func:`~monarch.broker.vocabulary.subjects.point_subscriptions`).
The ``k`` actors that ``ProcMesh.per_proc`` puts in one proc differ only in the
trailing dimensions, so the subjects whose trailing tokens are all ``_`` (a call to
the whole mesh, or to a slice that spans the group) are the same for all ``k``.
Subscribed by each actor, the broker would send each such message ``k`` times to
this proc, and the proc would parse and check it ``k`` times: at 512 actors a
proc, a broadcast was 512 copies per proc (benchmarks/NOTES.md 55). Here such a
subject is subscribed once per proc and each message is handed to the group's
actors in rank order, the same ``Msg`` to each (they only read it). The first of
them to read its arguments decodes them; when nothing in them can change (numbers,
strings, bytes, None, tuples of those: :func:`unchangeable`), the others take the
same objects instead of decoding their own (:class:`SharedReading`, ~3 us an actor,
benchmarks/NOTES.md 62); anything else each actor decodes from the bytes itself,
so no actor ever sees an object another one can change.

What an actor hears is unchanged: the same messages, in the same wire order, each
once, with its own lost-message check (:meth:`Delivery.deliver` runs per actor).

Only groups of actors whose endpoints are all ``async`` (they run on the proc's
loop) share subscriptions. An actor with sync endpoints has a thread of its own,
and handing a burst of messages to 1,024 such threads at once made them all
runnable together: the GIL convoy kept the proc's loop and heartbeat thread from
running for 3-5 s (a lost heartbeat, the proc taken for dead; benchmarks/NOTES.md
59). Their own copies from the broker arrive spaced by the loop's parsing, which
kept that in check, so they keep them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from monarch.actors.hosting.group_call import handle_group_call
from monarch.actors.hosting.reduce import IMMUTABLE
from monarch.actors.messaging import messages as m
from monarch.actors.process_state import actor_process
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import decode_body, is_reference

if TYPE_CHECKING:  # annotations only
    from monarch.actors.hosting.instance import ActorInstance

log = logging.getLogger(__name__)

WILDCARD = "_"


def shared_by_group(subject: str, group_dims: int) -> bool:
    """Whether every actor of a proc's group listens on ``subject``: its last
    ``group_dims`` tokens (the per-proc dimensions) are all ``_``."""
    return group_dims > 0 and all(t == WILDCARD for t in subject.rsplit(".", group_dims)[1:])


def unchangeable(args: tuple | list, kwargs: dict) -> bool:
    """Whether no argument can be changed by whoever holds it (so several actors may)."""
    return all(map(_unchangeable, args)) and all(map(_unchangeable, kwargs.values()))


def _unchangeable(value: Any) -> bool:
    kind = type(value)
    return kind in IMMUTABLE or (kind is tuple and all(map(_unchangeable, value)))


class SharedReading:
    """What a shared message tells each of the group's actors, worked out once (set on
    the message as ``_mon_share`` by :meth:`_Shared.deliver`): its decoded arguments,
    when :func:`unchangeable`, and whether the group's replies to it merge here."""

    __slots__ = ("args", "merged")

    def __init__(self, msg: Msg) -> None:
        # None: not decoded yet; (args, kwargs, view): decoded and unchangeable;
        # False: each actor decodes its own.
        self.args: tuple | bool | None = None
        headers = msg.headers
        # A reducing call (monarch.actors.hosting.reduce); the subject is the whole group's.
        self.merged = bool(msg.reply and headers and m.REDUCE in headers)

    def whole_mesh_arguments(self, msg: Msg) -> tuple[tuple | list, dict] | None:
        """``(args, kwargs)`` of a call to the whole mesh whose arguments every actor
        may share (decoded now if no actor has yet); None otherwise (sent to a slice,
        changeable arguments, bytes fetched out of band, or unreadable: each actor
        then reads its own, as :meth:`Dispatch._prepare` does)."""
        if self.args is None and not is_reference(msg.data):
            try:
                args, kwargs, view_spec = decode_body(msg.data)
            except Exception:  # each actor's own reading reports it
                return None
            if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
                return None
            self.args = (args, kwargs, view_spec) if unchangeable(args, kwargs) else False
        shared = self.args
        if not shared or shared[2] is not None:
            return None
        return shared[0], shared[1]


class _Shared:
    """One subject's subscription and the actors it delivers to, in rank order."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.members: tuple[ActorInstance, ...] = ()
        self.ranks: list[int] = []  # the members' ranks, in the same order
        self.sub: asyncio.Future = asyncio.get_running_loop().create_future()

    def set_members(self, members: tuple[ActorInstance, ...]) -> None:
        self.members = members
        self.ranks = [inst.rank for inst in members]

    def deliver(self, msg: Msg) -> None:
        reading = SharedReading(msg)
        try:
            msg._mon_share = reading  # type: ignore[attr-defined]
        except AttributeError:  # a message type with no room for it: each actor reads its own
            reading = None
        if reading is not None and msg.reply:  # for each member, in one call
            ledger = actor_process(self.rt).replies
            if ledger is not None:
                ledger.received(msg.reply, self.ranks)
            if handle_group_call(self.rt, self.members, msg, reading):
                return
        for inst in self.members:  # a tuple: a member leaving meanwhile changes nothing here
            try:
                inst.deliver(msg)
            except Exception:  # one actor's intake must not keep the message from the rest
                log.exception("actor %s: delivery of %s failed", inst.actor_id, msg.subject)


class Membership:
    """An actor's place on a shared subscription; :meth:`unsubscribe` leaves it (the
    subscription itself ends with its last member). Kept in the actor's
    ``subscriptions`` beside its own ones, which have the same method."""

    def __init__(self, fanout: GroupFanout, subject: str, inst: ActorInstance) -> None:
        self._fanout, self._subject, self._inst = fanout, subject, inst

    async def unsubscribe(self) -> None:
        await self._fanout.leave(self._subject, self._inst)


class GroupFanout:
    """The shared subscriptions of a proc (one per subject, see the module's doc)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._shared: dict[str, _Shared] = {}

    def subjects(self) -> list[str]:
        """The subjects subscribed once for a whole group (for tests and ``ps``)."""
        return list(self._shared)

    async def join(self, subject: str, inst: ActorInstance) -> Membership:
        """Deliver ``subject``'s messages to ``inst`` too, subscribing it if it is new."""
        shared = self._shared.get(subject)
        if shared is None:
            shared = self._shared[subject] = _Shared(self.rt)
            try:
                shared.sub.set_result(await self.rt.subscribe_mesh(subject, shared.deliver))
            except BaseException as e:
                del self._shared[subject]
                if isinstance(e, Exception):
                    shared.sub.set_exception(e)
                    shared.sub.exception()  # retrieved: whoever waits on it raises it
                else:
                    shared.sub.cancel()
                raise
        else:
            await asyncio.shield(shared.sub)  # another member's subscribe still on the way
        shared.set_members(tuple(sorted((*shared.members, inst), key=lambda i: i.rank)))
        return Membership(self, subject, inst)

    async def leave(self, subject: str, inst: ActorInstance) -> None:
        shared = self._shared.get(subject)
        if shared is None:
            return
        shared.set_members(tuple(i for i in shared.members if i is not inst))
        if shared.members:
            return
        del self._shared[subject]
        try:
            sub: Any = shared.sub.result() if shared.sub.done() else None
            if sub is not None:
                await sub.unsubscribe()
        except Exception:  # the connection is closing: nothing more will arrive anyway
            pass
