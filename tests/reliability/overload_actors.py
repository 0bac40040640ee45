"""Actors for the overload tests (importable by procs)."""

from __future__ import annotations

import time

from monarch.actor import Actor, endpoint


class Sink(Actor):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seen = 0
        self.in_order = True

    @endpoint
    def take(self, i: int) -> None:
        if i != self.seen:
            self.in_order = False
        self.seen += 1
        if self.delay:
            time.sleep(self.delay)

    @endpoint
    def count(self) -> tuple:
        return self.seen, self.in_order

    @endpoint
    def hang(self) -> None:
        time.sleep(3600)


class StalledSink(Actor):
    """An async actor whose endpoint can block its proc's event loop: while it does,
    the proc reads nothing from the broker, whose buffer for it fills."""

    def __init__(self) -> None:
        self.seen = 0
        self.nbytes = 0

    @endpoint
    async def stall(self, seconds: float) -> None:
        time.sleep(seconds)  # on the loop, on purpose

    @endpoint
    async def take(self, data: bytes) -> None:
        self.seen += 1
        self.nbytes += len(data)

    @endpoint
    async def count(self) -> tuple:
        return self.seen, self.nbytes
