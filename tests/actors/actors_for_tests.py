"""Actor classes used by the tests, importable by procs (they travel by reference)."""

from __future__ import annotations

import asyncio
import os
import sys

from monarch.actor import Actor, context, current_rank, current_size, endpoint


class Echo(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.seen: list = []

    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def whoami(self) -> dict:
        ctx = context()
        return {
            "rank": current_rank().rank,
            "point": dict(current_rank()),
            "size": current_size(),
            "message_rank": ctx.message_rank.rank,
            "message_extent": dict(ctx.message_rank.extent),
            "actor_id": ctx.actor_instance.actor_id,
            "pid": os.getpid(),
        }

    @endpoint
    async def aping(self, x):
        await asyncio.sleep(0)
        return x

    @endpoint
    def record(self, tag, n: int) -> None:
        self.seen.append((tag, n))

    @endpoint
    def seen_log(self) -> list:
        return self.seen

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def modules(self) -> list:
        return sorted(m for m in ("torch", "numpy") if m in sys.modules)

    @endpoint
    def returns_unpicklable(self):
        import threading

        return threading.Lock()

    def helper(self) -> int:
        return 1


class Relay(Actor):
    """Calls another mesh from inside its own endpoints."""

    def __init__(self, target) -> None:
        self.target = target

    @endpoint
    def relay_sync(self, x):
        # Blocks this actor's thread on another actor's reply: must not deadlock the proc.
        return self.target.ping.call(x).get(timeout=30)

    @endpoint
    async def relay_async(self, x):
        return await self.target.ping.call(x)


class BadInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("init exploded")

    @endpoint
    def ping(self, x):
        return x


class Big(Actor):
    @endpoint
    def blob(self, n: int) -> bytes:
        return b"x" * n

    @endpoint
    def length(self, data: bytes) -> int:
        return len(data)
