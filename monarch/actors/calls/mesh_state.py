"""``MeshState``: what every view of one actor mesh shares, and how a message leaves for it.

Apart from :class:`~monarch.actors.calls.actor_mesh.ActorMesh` (the user's
reference: endpoints, encoding, flow control, pickling) because this is the other
side of the hand-over: the state lives on the runtime loop, one per actor mesh
in this process, shared by every slice of it, and it owns the mesh's life
(queued until spawned, failed, stopped, ranks dead) and the publishing of a
call to the subjects of a view, from the loop or, on the common path, from the
caller's thread itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Any

from monarch.actors.calls.endpoint import EndpointProperty, endpoints_of
from monarch.actors.calls.gather import Gather
from monarch.actors.errors import MeshStoppedError, MessageLostError, SpawnError, describe_actor
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FlowControl, flow_settings
from monarch.actors.messaging.rpc import request_all
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import LocalMsg, Runtime

_log = logging.getLogger("monarch.actors.calls.actor_mesh")  # its log, as before the split


class MeshState:
    """What every view of one actor mesh shares. Mutated on the runtime loop only."""

    def __init__(
        self, rt: Runtime, name: str, uid: str, cls: type | None, class_name: str, base: Extent
    ) -> None:
        self.rt = rt
        self.name = name
        self.uid = uid
        self.cls = cls
        self.class_name = class_name
        self.base = base
        self.endpoints: dict[str, EndpointProperty] = endpoints_of(cls) if cls is not None else {}
        self.ready = False
        self.error: BaseException | None = None
        self.stopped: str | None = None  # why, once stopped
        self.dead: dict[int, BaseException] = {}  # base rank -> why
        self._queued: list[tuple] = []
        self.inflight: set[Gather] = set()
        self.proc_uids: list[str] = []  # per rank, where known (owner side)
        self.local: Any = None  # the ActorInstance when the whole mesh is in this process
        self.settled = threading.Event()  # spawned (or failed): references may leave now
        self._settle_waiters: list[asyncio.Future[None]] = []  # wait_settled(), on the loop
        self.flow = FlowControl(name, loop=rt.loop, **flow_settings(rt.settings))
        self.owner_proc = rt.proc_uid  # where the owner lives, and who it is
        self.owner_actor = "client"
        # Spawned by the library for its own work (sync_workspace's receivers): a failure
        # of it is logged, not the user's (their fault hook never hears of it).
        self.internal = False
        # (rank, count, subject) for messages from here that its actors never got
        # (monarch.actors.messaging.lost_sends): appended on the loop, taken by the next sender.
        self.lost: collections.deque[tuple[int, int, str]] = collections.deque()
        actor_process(rt).mesh_states[uid] = self

    def actor_id(self, rank: int) -> str:
        return f"{self.name}.{self.uid}[{rank}]"

    def note_lost(self, rank: int, count: int, subject: str) -> None:
        """An actor of this mesh reports messages from this process that never reached it."""
        _log.warning(
            "%d message(s) from this process to rank %d of actor mesh %r were lost on the way "
            "(on %s; a broker node died?): they were not run. The next call or send on this "
            "mesh raises MessageLostError.",
            count,
            rank,
            self.name,
            subject,
        )
        self.lost.append((rank, count, subject))

    def raise_if_lost(self) -> None:
        """Raise :class:`MessageLostError` for losses reported since the last call or send."""
        if not self.lost:
            return
        counts: dict[int, int] = {}
        while self.lost:
            rank, count, _ = self.lost.popleft()
            counts[rank] = counts.get(rank, 0) + count
        total = sum(counts.values())
        raise MessageLostError(
            f"{total} message(s) this process sent to actor mesh {self.name!r} were lost on the "
            f"way and never run (lost per rank: {dict(sorted(counts.items()))}); a broker node "
            "died? The mesh goes on; this call or send was not made.",
            mesh=self.name,
            counts=counts,
        )

    # -- lifecycle (loop) ---------------------------------------------------

    def mark_ready(self) -> None:
        while self._queued:
            queued, self._queued = self._queued, []
            for args in queued:
                self._publish(*args)
        # Only now: a caller's thread that sees it may write its call itself
        # (send_from_thread), which must not overtake the queued ones.
        self.ready = True
        self._settle()

    def mark_failed(self, exc: BaseException) -> None:
        self.error = exc
        self._settle()
        queued, self._queued = self._queued, []
        for _tokens, _body, _headers, gather, _reply in queued:
            if gather is not None:
                gather.fail(exc)

    def _settle(self) -> None:
        self.settled.set()
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_settled(self) -> None:
        """Return once the mesh was spawned or failed to be (loop only)."""
        if not self.settled.is_set():
            waiter = self.rt.loop.create_future()
            self._settle_waiters.append(waiter)
            await waiter

    def stopped_error(self, endpoint: str | None = None) -> MeshStoppedError:
        """What a call to this stopped mesh raises, in Monarch's words (a supervision
        event with the status ``stopped: <why>``), naming the call when known."""
        actor = describe_actor(self.cls, self.class_name, self.name, Point(0, self.base))
        text = f"Supervision event: actor {actor} has status:\n  stopped: {self.stopped}"
        if endpoint:
            text = f"Endpoint call {self.name}.{endpoint}() failed, {text}"
        return MeshStoppedError(text)

    def mark_stopped(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
        exc = self.stopped_error()
        self.mark_failed(exc)
        for gather in list(self.inflight):
            gather.fail(exc)

    def mark_dead(self, ranks: list[int], exc: BaseException) -> None:
        for r in ranks:
            self.dead[r] = exc
        for gather in list(self.inflight):
            if gather.waiting_on(ranks):
                gather.fail(exc)

    # -- sending (caller's thread) --------------------------------------------

    def send_from_thread(
        self, tokens: list[list[str]], body: bytes, headers: dict, gather: Gather
    ) -> bool:
        """A gathered call to one subject, written by the caller's thread itself; False:
        nothing sent, hand it to the loop (:meth:`send`).

        Only on the common path (a mesh that is up, not in this process, no rank
        of the call known dead, no earlier call to it still unanswered: a
        pipelining caller's burst is cheaper as the loop's one or two writes
        than as a write per call), and only while the runtime has nothing queued
        before it (:meth:`Runtime.publish_from_thread`): what the loop would do
        for it here is open the reply port and stamp the count of sends so far,
        and both are safe from this thread. Saves the loop's wake-up before the
        write (benchmarks/NOTES.md 42).
        """
        if (
            not self.ready
            or self.inflight  # pipelined calls: the loop writes a burst in two writes, not one each
            or self.rt.on_loop_thread()
            or self.local is not None
            or self.stopped is not None
            or self.error is not None
            or len(tokens) != 1
            or (self.dead and not self.dead.keys().isdisjoint(gather.expected))
        ):
            return False
        rt = self.rt
        gather.open()  # before the write: the reply may come back at once
        subject = subjects.actor(rt.namespace, self.name, self.uid, tokens[0])
        actor_process(rt).sends.stamp_count(subject, headers)
        gather.resend = (subject, body, headers)
        return rt.publish_from_thread(subject, body, headers, gather.subject)

    # -- sending (loop) -------------------------------------------------------

    def send(
        self,
        tokens: list[list[str]],
        body: bytes,
        headers: dict,
        gather: Gather | None,
        reply: str = "",
    ) -> None:
        if gather is not None:
            gather.open()
            for r in gather.expected:
                if r in self.dead:
                    gather.fail(self.dead[r])
                    return
        if self.stopped is not None:
            if gather is not None:
                gather.fail(self.stopped_error())
            return
        if self.error is not None:
            if gather is not None:
                gather.fail(self.error)
            return
        if not self.ready:
            self._queued.append((tokens, body, headers, gather, reply))
            return
        self._publish(tokens, body, headers, gather, reply)

    def _publish(
        self,
        tokens: list[list[str]],
        body: bytes,
        headers: dict,
        gather: Gather | None,
        reply: str = "",
    ) -> None:
        ns, rt = self.rt.namespace, self.rt
        if gather is not None:
            reply = gather.subject
        if self.local is not None:
            # Every actor of this mesh lives in this process: skip the broker. All
            # senders in this process take this path, so their order still holds.
            subject = subjects.actor(ns, self.name, self.uid, tokens[0])
            self.local.deliver(LocalMsg(subject, body, reply, headers))
            return
        on_error = gather.fail if gather is not None else None
        batchable = not reply  # a send: it may share one NATS message with its neighbours
        # Numbered per subject, in wire order (monarch.actors.messaging.lost_sends); a gathered
        # call is not counted, its loss is found by its caller (lost_replies).
        sends = actor_process(rt).sends
        stamp = sends.stamp if gather is None else sends.stamp_count
        for toks in tokens:
            subject = subjects.actor(ns, self.name, self.uid, toks)
            numbered = headers if len(tokens) == 1 else dict(headers)
            stamp(subject, numbered)
            if gather is not None and len(tokens) == 1:
                gather.resend = (subject, body, numbered)
            rt.publish(subject, body, numbered, reply, on_error, batchable)

    async def stop(self) -> None:
        await self.stop_actors()

    async def stop_actors(self, reason: str = "stopped by its owner") -> None:
        """Ask each proc hosting this mesh to stop its actor (owner side)."""
        if self.stopped is not None:
            return
        self.mark_stopped(reason)
        if not self.proc_uids:
            return

        # one request per proc (a per_proc mesh has several ranks in one); ranks already
        # dead have nobody to answer
        live = dict.fromkeys(
            uid for rank, uid in enumerate(self.proc_uids) if rank not in self.dead
        )
        requests = [
            (subjects.ctl_proc(self.rt.namespace, uid), dumps(self.uid), {m.KIND: "stop_mesh"})
            for uid in live
        ]
        await request_all(self.rt, requests, self.rt.settings.stop_timeout + 5, absent_ok=True)


def spawn_error(name: str, rank: int, err: BaseException) -> SpawnError:
    e = SpawnError(f"spawning actor mesh {name!r} failed on rank {rank}: {err}")
    e.__cause__ = err
    return e
