"""Ports and channels: one-way mailboxes that can be handed to other actors.

``Channel.open()`` gives a :class:`Port` (a small picklable address: a subject
on the owner's ``mon.<ns>.port.<proc-uid>.*`` subscription) and the
:class:`PortReceiver` that reads what is sent to it. Anyone holding the port,
in any process, can ``send`` values or an ``exception``; the receiver's
``recv()`` returns a future of the next one, in arrival order. A port
opened with ``once=True`` closes after its first message.
"""

from __future__ import annotations

import collections
from typing import Any, Generic, TypeVar

from monarch.actors.calls.context import context, sender_id
from monarch.actors.errors import ActorError
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.port_flow import OVERHEAD, PortFlow, PortFlows
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.ext import register_ext
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.core.runtime import LocalMsg, Runtime
from monarch.rdma.bulk import encode_body, fetch_async, is_reference, offload

R = TypeVar("R")


class Port(Generic[R]):
    """Where to send values. Picklable; pass it to other actors freely."""

    __slots__ = ("subject", "rank", "message_rank")

    def __init__(
        self, subject: str, rank: int | None = None, message_rank: int | None = None
    ) -> None:
        self.subject = subject
        self.rank = rank  # the rank replies carry (set for a call's response port)
        # the sender's rank in the mesh or slice its message was sent to (a call's
        # response port): what a ranked PortReceiver reports, as in Monarch
        self.message_rank = message_rank

    def _sender_ranks(self) -> tuple[int, int]:
        """(rank in the whole mesh, rank in the mesh or slice the message was sent to)."""
        if self.rank is not None:
            return self.rank, self.rank if self.message_rank is None else self.message_rank
        ctx = context()
        return ctx.actor_instance.rank.rank, ctx.message_rank.rank

    def send(self, value: R) -> None:
        """Send ``value`` (encoded here, so a bad value fails at the sender)."""
        self._post("reply", encode_body(value, readers=1))  # a big value travels out of band

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's ``recv()`` raise ``exc``."""
        self._post("error", offload(m.encode_error(exc), readers=1))

    def _post(self, kind: str, body: bytes) -> None:
        if not self.subject:
            return  # the port of a message nobody waits for (a broadcast): drop

        rt = runtime()
        rank, at = self._sender_ranks()
        headers = {m.KIND: kind, m.RANK: str(rank), m.FROM: sender_id()}
        if at != rank:
            headers[m.MSG_RANK] = str(at)
        subject = self.subject
        state = actor_process(rt)
        flows = state.port_flows or _port_flows(rt, state)
        flow = flows.get(subject)
        if flow is None:  # a port of this proc: delivered in process
            rt.call_soon(_post_reply, rt, subject, rank, body, headers)
            return
        if flow.must_hold():
            if rt.on_loop_thread():  # the loop must not block: keep it here, in order
                flow.hold(len(body), lambda: _post_counted(rt, flow, subject, rank, body, headers))
                return
            flow.wait_for_room(can_block=True)
        rt.call_soon(_post_reply, rt, subject, rank, body, headers)
        if flow.count(len(body) + OVERHEAD):
            rt.call_soon(flow.send_marker)  # in order, right behind this message

    def __repr__(self) -> str:
        return f"Port({self.subject!r})"


def _port_flows(rt: Runtime, state: Any) -> PortFlows:
    state.port_flows = PortFlows(rt)  # a race makes two, one of which is kept: harmless
    return state.port_flows


def _post_counted(
    rt: Runtime, flow: PortFlow, subject: str, rank: int, body: bytes, headers: dict
) -> None:
    """On the loop: send a held message, then count it (and its marker when due)."""
    _post_reply(rt, subject, rank, body, headers)
    if flow.count(len(body) + OVERHEAD):
        flow.send_marker()


def _post_reply(rt: Runtime, subject: str, rank: int, body: bytes, headers: dict) -> None:
    """On the loop: publish, kept for a caller that may not get it (monarch.actors.messaging.lost_replies)."""
    replies = actor_process(rt).replies
    if replies is not None:
        replies.sent(subject, rank, body, headers)
    rt.publish(subject, body, headers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Port) and other.subject == self.subject

    def __hash__(self) -> int:
        return hash(self.subject)


