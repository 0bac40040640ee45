"""How a message enters an actor's mailbox, and the lost-message check on the way in.

The intake hands each message to :meth:`Delivery.deliver`, in wire order, on the loop.
First the sender's numbering is checked
(:class:`~monarch.actors.messaging.lost_sends.SequenceCheck`): a hole means messages from
that sender were lost on the way (a broker node died?); the sender's process is told, and
a call behind the hole is refused at once. A failure of a mesh the actor owns enters
here too (:meth:`Delivery.supervise`), for its ``__supervise__``.

A mixin of :class:`~monarch.actors.hosting.instance.ActorInstance`, which holds
the state it uses (set in its ``__init__``).
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from monarch.actors.calls import activity
from monarch.actors.calls.activity import call_listeners
from monarch.actors.errors import MessageLostError
from monarch.actors.hosting.dispatch import Supervise
from monarch.actors.hosting.mailbox import LoopRunner
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps
from monarch.broker.vocabulary import subjects
from monarch.supervision.failure import MeshFailure

log = logging.getLogger(__name__)


class Delivery:
    """What arrives for an actor, checked and queued in its mailbox."""

    def deliver(self, msg: Msg) -> None:
        """Called by the intake, in wire order, on the loop."""
        hole = self._sequence.check(msg)
        if hole is not None and self._lost_before(msg, *hole):
            return
        headers = msg.headers
        if headers and headers.get(m.KIND) == "sync":
            return  # a sender's count so far: checked, nothing to run
        if call_listeners:  # someone records calls: when this one arrived
            try:
                msg._mon_delivered = activity.wall_now()  # type: ignore[attr-defined]
            except AttributeError:  # a message type with no room for it: time unknown
                pass
        replies = actor_process(self.rt).replies
        if msg.reply and replies is not None and getattr(msg, "_mon_share", None) is None:
            # A caller may ask about it later (a group's shared message: told for the
            # whole group already, monarch.actors.hosting.group_fanout).
            replies.received(msg.reply, self.rank)
        if self._stopping or self.failed is not None:
            self._refuse(msg)
            return
        self._runner.put(msg)

    def _lost_before(self, msg: Msg, sender: str, count: int) -> bool:
        """Messages from ``sender`` were lost before ``msg``: tell it; True if ``msg`` is refused.

        A call is refused, so that its caller learns at once; anything else is
        handled, and the sender's process is told (its next call on the mesh raises).
        """
        headers = msg.headers or {}
        log.warning(
            "actor %s: %d message(s) from %s on %s were lost on the way (a broker node died?)",
            self.actor_id, count, sender, msg.subject,
        )  # fmt: skip
        if msg.reply and headers.get(m.KIND) == "call" and headers.get(m.ENDPOINT) != FLOW_ENDPOINT:
            err = MessageLostError(
                f"{count} earlier message(s) from this process to {self.actor_id} were lost on "
                "the way (a broker node died?), so this call was not run there",
                mesh=self.name,
                counts={self.rank: count},
            )
            actor_process(self.rt).replies.received(msg.reply, self.rank)
            self._publish_reply(msg.reply, "error", m.encode_error(err))
            return True
        notice = dumps([self.uid, self.rank, count, msg.subject])
        self.rt.publish(
            subjects.ctl_proc(self.rt.namespace, sender),
            notice,
            {m.KIND: "lost", m.FROM: self.actor_id},
        )
        return False

    def supervise(self, failure: MeshFailure) -> None:
        """A mesh this actor owns failed: run ``__supervise__``.

        An async actor hears of it at once, beside an endpoint that is awaiting
        (as Monarch's control items run first): left unhandled, the actor fails
        now and callers waiting on it learn so, instead of when that endpoint
        ends. A sync actor's thread runs it after the message it is handling.
        """
        if self._done or self.failed is not None:
            return
        if isinstance(self._runner, LoopRunner):
            self.rt.loop.create_task(self._on_loop(Supervise(failure)))
        else:
            self._runner.put(Supervise(failure))
