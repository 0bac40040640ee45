"""Backpressure: a sender may not run more than a window of messages ahead of an actor mesh.

Every ``MONARCH_FLOW_BATCH`` messages a sender process sends to a mesh, it also sends
a *flow marker* (a call to the built-in ``__flow__`` endpoint) to every
actor of the mesh; an actor answers it when it reaches it in its mailbox,
that is once it has handled everything sent before. A sender thread with
``MONARCH_FLOW_WINDOW`` markers unanswered waits (it is slowed down, nothing is
dropped); if the mesh makes no progress for ``MONARCH_FLOW_TIMEOUT`` seconds
the send raises :class:`BackpressureError` instead of queueing without bound.
Code running on the event loop itself (async endpoints, replies posted from the
loop) must not wait: blocking it would also stop the markers' answers it waits
for. Its messages are *held* instead: once the window is full (or messages are
already held), a send from the loop is queued here, in order, and released as
markers come back. We hold rather than raise because Monarch's ``send`` and
``broadcast`` never block and never fail for a slow receiver, and async senders
(``grpo_yield.py``'s rollout streams) rely on it. The queue is bounded: a send from
the loop that would hold more than ``MONARCH_FLOW_HOLD_BYTES``, or that comes while
held messages have seen no marker answered for ``MONARCH_FLOW_TIMEOUT``, raises
:class:`BackpressureError` (that message is not sent; the held ones still go).

Bytes count too: a marker also goes out after every ``MONARCH_FLOW_BYTES /
MONARCH_FLOW_WINDOW`` bytes of message bodies, whichever comes first. So a sender
with a window of markers unanswered has at most about ``MONARCH_FLOW_BYTES`` (plus
one message per marker) in flight to each actor, and a receiver that stops
reading (a proc whose loop is blocked) holds it back before nats-server's buffer
for that receiver (64 MiB: past it the server cuts the receiver off and what it
held is lost) fills. The bound is per sender process and mesh: several senders,
or several meshes on one proc, add up.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)

FLOW_ENDPOINT = "__flow__"


class BackpressureError(RuntimeError):
    """An actor mesh did not keep up with this sender for too long."""


def flow_settings(cfg: Any) -> dict[str, Any]:
    """:class:`FlowControl`'s bounds as a process's settings give them (``MONARCH_FLOW_*``)."""
    return {
        "timeout": cfg.flow_timeout,
        "batch": cfg.flow_batch,
        "window": cfg.flow_window,
        "max_bytes": cfg.flow_bytes,
        "hold_bytes": cfg.flow_hold_bytes,
    }


class FlowControl:
    """One per (sender process, actor mesh)."""

    def __init__(
        self,
        mesh_name: str,
        timeout: float,
        batch: int,
        window: int,
        max_bytes: int = 1 << 62,
        loop: Any = None,
        hold_bytes: int = 1 << 62,
    ) -> None:
        self.mesh_name = mesh_name
        self.what = f"actor mesh {mesh_name!r}"  # who does not keep up, in errors
        self.timeout = timeout
        self.batch = batch
        self.window = window  # markers unanswered at most: this sender's share
        self.full_window = window
        self.max_bytes = max_bytes
        self.marker_bytes = max(1, max_bytes // window)  # bytes between two markers, at most
        self._lock = threading.Condition()
        self._counter = itertools.count(1)
        # Bytes since the last marker. Two threads may race on the += and lose a few:
        # a marker then comes a little later, which the bound's one message of slack
        # per marker absorbs in practice; a lock here would cost every send.
        self._bytes = 0
        self._outstanding = 0
        self.waits = 0  # times a sender was held back (for tests and benchmarks)
        # Sends from the event loop waiting for room, in order: (nbytes, send). Mutated on
        # the loop only (``loop``: where release runs).
        self.loop = loop
        self.hold_bytes = hold_bytes
        self.held: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self.held_bytes = 0
        self.holds = 0  # messages ever held (for tests and benchmarks)
        self._progress = 0.0  # monotonic time of the last answered marker while holding

    def count(self, nbytes: int = 0) -> bool:
        """Count one message of ``nbytes``; True when a marker is due after it."""
        self._bytes += nbytes
        # itertools.count: atomic, no lock
        if next(self._counter) % self.batch and self._bytes < self.marker_bytes:
            return False
        self._bytes = 0
        with self._lock:
            self._outstanding += 1
        return True

    def acknowledged(self, _: Any = None) -> None:
        with self._lock:
            self._outstanding -= 1
            self._lock.notify_all()
        if self.held:
            self._progress = time.monotonic()
            self._schedule_release()

    def shared_by(self, senders: int) -> None:
        """A marker's answer says ``senders`` processes send to the receiver: keep to a
        share of the window (one marker at least). Off the message path."""
        self.window = max(1, self.full_window // max(1, senders))

    def mesh_answered(self, marker: Any) -> None:
        """A mesh's answers to a marker (a future of a ValueMesh: each actor's count of
        processes sending to its proc): keep to the smallest share, then count it answered."""
        try:
            counts = [v for v in marker.get(0).values() if isinstance(v, int)]
        except Exception:  # an actor is gone (or answered with an error): no count from it
            counts = []
        if counts:
            self.shared_by(max(counts))
        self.acknowledged()

    def must_hold(self) -> bool:
        """True when a send now would exceed the window (or must queue behind held ones)."""
        return bool(self.held) or self._outstanding >= self.window

    def hold(self, nbytes: int, send: Callable[[], None]) -> None:
        """On the loop: keep a message of ``nbytes`` until there is room; ``send()`` then
        sends (and counts) it. Raises :class:`BackpressureError` past the bounds."""
        now = time.monotonic()
        if not self.held:
            self._progress = now
        elif now - self._progress > self.timeout:
            raise BackpressureError(
                f"{self.what} has not kept up: {len(self.held)} message(s) "
                f"({self.held_bytes / 2**20:.1f} MiB) sent from the event loop wait in this "
                f"process and no earlier message was handled for {self.timeout:.0f} s "
                "(MONARCH_FLOW_TIMEOUT); this one was not sent"
            )
        if self.held and self.held_bytes + nbytes > self.hold_bytes:
            raise BackpressureError(
                f"{self.what} has not kept up: {self.held_bytes / 2**20:.1f} MiB sent "
                "from the event loop already wait in this process for it "
                "(MONARCH_FLOW_HOLD_BYTES); this message was not sent"
            )
        self.held.append((nbytes, send))
        self.held_bytes += nbytes
        self.holds += 1
        if self._outstanding < self.window:  # an answer came between the check and now
            self._schedule_release()

    def _schedule_release(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.release)  # a fresh loop turn: no re-entry

    def release(self) -> None:
        """On the loop: send held messages, in order, while there is room."""
        held = self.held
        while held and self._outstanding < self.window:
            nbytes, send = held.popleft()
            self.held_bytes -= nbytes
            try:
                send()
            except Exception:
                _log.exception("a held message to %s could not be sent", self.what)

    def wait_for_room(self, can_block: bool) -> None:
        """Block while too far ahead of the mesh (callers off the loop only)."""
        if not can_block or self._outstanding < self.window:  # read without the lock: a hint
            return
        with self._lock:
            if self._outstanding < self.window:
                return
            self.waits += 1
            deadline = time.monotonic() + self.timeout
            while self._outstanding >= self.window:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackpressureError(
                        f"{self.what} has not kept up: up to "
                        f"{self._outstanding * self.batch} messages (or "
                        f"{self._outstanding * self.marker_bytes / 2**20:.0f} MiB) from this "
                        f"process are still unhandled after {self.timeout:.0f} s "
                        "(MONARCH_FLOW_TIMEOUT)"
                    )
                self._lock.wait(left)

    @property
    def outstanding(self) -> int:
        return self._outstanding
