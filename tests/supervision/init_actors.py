"""Actors whose ``__init__`` is slow, fails on one rank, or ends its process (importable by procs)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from monarch.actor import Actor, current_rank, endpoint


class SlowInit(Actor):
    """``__init__`` blocks its thread for ``seconds`` (as an ``import torch`` on a busy host)."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def ping(self) -> int:
        return current_rank().rank


class SlowAsyncInit(Actor):
    """An async actor: its blocking ``__init__`` holds the proc's event loop itself."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    async def ping(self) -> int:
        await asyncio.sleep(0)
        return current_rank().rank


class FailOrStall(Actor):
    """Rank 0's ``__init__`` raises at once; every other rank's blocks for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        if current_rank().rank == 0:
            raise ValueError("rank 0 init exploded")
        time.sleep(seconds)

    @endpoint
    def ping(self) -> int:
        return current_rank().rank


class DiesInInit(Actor):
    """Rank 1's process is killed during ``__init__``; the other ranks are fine."""

    def __init__(self) -> None:
        if current_rank().rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(1.0)

    @endpoint
    def ping(self) -> int:
        return current_rank().rank


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()
