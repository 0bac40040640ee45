"""Actor classes for the API tests (importable by procs)."""

from __future__ import annotations

import asyncio
import os
import time

from monarch.actor import (
    Actor,
    Channel,
    Port,
    concurrent_endpoint,
    context,
    current_actor_name,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start
        self.pid = os.getpid()

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def where(self) -> tuple:
        return (os.getpid(), context().actor_instance.actor_id)


class Spawner(Actor):
    """Starts its own procs and actors from an endpoint: it owns them."""

    @endpoint
    def spawn_and_call(self, n: int) -> list:
        procs = this_host().spawn_procs(per_host={"workers": n})
        workers = procs.spawn("inner", Counter, 10)
        values = list(workers.incr.call(5).get(timeout=60).values())
        pids = [pid for pid, _ in workers.where.call().get(timeout=60).values()]
        procs.stop().get(timeout=60)
        return [values, pids, os.getpid()]

    @endpoint
    def local_actor(self) -> list:
        # An actor spawned next to this one, in the same process.
        sibling = context().actor_instance.proc.spawn("sibling", Counter, 1)
        return [
            sibling.incr.call_one().get(timeout=30),
            sibling.where.call_one().get(timeout=30)[0],
        ]


class Replier(Actor):
    @endpoint(explicit_response_port=True)
    def twice(self, port: Port, x: int) -> None:
        port.send(x)
        # only the first send counts for a call; the endpoint may finish later
        port.send(x * 100)

    @endpoint
    def tell(self, port: Port, value) -> None:
        port.send(value)

    @endpoint
    def tell_error(self, port: Port, message: str) -> None:
        port.exception(KeyError(message))

    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    def plain(self, x: int) -> int:
        return x + 1000


class Concurrent(Actor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.started: list[int] = []

    @concurrent_endpoint
    async def slow(self, i: int, delay: float) -> int:
        self.started.append(i)
        await asyncio.sleep(delay)
        return i

    @endpoint
    async def started_order(self) -> list:
        return self.started

    @concurrent_endpoint
    async def forever(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            with open(self.path, "a") as f:
                f.write("cancelled\n")
            raise

    async def __cleanup__(self, exc) -> None:
        with open(self.path, "a") as f:
            f.write("cleanup\n")


class Lifecycle(Actor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.handled = 0

    @endpoint
    def work(self, delay: float) -> None:
        time.sleep(delay)
        self.handled += 1

    @endpoint
    def info(self) -> dict:
        inst = context().actor_instance
        self.logger.info("info called")
        return {
            "actor_id": inst.actor_id,
            "name": inst.name,
            "rank": inst.rank.rank,
            "proc": repr(inst.proc),
            "current_actor_name": current_actor_name(),
            "logger": self.logger.name,
        }

    @endpoint
    def stop_self(self) -> str:
        context().actor_instance.stop()
        return "stopping"

    @endpoint
    def stuck(self) -> None:
        time.sleep(600)

    def __cleanup__(self, exc) -> None:
        with open(self.path, "a") as f:
            f.write(f"cleanup handled={self.handled} exc={exc!r}\n")


class ControllerUser(Actor):
    @endpoint
    def controller_id(self) -> str:
        ctrl = get_or_spawn_controller("shared_counter", Counter, 0).get(timeout=60)
        ctrl.incr.call_one().get(timeout=60)
        return ctrl.where.call_one().get(timeout=60)[1]


class PortPasser(Actor):
    """Receives a port from the client and answers through it from another actor."""

    def __init__(self, peer) -> None:
        self.peer = peer

    @endpoint
    def forward(self, port: Port, value) -> None:
        self.peer.tell.broadcast(port, value)


def open_channel_in_actor() -> tuple:
    return Channel.open()


__all__ = ["this_proc"]
