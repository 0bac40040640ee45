"""A cheap stamp of when the event loop last turned (what a heartbeat's ``Mon-Loop-Stall`` reports)."""

from __future__ import annotations

import asyncio
import time


class LoopClock:
    """When an event loop last turned, readable from any thread.

    A callback on the loop stamps the time every ``period`` seconds; a loop
    busy with something else (a blocking call, a long import) does not run it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float) -> None:
        self.loop = loop
        self.period = period
        self.last = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start stamping (on the loop's thread)."""
        self._tick()

    def _tick(self) -> None:
        self.last = time.monotonic()
        self._handle = self.loop.call_later(self.period, self._tick)

    def stalled_for(self) -> float:
        """Seconds the loop is overdue: 0 while it turns at least every ``period``."""
        return max(0.0, time.monotonic() - self.last - self.period)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
