"""Backpressure: a sender may not run more than a window of messages ahead of an actor mesh.

Every ``MONARCH_FLOW_BATCH`` messages a sender process sends to a mesh, it also sends
a *flow marker* (a call to the built-in ``__flow__`` endpoint) to every
actor of the mesh; an actor answers it when it reaches it in its mailbox,
that is once it has handled everything sent before. A sender thread with
``MONARCH_FLOW_WINDOW`` markers unanswered waits (it is slowed down, nothing is
dropped); if the mesh makes no progress for ``MONARCH_FLOW_TIMEOUT`` seconds
the send raises :class:`BackpressureError` instead of queueing without bound.
Code running on the event loop itself (async endpoints) cannot wait, so it is
never held back; its messages still count.

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

import itertools
import threading
import time
from typing import Any

FLOW_ENDPOINT = "__flow__"


class BackpressureError(RuntimeError):
    """An actor mesh did not keep up with this sender for too long."""


class FlowControl:
    """One per (sender process, actor mesh)."""

    def __init__(
        self, mesh_name: str, timeout: float, batch: int, window: int, max_bytes: int = 1 << 62
    ) -> None:
        self.mesh_name = mesh_name
        self.timeout = timeout
        self.batch = batch
        self.window = window
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
                        f"actor mesh {self.mesh_name!r} has not kept up: up to "
                        f"{self._outstanding * self.batch} messages (or "
                        f"{self._outstanding * self.marker_bytes / 2**20:.0f} MiB) from this "
                        f"process are still unhandled after {self.timeout:.0f} s "
                        "(MONARCH_FLOW_TIMEOUT)"
                    )
                self._lock.wait(left)

    @property
    def outstanding(self) -> int:
        return self._outstanding
