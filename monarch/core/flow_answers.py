"""The receiving end of port flow control: answer a port sender's flow marker.

A proc's runtime answers a flow marker (a message to ``mon.<ns>.port.<proc>.flow``,
:mod:`monarch.actors.messaging.port_flow`) as soon as it takes it off its intake.
The answer also says how many processes have been sending it port messages
lately (distinct markers' reply ports seen in the last :data:`RECENT` seconds): each
sender bounds itself to its share of the window, so that several senders to one
proc (a pool of generators streaming into one scorer) add up to one window, not
one each, and a stalled proc's backlog at nats-server stays under its 64 MiB.
"""

from __future__ import annotations

import time

RECENT = 30.0  # seconds a sender counts after its last marker


class FlowAnswers:
    """Counts this proc's recent port senders; gives the answer to a marker."""

    def __init__(self) -> None:
        self._last_seen: dict[str, float] = {}  # a sender's ack port -> when its last marker came
        self._pruned = 0.0

    def answer(self, reply: str) -> bytes:
        """The body of the answer to a marker whose reply subject is ``reply``."""
        now = time.monotonic()
        seen = self._last_seen
        seen[reply] = now
        if now - self._pruned > RECENT / 3:
            self._pruned = now
            for sender in [s for s, t in seen.items() if now - t > RECENT]:
                del seen[sender]
        return str(len(seen)).encode()
