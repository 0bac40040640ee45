"""The receiving end of flow control: count a proc's recent senders for markers' answers.

A sender keeps a window of flow markers unanswered per destination
(:mod:`monarch.actors.messaging.flow`): per actor mesh for mesh calls and sends,
per proc for port sends (:mod:`monarch.actors.messaging.port_flow`). A proc's
runtime answers a port flow marker (``mon.<ns>.port.<proc>.flow``) as soon as it
takes it off its intake; an actor answers a mesh flow marker (a call to its
``__flow__`` endpoint) when it reaches it in its mailbox. Either answer says how
many processes have been sending this proc markers lately (distinct senders in the
last :data:`RECENT` seconds, across its ports and all its actors), and each sender
keeps to its share of the window: several senders to one proc (a pool of
generators streaming into one scorer, four clients calling one actor) add up to
about one window, not one each, and a stalled proc's backlog at nats-server stays
under its 64 MiB.

A marker's reply subject is a port of its sender's proc (``mon.<ns>.port.<proc>.<id>``),
so the sender is that subject less its last token. Markers are rare (one per
``MONARCH_FLOW_BYTES / MONARCH_FLOW_WINDOW`` bytes or ``MONARCH_FLOW_BATCH``
messages), so none of this is on a message's path. Actors on their own threads
and the loop both call :meth:`FlowAnswers.heard`: plain dict operations, atomic
under the GIL.
"""

from __future__ import annotations

import time

RECENT = 30.0  # seconds a sender counts after its last marker


class FlowAnswers:
    """Counts this proc's recent senders; gives the count for a marker's answer."""

    def __init__(self) -> None:
        self._last_seen: dict[str, float] = {}  # a sender proc's port prefix -> its last marker
        self._pruned = 0.0

    def heard(self, reply: str) -> int:
        """Note a marker whose reply subject is ``reply``; how many senders there are."""
        now = time.monotonic()
        seen = self._last_seen
        seen[reply[: reply.rfind(".")]] = now
        if now - self._pruned > RECENT / 3:
            self._pruned = now
            for sender, t in list(seen.items()):
                if now - t > RECENT:
                    seen.pop(sender, None)
        return len(seen)

    def answer(self, reply: str) -> bytes:
        """The body of the answer to a port flow marker whose reply subject is ``reply``."""
        return str(self.heard(reply)).encode()
