"""Actor classes for the slice-rank and lifecycle tests (importable by procs)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

from monarch.actor import (
    Actor,
    Port,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
)


def where() -> dict:
    """What the code now running sees of its message and of itself."""
    ctx = context()
    return {
        "point": dict(current_rank()),
        "rank": current_rank().rank,
        "size": current_size(),
        "message_point": dict(ctx.message_rank),
        "own_point": dict(ctx.actor_instance.rank),
        "name": current_actor_name(),
        "actor_id": ctx.actor_instance.actor_id,
    }


class SyncWhere(Actor):
    def __init__(self) -> None:
        self.at_init = where()

    @endpoint
    def where(self) -> dict:
        return where()

    @endpoint
    def init_where(self) -> dict:
        return self.at_init

    @endpoint
    def run(self, fn: Callable[[], Any]) -> Any:
        return fn()

    @endpoint(explicit_response_port=True)
    def where_to_port(self, port: Port[dict]) -> None:
        port.send(where())


class AsyncWhere(Actor):
    @endpoint
    async def where(self) -> dict:
        await asyncio.sleep(0)
        return where()

    @concurrent_endpoint
    async def concurrent_where(self) -> dict:
        await asyncio.sleep(0)
        return where()


class ThreadLocal(Actor):
    """Keeps a counter in thread-local storage made in ``__init__``."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.local.count = 0

    @endpoint
    def incr(self) -> tuple[int, int]:
        self.local.count += 1
        return self.local.count, threading.get_ident()


class AsyncCleanup(Actor):
    """``async def __cleanup__`` that awaits before writing its mark."""

    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0.01)
        with open(f"{self.path}.{context().actor_instance.rank.rank}", "w") as f:
            f.write(f"async cleanup exc={exc!r}")


class CancelledThenCleanup(Actor):
    """A concurrent endpoint that waits forever; stop cancels it, then cleanup runs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.release = asyncio.Event()

    def _log(self, line: str) -> None:
        with open(self.path, "a") as f:
            f.write(line + "\n")

    @concurrent_endpoint(explicit_response_port=True)
    async def wait(self, port: Port[str]) -> None:
        port.send("started")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self._log("cancelled")
            raise

    async def __cleanup__(self, exc: BaseException | None) -> None:
        self._log("cleanup")


class Finalized(Actor):
    """Writes a file from ``__del__`` once the actor object is collected."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __del__(self) -> None:
        with open(os.path.join(self.directory, f"del-{os.getpid()}"), "w") as f:
            f.write("del")


class _WritesOnRelease:
    """A resource (an open file) that its ``__del__`` finishes and closes."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w")  # noqa: SIM115  (closed by __del__, the point here)

    def __del__(self) -> None:
        self.file.write("released at exit")
        self.file.close()


_kept_until_exit: _WritesOnRelease | None = None  # a module global, as users keep resources


class KeepsAGlobal(Actor):
    """Keeps an object in a module global (released only when the interpreter
    finalizes) and registers an atexit handler."""

    def __init__(self, directory: str) -> None:
        import atexit

        global _kept_until_exit
        _kept_until_exit = _WritesOnRelease(os.path.join(directory, f"global-{os.getpid()}"))
        atexit.register(_write, os.path.join(directory, f"atexit-{os.getpid()}"))

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write("atexit ran")


class Aborter(Actor):
    @endpoint
    def abort(self, reason: str | None = None) -> str:
        context().actor_instance.abort(reason)
        return "abort requested"

    @endpoint
    def ping(self) -> str:
        return "pong"


class AsyncAborter(Actor):
    @endpoint
    async def abort(self, reason: str | None = None) -> str:
        context().actor_instance.abort(reason)
        return "abort requested"

    @endpoint
    async def ping(self) -> str:
        return "pong"


class ProcInfo(Actor):
    @endpoint
    def info(self) -> dict:
        inst = context().actor_instance
        return {
            "proc_mesh_extent": dict(inst.proc_mesh.extent),
            "proc_extent": dict(inst.proc.extent),
            "rank": dict(inst.rank),
        }


class SyncEndpointsAsyncCleanup(Actor):
    """Refused at spawn, as in Monarch: sync endpoints need a sync ``__cleanup__``."""

    @endpoint
    def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc: BaseException | None) -> None:
        pass


class SyncEndpointsAsyncSupervise(Actor):
    """Refused at spawn, as in Monarch: sync endpoints need a sync ``__supervise__``."""

    @endpoint
    def ping(self) -> str:
        return "pong"

    async def __supervise__(self, failure: Any) -> bool:
        return True


class LocalChildOwner(Actor):
    """Spawns an :class:`AsyncCleanup` child in its own process (``this_proc()``) or on
    the proc mesh it was spawned on: stopping the owner stops that child first."""

    @endpoint
    def spawn_here(self, path: str) -> str:
        from monarch.actor import this_proc

        self.child = this_proc().spawn("local_child", AsyncCleanup, path)
        return self.child.ping.call_one().get(timeout=30)

    @endpoint
    def spawn_on_own_procs(self, path: str) -> list:
        procs = context().actor_instance.proc_mesh
        self.child = procs.spawn("sibling_child", AsyncCleanup, path)
        return list(self.child.ping.call().get(timeout=30).values())
