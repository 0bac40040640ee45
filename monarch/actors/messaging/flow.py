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

    def __init__(self, mesh_name: str, timeout: float, batch: int, window: int) -> None:
        self.mesh_name = mesh_name
        self.timeout = timeout
        self.batch = batch
        self.window = window
        self._lock = threading.Condition()
        self._counter = itertools.count(1)
        self._outstanding = 0

    def count(self) -> bool:
        """Count one message; True when a marker is due after it."""
        if next(self._counter) % self.batch:  # itertools.count: atomic, no lock
            return False
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
            deadline = time.monotonic() + self.timeout
            while self._outstanding >= self.window:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackpressureError(
                        f"actor mesh {self.mesh_name!r} has not kept up: "
                        f"{self._outstanding * self.batch} messages from this process are still "
                        f"unhandled after {self.timeout:.0f} s (MONARCH_FLOW_TIMEOUT)"
                    )
                self._lock.wait(left)

    @property
    def outstanding(self) -> int:
        return self._outstanding
