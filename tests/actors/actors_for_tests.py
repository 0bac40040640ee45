"""Actor classes used by the tests, importable by procs (they travel by reference)."""

from __future__ import annotations

import asyncio
import os
import sys

from monarch.actor import Actor, context, current_rank, endpoint


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
            "rank": ctx.actor_instance.rank.rank,  # the actor's own point, not the message's
            "point": dict(ctx.actor_instance.rank),
            "size": dict(ctx.actor_instance.rank.extent),
            "message_rank": ctx.message_rank.rank,
            "message_extent": dict(ctx.message_rank.extent),
            "actor_id": ctx.actor_instance.actor_id,
            "pid": os.getpid(),
        }

    @endpoint
    def record(self, tag, n: int) -> None:
        self.seen.append((tag, n))

    @endpoint
    def seen_log(self) -> list:
        return self.seen

    @endpoint
    def direct_writes(self) -> int:
        """Messages this proc's threads wrote to the broker themselves (monarch.broker.natspy_internals.direct_write)."""
        from monarch.core.process_runtime import runtime

        direct = runtime()._direct_write
        return -1 if direct is None else direct.writes

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


class AsyncEcho(Actor):
    """Echo's async twin (an actor's endpoints are all sync or all async, as in Monarch)."""

    @endpoint
    async def aping(self, x):
        await asyncio.sleep(0)
        return x


class Relay(Actor):
    """Calls another mesh from inside its own endpoints."""

    def __init__(self, target) -> None:
        self.target = target

    @endpoint
    def relay_sync(self, x):
        # Blocks this actor's thread on another actor's reply: must not deadlock the proc.
        return self.target.ping.call(x).get(timeout=30)


class AsyncRelay(Actor):
    """Relay's async twin: awaits another mesh's reply on the proc's loop."""

    def __init__(self, target) -> None:
        self.target = target

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


class AsyncPrinter(Actor):
    """Prints from an async endpoint, on the proc's loop."""

    @endpoint
    async def say_async(self, text: str) -> None:
        print(text)


class TwoThreadPrinter(Actor):
    """Prints numbered lines from two threads at once (log forwarding's order)."""

    @endpoint
    def race(self, n: int) -> int:
        """A thread prints ``seq 0`` to ``seq n-1`` while this one prints ``ep 0``,
        ``ep 1``, ... until it ends; returns how many ``ep`` lines it printed."""
        import threading

        t = threading.Thread(target=lambda: [print(f"seq {i}") for i in range(n)])
        t.start()
        k = 0
        while t.is_alive():
            print(f"ep {k}")
            k += 1
        t.join()
        return k


class Printer(Actor):
    """Writes to stdout, stderr and logging from its endpoints (log forwarding tests)."""

    def __init__(self, farewell: str = "") -> None:
        self.farewell = farewell

    @endpoint
    def say(self, text: str, rank_suffix: bool = False) -> None:
        print(f"{text} {current_rank().rank}" if rank_suffix else text)

    @endpoint
    def say_err(self, text: str) -> None:
        print(text, file=sys.stderr)

    @endpoint
    def warn(self, text: str) -> None:
        self.logger.warning(text)

    @endpoint
    def info(self, text: str) -> None:
        self.logger.info(text)

    @endpoint
    def say_from_thread(self, text: str) -> None:
        import threading

        t = threading.Thread(target=print, args=(text,))  # runs outside any actor's context
        t.start()
        t.join()

    def __cleanup__(self, exc) -> None:
        if self.farewell:
            print(self.farewell)
