"""How an actor answers: replies to its callers, errors, and refusals.

A reply is written by the loop (:meth:`Replying._respond`), or by a sync actor's own
thread when nothing else waits (:meth:`Replying._reply_from_thread`); each reply sent
is kept by the process's lost-replies record, should the broker lose it. A failed or
stopping actor refuses what it is sent (:meth:`Replying._refuse`), saying why.

An actor of a mesh with several actors per proc (``ProcMesh.per_proc``) answers a
call that went to its whole local group on the loop. A successful reply whose body
is plain msgpack is *gathered* with its siblings' into one reply, the list of their
values under ``Mon-Ranks`` (:mod:`monarch.actors.hosting.reduce`; the caller
decodes one body per proc); a call from an ``Accumulator`` given a reducer has them
merged into one value there instead. Anything else (an error, a reply with tensors
or other out-of-band bytes) leaves as a *batchable* message: the replies written in
one loop turn leave as one NATS message (the runtime's batch,
:mod:`monarch.broker.bodies.batch`, which the caller's intake takes apart reply by
reply). Either way the per-rank checks, ordering and lost-reply accounting are
those of single replies. A batch never waits past its loop turn and never crosses
a message to another subject, so nothing is reordered.

A mixin of :class:`~monarch.actors.hosting.instance.ActorInstance`, which holds
the state it uses (set in its ``__init__``).
"""

from __future__ import annotations

import logging
import traceback as tb
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.calls.endpoint import EndpointProperty
from monarch.actors.errors import (
    MalformedMessageError,
    MeshStoppedError,
    SupervisionError,
    actor_failed_message,
    describe_actor,
)
from monarch.actors.hosting.group_fanout import shared_by_group
from monarch.actors.hosting.reduce import group_reducer
from monarch.actors.messaging import messages as m
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import plain_msgpack
from monarch.rdma.bulk import is_reference, offload, stays_inline
from monarch.supervision.failure import SupervisionFailure

log = logging.getLogger(__name__)


