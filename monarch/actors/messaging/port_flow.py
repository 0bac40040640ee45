"""Backpressure for port sends: a sender may not run more than a window ahead of a proc.

``Port.send`` (and ``Port.exception``) publish to ``mon.<ns>.port.<proc>.<id>``; every
port of one proc shares that proc's one subscription, so nats-server's buffer for
that proc's connection (64 MiB; past it the server cuts the proc off and what it
held is lost) fills when the proc's event loop stalls and stops reading. As for
actor meshes (:mod:`.flow`), this process keeps one :class:`FlowControl` per
destination proc: after every ``MONARCH_FLOW_BATCH`` messages or
``MONARCH_FLOW_BYTES / MONARCH_FLOW_WINDOW`` bytes it publishes a *flow marker* to
``mon.<ns>.port.<proc>.flow``, on the same subscription and so in order behind
those messages. The receiving proc's runtime answers it as soon as it takes it off
its intake (:meth:`Runtime._on_port`), that is once it has read everything before
it: no user code has to run. Its answer says how many processes send to it
(:mod:`monarch.core.flow_answers`), and each keeps to its share of the window, so
that several senders to one proc add up to one window. A proc that is gone
answers through the broker ("no responders"), which counts as an answer too, so a
dead receiver does not hold senders back. A message counts as its body plus
:data:`OVERHEAD` (its subject, headers and protocol line, which nats-server's
buffer holds too). A sender thread with a window of markers unanswered waits; a send on
the event loop is held in this process, in order, and released as answers come.
"""

from __future__ import annotations

from typing import Any

from monarch.actors.messaging.flow import FlowControl, flow_settings
from monarch.broker.vocabulary import subjects
from monarch.core.dispatch import FLOW_PORT
from monarch.core.runtime import Runtime

OVERHEAD = 256  # bytes a port message takes at nats-server beyond its body, about
_UNSEEN: Any = False  # a destination not seen yet (None: this proc itself, no flow control)


class PortFlow(FlowControl):
    """Flow control of this process's port sends to one proc."""

    def __init__(self, rt: Runtime, dest: str) -> None:
        super().__init__(dest, loop=rt.loop, **flow_settings(rt.settings))
        self.what = f"proc {dest.rsplit('.', 1)[-1]} (port sends)"
        self._rt = rt
        self._marker_subject = f"{dest}.{FLOW_PORT}"
        # Any message to this port answers one marker: the proc's answer, or the
        # broker's "no responders" for a proc that is gone.
        self._ack_port, self._ack = rt.open_port(self._answered)

    def _answered(self, msg: Any) -> None:
        """On the loop: a marker's answer; its body, the proc's count of senders."""
        try:
            senders = int(msg.data or b"1")
        except ValueError:  # the broker's "no responders" carries no count
            senders = 1
        self.shared_by(senders)
        self.acknowledged()

    def send_marker(self) -> None:
        """On the loop, right after the message it follows."""
        self._rt.publish(self._marker_subject, b"", None, self._ack)


class PortFlows:
    """One :class:`PortFlow` per destination proc of this process's port sends."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._flows: dict[str, PortFlow | None] = {}
        self._own = subjects.port(rt.namespace, rt.proc_uid, "")[:-1]
        self._root = subjects.port(rt.namespace, "", "")[:-1]  # "mon.<ns>.port."

    def get(self, subject: str) -> PortFlow | None:
        """The flow control for the proc that ``subject`` (a port's) belongs to; None for
        this proc's own ports (delivered in process) and for a subject that is no proc's
        port (a plain NATS inbox: nobody would answer a marker there)."""
        dest = subject[: subject.rfind(".")]
        flow = self._flows.get(dest, _UNSEEN)
        if flow is _UNSEEN:
            root = self._root
            theirs = dest != self._own and dest.startswith(root) and "." not in dest[len(root) :]
            flow = self._flows[dest] = PortFlow(self.rt, dest) if theirs else None
        return flow
