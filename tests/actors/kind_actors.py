"""Actors for the tests of what kind an actor is, what it is called, and where it runs
(importable by procs)."""

from __future__ import annotations

import io
import logging
import os
import threading

from monarch.actor import Actor, Port, context, endpoint


class MixedKinds(Actor):
    """A sync and an async endpoint on one class: refused at spawn, as in Monarch."""

    @endpoint
    def plain(self) -> int:
        return 1

    @endpoint
    async def coroutine(self) -> int:
        return 2


class AsyncWithSyncCleanup(Actor):
    """Async endpoints with a plain ``__cleanup__``: refused at spawn, as in Monarch."""

    @endpoint
    async def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: BaseException | None) -> None:
        pass


class AsyncThreadLocal(Actor):
    """Keeps state in a thread-local made in ``__init__`` and reads it in async endpoints."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.local.value = 0
        self.init_thread = threading.get_ident()

    @endpoint
    async def incr(self) -> int:
        self.local.value += 1
        return self.local.value

    @endpoint
    async def same_thread_as_init(self) -> bool:
        return threading.get_ident() == self.init_thread


class SyncThreadLocal(Actor):
    """The same with sync endpoints (they run on the actor's own thread)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.local.value = 0
        self.init_thread = threading.get_ident()

    @endpoint
    def incr(self) -> int:
        self.local.value += 1
        return self.local.value

    @endpoint
    def same_thread_as_init(self) -> bool:
        return threading.get_ident() == self.init_thread


def log_text(message: str) -> str:
    """What a handler added now prints for ``message`` logged here (only the message)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("tests.kind_actors.capture")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        logger.error(message)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


class Named(Actor):
    """Says what it is called, who spawned it, and how its log lines start."""

    @endpoint
    def report(self) -> dict:
        me = context().actor_instance
        creator = me.creator
        return {
            "str": str(me),
            "repr": repr(me),
            "name": me.name,
            "class_name": me.class_name,
            "creator": repr(creator),
            "creator_name": creator.name,
            "log": log_text("hello"),
        }

    @endpoint
    def child_report(self) -> dict:
        """Spawn a Named on this actor's proc mesh and return its report."""
        child = context().actor_instance.proc_mesh.spawn("child", Named)
        try:
            return child.slice(gpus=1).report.call_one().get(timeout=60)
        finally:
            child.stop().get(timeout=60)


class Sibling(Actor):
    """Spawns siblings on the proc mesh it was spawned on."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def spawn_siblings(self) -> dict:
        procs = context().actor_instance.proc_mesh
        siblings = procs.spawn("sibling", Sibling)
        try:
            pids = list(siblings.pid.call().get(timeout=60).values())
        finally:
            siblings.stop().get(timeout=60)
        return {"type": type(procs).__name__, "extent": dict(procs.extent), "pids": pids}


class BesideTheClient(Actor):
    """A controller: its proc mesh is the root client's process."""

    @endpoint
    def spawn_beside(self) -> int:
        beside = context().actor_instance.proc_mesh.spawn("beside", Sibling)
        try:
            return beside.pid.call_one().get(timeout=60)
        finally:
            beside.stop().get(timeout=60)


class Ranks(Actor):
    """Answers with its rank in its whole mesh, by return value or through a port."""

    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint(explicit_response_port=True)
    def rank_to_port(self, port: Port) -> None:
        port.send(context().actor_instance.rank.rank)

    @endpoint
    def rank_to_given_port(self, port: Port) -> None:
        port.send(context().actor_instance.rank.rank)


class AsyncSibling(Actor):
    """Spawns siblings on its proc mesh from an async endpoint (on the proc's loop)."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def spawn_siblings(self) -> list[int]:
        siblings = context().actor_instance.proc_mesh.spawn("async_sibling", AsyncSibling)
        try:
            return list((await siblings.pid.call()).values())
        finally:
            await siblings.stop()