class Replying:
    """Answering a handled message: its reply, an error, or a refusal."""

    # Trailing dimensions of this actor's mesh that are actors of one proc
    # (``ProcMesh.per_proc``); 0: one actor of its mesh per proc.
    group_dims = 0
    _whole_group: dict[str, bool]  # subject -> _to_whole_group's answer (2^d subjects at most)

    def _to_whole_group(self, msg: Msg) -> bool:
        """Whether ``msg`` went to every actor of this mesh in this proc (its subject's
        per-proc coordinates all ``_``): their replies may leave as one message."""
        if not self.group_dims or not msg.reply:
            return False
        subject = getattr(msg, "subject", "") or ""
        known = self._whole_group.get(subject)
        if known is None:  # asked for every reply: the subject is split once
            known = self._whole_group[subject] = shared_by_group(subject, self.group_dims)
        return known

    def _merged_here(self, msg: Msg) -> bool:
        """Whether this actor's successful reply to ``msg`` is merged with its group's on
        this proc (a reducing call to the whole group, :mod:`monarch.actors.hosting.reduce`)."""
        share = getattr(msg, "_mon_share", None)
        if share is not None:  # the group's shared subscription worked it out once
            return share.merged
        headers = msg.headers
        return bool(headers) and m.REDUCE in headers and self._to_whole_group(msg)

    def _respond_unknown(self, msg: Msg) -> None:
        name = (msg.headers or {}).get(m.ENDPOINT, "")
        err = AttributeError(
            f"actor {self.actor_id} ({self.cls.__name__}) has no endpoint {name!r}"
        )
        self._respond(msg, False, m.encode_error(err), None)

    def _respond(
        self,
        msg: Msg,
        ok: bool,
        body: bytes,
        prop: EndpointProperty | None,
        at: int | None = None,
    ) -> None:
        """Send a handled message's outcome (loop only); ``at``: this actor's rank in the
        mesh or slice the message was sent to (what a ranked PortReceiver reports)."""
        if prop is not None and prop.explicit_response_port:
            if not ok and msg.reply:  # the caller learns why, instead of waiting
                if self.failed is not None:
                    self._refuse(msg)
                else:
                    self._publish_reply(msg.reply, "error", body)
            return  # the endpoint answers through its port
        if not msg.reply:
            if not ok and prop is not None:
                err = m.decode_error(
                    body, actor_id=self.actor_id, rank=self.rank, endpoint=prop.name
                )
                if isinstance(err.exception, MalformedMessageError):
                    log.warning("dropped a malformed message: %s", err.exception)
                    return
                self.fail(_with_traceback(err))  # no caller to receive it
            return
        if ok and self._merged_here(msg):
            group_reducer(self.rt).add(self, msg, body)  # merged with its siblings' replies
            return
        if ok:  # a big reply stays here and travels out of band; the caller fetches it
            try:
                body = offload(body, readers=1, ttl=None)
            except Exception as e:
                ok, body = False, m.encode_error(e)
        if len(body) > self.rt.max_payload:
            too_big = ValueError(
                f"the reply of {self.actor_id} is {len(body)} bytes, over the broker's "
                f"max_payload of {self.rt.max_payload}"
            )
            ok, body = False, m.encode_error(too_big)
        wait = bool(msg.headers and m.WAIT in msg.headers)
        whole = self._to_whole_group(msg)
        if ok and whole and not wait and not is_reference(body) and plain_msgpack(body):
            group_reducer(self.rt).gather(self, msg, body)  # leaves with its siblings' replies
            return
        self._publish_reply(msg.reply, "reply" if ok else "error", body, wait, at, whole)

    def _reply_from_thread(self, msg: Msg, body: bytes, prop: EndpointProperty, at: int) -> bool:
        """On the actor's thread: write a call's plain reply itself; False: nothing sent,
        the loop answers (:meth:`_respond`).

        Only a return value that travels in the message, to a caller that waits
        on it, when no other message waits for this actor (replies to a burst
        of calls are cheaper as the loop's few writes than as one write each),
        and while the runtime has nothing queued before it
        (:meth:`Runtime.publish_from_thread`): what ``_respond`` would do for it
        is this, and it saves the loop's wake-up before the write
        (benchmarks/NOTES.md 42).
        """
        if (
            not msg.reply
            or not self._runner.idle()  # type: ignore[union-attr]  (a burst: the loop batches)
            or self._to_whole_group(msg)  # the loop writes the group's replies as one
            or prop.explicit_response_port
            or self.failed is not None
            or not stays_inline(len(body))
            or len(body) > self.rt.max_payload
        ):
            return False
        wait = bool(msg.headers and m.WAIT in msg.headers)
        headers = self._reply_headers("reply", wait, at)
        replies = actor_process(self.rt).replies
        if replies is not None:
            # kept, should it be lost (if the loop sends it after all, its own call of
            # sent() finds the call answered already and keeps nothing twice)
            replies.sent(msg.reply, self.rank, body, headers)
        return self.rt.publish_from_thread(msg.reply, body, headers)

    def _reply_headers(self, kind: str, wait: bool, at: int | None) -> dict[str, str]:
        headers = {m.KIND: kind, m.RANK: str(self.rank), m.FROM: self.actor_id}
        if at is not None and at != self.rank:  # sent to a slice: the rank within it
            headers[m.MSG_RANK] = str(at)
        if wait:  # the caller blocks on this reply (see monarch.core.busy_poll)
            headers[m.WAIT] = "one"
        return headers

    def _publish_reply(
        self,
        subject: str,
        kind: str,
        body: bytes,
        wait: bool = False,
        at: int | None = None,
        batchable: bool = False,
    ) -> None:
        headers = self._reply_headers(kind, wait, at)
        replies = actor_process(self.rt).replies
        if replies is not None:
            replies.sent(subject, self.rank, body, headers)  # kept, should it be lost
        self.rt.publish(subject, body, headers, batchable=batchable)

    def _refuse(self, msg: Msg) -> None:
        if not getattr(msg, "reply", None):
            return
        if self.failed is not None:
            err: Exception = SupervisionError(
                actor_failed_message(self._describe(), failure_reason(self.actor_id, self.failed)),
                actor_id=self.actor_id,
                rank=self.rank,
            )
        else:
            err = MeshStoppedError(f"actor {self.actor_id} is stopping")
        self._publish_reply(msg.reply, "error", m.encode_error(err))

    def _describe(self) -> str:
        return describe_actor(self.cls, "", self.name, self.point)


def failure_reason(actor_id: str, exc: BaseException) -> str:
    """Why an actor failed, for its callers: the exception and, when known, its traceback."""
    if isinstance(exc, SupervisionFailure):
        return f"{actor_id} did not handle a failure of a mesh it owns:\n{exc.failure.report()}"
    head = f"{actor_id} failed: {type(exc).__name__}: {exc}"
    text = getattr(exc, "_monarch_traceback", None)
    if not text and exc.__traceback__ is not None:
        text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n{text}" if text else head


def _with_traceback(err: Any) -> BaseException:
    """The endpoint's exception, keeping the remote traceback text for the report."""
    exc = err.exception
    try:
        exc._monarch_traceback = err.traceback
    except Exception:
        pass
    return exc
