"""Actors for the failure-semantics tests (importable by procs)."""

from __future__ import annotations

import os

from monarch.actor import Actor, current_rank, endpoint

FATAL = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}


class Fatal(BaseException):
    """Like Monarch's tests' ActorFailureError: a BaseException that is not an Exception."""


FATAL["Fatal"] = Fatal


def _raise(kind: str, rank: int | None, root_rank: int) -> None:
    if rank is None or root_rank == rank:
        raise FATAL[kind](f"{kind} raised on purpose")


class SyncFatal(Actor):
    def __init__(self) -> None:
        self.root_rank = current_rank().rank  # in the whole mesh (a slice's call sees its own)

    @endpoint
    def fatal(self, kind: str, rank: int | None = None) -> None:
        _raise(kind, rank, self.root_rank)

    @endpoint
    def check(self) -> str:
        return "healthy"

    @endpoint
    def exit_process(self) -> None:
        os._exit(7)


class AsyncFatal(Actor):
    def __init__(self) -> None:
        self.root_rank = current_rank().rank

    @endpoint
    async def fatal(self, kind: str, rank: int | None = None) -> None:
        _raise(kind, rank, self.root_rank)

    @endpoint
    async def check(self) -> str:
        return "healthy"


class InitFails(Actor):
    def __init__(self) -> None:
        raise RuntimeError("an exception from __init__")

    @endpoint
    def check(self) -> str:
        return "unreachable"


class Leaf(Actor):
    @endpoint
    def boom(self, message: str) -> None:
        raise ValueError(message)


class Relay(Actor):
    """Calls a leaf and lets its ActorError escape: a nested call's error."""

    def __init__(self, leaf) -> None:
        self.leaf = leaf

    @endpoint
    def relay(self, message: str) -> None:
        self.leaf.slice(gpus=0).boom.call_one(message).get(timeout=60)

    @endpoint
    def check(self) -> str:
        return "healthy"


class CleanupExits(SyncFatal):
    """Its ``__cleanup__`` raises SystemExit: the proc must not go down with it."""

    def __cleanup__(self, exc) -> None:
        raise SystemExit("cleanup exits")


class SuperviseExits(Actor):
    """Owns a mesh whose failure its ``__supervise__`` answers with SystemExit."""

    def __init__(self) -> None:
        from monarch.actor import this_host

        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.child = self.procs.spawn("doomed_child", SyncFatal)

    @endpoint
    def break_child(self) -> None:
        self.child.fatal.broadcast("Fatal")

    def __supervise__(self, failure) -> bool:
        raise SystemExit("supervise exits")


class HandlesInitFailure(Actor):
    """Owns a 2-rank mesh whose ``__init__`` fails; handles each failure it is offered."""

    def __init__(self) -> None:
        from monarch.actor import this_host

        self.seen: list = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.child = self.procs.spawn("kid", InitFails)

    def __supervise__(self, failure) -> bool:
        self.seen.append((failure.mesh_name, failure.ranks, failure.reason, str(failure)))
        return True

    @endpoint
    def offered(self) -> list:
        return self.seen


class AwaitsWhileItsChildFails(Actor):
    """Async owner that leaves its child's failure unhandled while one of its
    endpoints is still awaiting (it would await for 300 s)."""

    def __init__(self) -> None:
        from monarch.actor import context

        self.child = context().actor_instance.proc_mesh.spawn("doomed_child", AsyncFatal)

    def __supervise__(self, failure) -> bool:  # noqa: ANN001
        return False

    @endpoint
    async def fail_child_then_wait(self) -> str:
        import asyncio

        from monarch.actor import SupervisionError

        try:
            await self.child.fatal.call("Fatal")
        except SupervisionError:
            pass
        await asyncio.sleep(300)
        return "returned"


def slow_failing_bootstrap() -> None:
    """A proc mesh's ``bootstrap`` that fails after a second: spawns asked for meanwhile
    wait for a start that then fails."""
    import time

    time.sleep(1.0)
    raise RuntimeError("no scratch disk on this proc")
