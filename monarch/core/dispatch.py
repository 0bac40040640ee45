"""The receiving half of the :class:`~monarch.core.runtime.Runtime`: ports and control.

Apart from the runtime's sending half (outbox, batching, threads) because it is
the other direction: which handler a message that reached this process goes to.
A port is a numbered subject of this proc that one handler owns (replies,
streams); the control subject carries requests to the proc itself, a few kinds
of which are answered here in arrival order and the rest by the proc's control
server, which the actor layer hands in (the core never imports upward).

A mixin of :class:`~monarch.core.runtime.Runtime`, not an object it holds, so
that delivering a message costs no more than a method call on the runtime.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.core.busy_poll import BusyPoll
from monarch.core.flow_answers import FlowAnswers

log = logging.getLogger("monarch.core.runtime")  # the runtime's log, as before the split
# The pseudo port a proc answers port senders' flow markers on (monarch.actors.messaging.port_flow).
FLOW_PORT = "flow"

PortHandler = Callable[[Msg], None]


class PortsAndControl:
    """Ports and control-subject dispatch of a :class:`~monarch.core.runtime.Runtime`."""

    # Set by the Runtime.
    namespace: str
    proc_uid: str
    nc: Client | None
    busy_poll: BusyPoll

    if TYPE_CHECKING:

        def publish(self, subject: str, payload: bytes) -> None: ...

    def _init_ports_and_control(self) -> None:
        self._ports: dict[int, PortHandler] = {}
        self.flow_answers = FlowAnswers()  # senders' flow markers (monarch.core.flow_answers)
        self._port_ids: Iterator[int] = itertools.count(1)
        self._mesh_handlers: dict[str, Callable[[Msg], None]] = {}
        self._ctl_handler: Callable[[Msg], None] | None = None
        # Control kinds answered here, in arrival order, before the proc's server.
        self._ctl_kinds: dict[str, Callable[[Msg], None]] = {}

    def open_port(self, handler: PortHandler) -> tuple[int, str]:
        """Register a handler for messages to a new port of this proc; (id, subject)."""
        port_id = next(self._port_ids)
        self._ports[port_id] = handler
        return port_id, subjects.port(self.namespace, self.proc_uid, port_id)

    def close_port(self, port_id: int) -> None:
        self._ports.pop(port_id, None)

    def _on_port(self, msg: Msg) -> None:
        port_id = msg.subject.rsplit(".", 1)[-1]
        handler = self._ports.get(int(port_id)) if port_id.isdigit() else None
        if handler is None:
            if port_id == FLOW_PORT and msg.reply:
                # A port sender's flow marker (monarch.actors.messaging.port_flow): we have
                # taken everything it sent before it off our intake.
                self.publish(msg.reply, self.flow_answers.answer(msg.reply))
                return
            log.debug("message for closed or unknown port %s", msg.subject)
            return
        handler(msg)

    def set_ctl_handler(self, handler: Callable[[Msg], None]) -> None:
        """The proc's control server: every control message no kind handler takes."""
        self._ctl_handler = handler

    def handle_ctl_kind(self, kind: str, handler: Callable[[Msg], None]) -> None:
        """Answer control messages of ``Mon-Kind: kind`` here, in arrival order.

        They skip the proc's control server, so they keep their place among the
        calls they concern (the loss-recovery probes rely on that).
        """
        self._ctl_kinds[kind] = handler

    def _on_ctl(self, msg: Msg) -> None:
        handler = self._ctl_kinds.get((msg.headers or {}).get(hdr.KIND, ""))
        if handler is not None:
            handler(msg)
            return
        if self._ctl_handler is None:
            log.warning("control message %s ignored: this process hosts no actors", msg.subject)
            return
        self._ctl_handler(msg)

    async def subscribe_mesh(self, subject: str, handler: Callable[[Msg], None]) -> Any:
        return await subscribe_ordered(self.nc, subject, handler, self.busy_poll.on_message)
