"""Actor classes for the activity, stall and stacks tests (importable by procs)."""

from __future__ import annotations

import ctypes
import time

from monarch.actor import Actor, context, endpoint


class Busy(Actor):
    """Endpoints that return, raise, hold their thread, or abort the actor."""

    @endpoint
    def work(self, x: int) -> int:
        return x

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom on purpose")

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)  # a sync endpoint: holds the actor's thread, not the loop
        return "rested"

    @endpoint
    def hold_gil(self, seconds: int) -> str:
        time.sleep(0.5)  # still answering: whoever waits for the call to start sees it
        ctypes.PyDLL(None).sleep(seconds)  # libc sleep with the GIL held: no Python runs
        return "released"

    @endpoint
    def abort(self, reason: str) -> str:
        context().actor_instance.abort(reason)
        return "abort requested"


class Hog(Actor):
    """An async actor whose endpoint blocks the proc's loop."""

    @endpoint
    async def work(self, x: int) -> int:
        return x

    @endpoint
    async def hog_loop(self, seconds: float) -> str:
        time.sleep(seconds)  # blocks the proc's event loop on purpose
        return "done"


class SlowStart(Actor):
    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def ping(self) -> str:
        return "pong"
