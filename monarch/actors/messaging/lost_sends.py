"""Lost sends: messages to actors are numbered, a gap is a loss, and a loss is reported.

A broadcast has no reply, so when it dies with a broker node nobody would
notice. Every message a process publishes to an actor mesh subject that
nobody gathers a reply to (a send, a call answered through a port) carries
``Mon-Seq: <n>@<sender proc uid>``, counted per (sender process, subject).
Each actor that listens on a subject receives every message published to it,
so for each (sender, subject) it must see 1, 2, 3, ... with no hole; the
receiver (:class:`SequenceCheck`, one per actor) notices a hole at the next
such message from that sender on that subject.

Gathered calls (and flow markers) are not counted: a lost one is found by its
caller (:mod:`monarch.actors.messaging.lost_replies`). They carry the count so far
instead, ``Mon-Sent: <n>@<sender proc uid>``, so that they too reveal the sends
lost before them. The last sends of a burst have no next message, so a sender
also publishes a *sync* marker (``Mon-Kind: sync`` with ``Mon-Sent``) on each
subject it sent to, at most once every ``SYNC_EVERY`` seconds and
``SYNC_REPEATS`` times after its last send there, and at once on every
subject when its own connection comes back after a drop.

A loss surfaces to the sender, where the user can act on it:

* found by a call: the call is not run and fails with
  :class:`~monarch.actors.errors.MessageLostError` (its caller learns at once);
* found by a send, a flow marker or a sync marker: the receiver tells the
  sender's process (a ``lost`` control message), which logs a warning and makes
  the next call or send on that mesh raise :class:`MessageLostError` with
  the count per rank.

So a lost broadcast is reported within about ``SYNC_EVERY`` seconds of the
sender's last send on that subject (plus its reconnect), never silently. A
message that arrives after a later one from the same sender (possible only
when a broker connection is replaced while the old node still forwards) is
handled as usual: its loss was a false alarm, logged as such.
"""

from __future__ import annotations

import logging
from typing import Any

from monarch.actors.messaging import messages as m
from monarch.broker.vocabulary import headers as hdr

log = logging.getLogger(__name__)

SENT = hdr.SENT  # how many counted messages the sender had sent on this subject
SYNC_EVERY = 1.0
SYNC_REPEATS = 3


class SendCounter:
    """Numbers this process's messages to actors per subject; sends the sync markers (loop only)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.suffix = "@" + rt.proc_uid
        self._count: dict[str, int] = {}
        self._syncs_left: dict[str, int] = {}

    def stamp(self, subject: str, headers: dict) -> None:
        """Number a message about to be published to ``subject`` that nobody gathers."""
        n = self._count.get(subject, 0) + 1
        self._count[subject] = n
        headers[m.SEQ] = f"{n}{self.suffix}"
        self._syncs_left[subject] = SYNC_REPEATS

    def stamp_count(self, subject: str, headers: dict) -> None:
        """Give a gathered call to ``subject`` the count so far (when there is one)."""
        n = self._count.get(subject)
        if n is not None:
            headers[SENT] = f"{n}{self.suffix}"

    def start(self) -> None:
        self.rt.every(SYNC_EVERY, self.sync, "sending sync markers")

    def sync(self) -> None:
        """One sync marker on each subject sent to lately."""
        if self.rt.nc is None or not self.rt.nc.is_connected:
            return  # they would queue behind the reconnect: connection_changed sends them
        for subject, left in list(self._syncs_left.items()):
            if left <= 1:
                del self._syncs_left[subject]
            else:
                self._syncs_left[subject] = left - 1
            self._publish_sync(subject)

    def connection_changed(self, connected: bool) -> None:
        if connected:  # what left just before the drop may be gone: check every subject
            for subject in self._count:
                self._syncs_left[subject] = SYNC_REPEATS
            self.sync()

    def _publish_sync(self, subject: str) -> None:
        headers = {
            m.KIND: "sync",
            m.FROM: self.rt.proc_uid,
            SENT: f"{self._count[subject]}{self.suffix}",
        }
        self.rt.publish(subject, b"", headers)


class SequenceCheck:
    """One actor's view of the numbers it received, per (sender, subject) (loop only)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    def check(self, msg: Any) -> tuple[str, int] | None:
        """``(sender proc uid, messages lost)`` when ``msg`` shows a hole, else None."""
        numbered = numbering(msg)
        return None if numbered is None else self.check_number(*numbered)

    def check_number(self, key: tuple[str, str], n: int, counted: bool) -> tuple[str, int] | None:
        """:meth:`check` given the message's :func:`numbering` (read once for a whole
        group's actors, :mod:`monarch.actors.hosting.group_call`)."""
        last = self._last.get(key, 0)
        if not counted:  # a count so far: everything up to it should be here
            if n > last:
                self._last[key] = n
                return key[0], n - last
            return None
        if n == last + 1:
            self._last[key] = n
            return None
        if n > last:
            self._last[key] = n
            return key[0], n - last - 1
        log.warning(
            "message %d from %s on %s arrived after message %d: reordered, not lost "
            "(a loss reported for it was a false alarm)",
            n,
            key[0],
            key[1],
            last,
        )
        return None


def numbering(msg: Any) -> tuple[tuple[str, str], int, bool] | None:
    """A message's place in its sender's numbering: ``((sender proc uid, subject), n,
    counted)`` (``counted``: ``Mon-Seq``, the n-th counted message; else ``Mon-Sent``, n
    counted so far); None when it carries neither (in-process delivery, or not from a mesh
    sender) or an unreadable one."""
    headers = msg.headers
    if not headers:
        return None
    seq = headers.get(m.SEQ)
    counted = seq is not None
    if not counted:
        seq = headers.get(SENT)
        if seq is None:
            return None
    number, _, sender = seq.partition("@")
    try:
        n = int(number)
    except ValueError:
        return None
    return (sender, msg.subject), n, counted