class PortReceiver(Generic[R]):
    """Reads the values sent to one port, in arrival order."""

    def __init__(self, rt: Runtime, once: bool = False, ranked: bool = False) -> None:
        self._rt = rt
        self._once = once
        self._ranked = ranked
        # (ok, rank, value), or a message as it arrived, read when asked for
        self._arrived: collections.deque = collections.deque()
        self._waiting: collections.deque[Future] = collections.deque()
        self._closed = False
        self._raw: collections.deque = collections.deque()  # arrived, not yet taken
        self._fetching = False
        self._port_id, self.subject = rt.open_port(self._on_msg)

    def _on_msg(self, msg: Any) -> None:  # on the loop
        """Messages are taken in arrival order; a big one is fetched first (off the loop)
        and those behind it wait for it."""
        self._raw.append(msg)
        if not self._fetching:
            self._pump()

    def _pump(self) -> None:
        while self._raw:
            msg = self._raw[0]
            if (msg.headers or {}).get(m.KIND) != "error" and is_reference(msg.data):
                self._fetching = True
                self._rt.loop.create_task(self._fetch(msg))
                return
            self._raw.popleft()
            self._take(msg)

    async def _fetch(self, msg: Any) -> None:
        try:
            data = await fetch_async(msg.data)
            self._raw[0] = LocalMsg(msg.subject, data, msg.reply, msg.headers, owned=True)
        except Exception as e:
            self._raw.popleft()
            self._deliver((False, 0, e))
        self._fetching = False
        self._pump()

    def _take(self, msg: Any) -> None:
        if not self._closed:
            self._deliver(msg)  # read when asked for: a flood must not starve its reader

    def _read(self, msg: Any) -> tuple[bool, int, Any]:
        """``(ok, rank, value or exception)`` of an arrived message."""
        headers = msg.headers or {}
        try:
            # a ranked receiver reports the rank within the slice a message went to
            rank = int(headers.get(m.MSG_RANK) or headers.get(m.RANK, "0"))
        except ValueError:
            rank = 0
        try:
            ok, value = m.decode_reply(msg)
            if not ok:
                value = m.decode_error(
                    value, actor_id=headers.get(m.FROM, ""), rank=rank, endpoint=""
                )
                if isinstance(value, ActorError) and not isinstance(value.exception, ActorError):
                    value = value.exception  # Port.exception(e) makes recv() raise e itself
        except Exception as e:
            ok, value = False, e
        return ok, rank, value

    def _deliver(self, item: Any) -> None:
        """To a waiting ``recv()``, or kept: ``(ok, rank, value)``, or a message, read when
        taken (:meth:`_read`)."""
        if self._once:
            self.close()
        if self._waiting:
            self._complete(self._waiting.popleft(), item)
        else:
            self._arrived.append(item)

    def _complete(self, fut: Future, item: Any) -> None:
        ok, rank, value = item if type(item) is tuple else self._read(item)
        if ok:
            fut.set_result((rank, value) if self._ranked else value)
        else:
            fut.set_exception(value)

    def recv(self) -> Future[R]:
        """A future of the next value (or exception) sent to the port."""
        fut: Future = Future()

        def take() -> None:
            if self._arrived:
                self._complete(fut, self._arrived.popleft())
            else:
                self._waiting.append(fut)

        self._rt.call_soon(take)
        return fut

    def close(self) -> None:
        self._closed = True
        self._rt.call_soon(self._rt.close_port, self._port_id)

    def ranked(self) -> PortReceiver:
        self._ranked = True
        return self


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        receiver: PortReceiver[R] = PortReceiver(runtime(), once=once)
        return Port(receiver.subject), receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        """Like :meth:`open`, but ``recv()`` gives ``(rank, value)`` with the sender's rank."""
        receiver: PortReceiver = PortReceiver(runtime(), once=once, ranked=True)
        return Port(receiver.subject), receiver


register_ext(17, Port, lambda p: [p.subject, p.rank, p.message_rank], lambda f: Port(*f[:3]))
