"""Actors for the broker-node death tests (importable by procs)."""

from __future__ import annotations

import asyncio
import os
import time

from monarch.actor import Actor, context, endpoint
from monarch.actors.hosting.server import local_server
from monarch.actors.process_state import actor_process
from monarch.broker.vocabulary import subjects
from monarch.core.process_runtime import runtime


class Counter(Actor):
    """Counts what it handled; says which broker node its proc is connected to."""

    def __init__(self) -> None:
        self.handled = 0

    @endpoint
    def ping(self, i: int) -> int:
        self.handled += 1
        return i

    @endpoint
    def incr(self) -> None:
        self.handled += 1

    @endpoint
    def count(self) -> int:
        return self.handled

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def node_port(self) -> int:
        return runtime().nc.connected_url.port

    @endpoint
    def replies_resent(self) -> int:
        return actor_process(runtime()).replies.resent

    @endpoint
    def slow(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @endpoint
    def deafen(self) -> str:
        """Stop hearing messages sent to the whole mesh (still hear those for this rank):
        from then on, a whole-mesh call never reaches this actor, as if lost on the way."""
        me = context().actor_instance
        inst = local_server(runtime()).find(me.actor_id)
        whole = subjects.actor(
            runtime().namespace, inst.name, inst.uid, [subjects.WILDCARD] * len(inst.extent.sizes)
        )
        for sub in [s for s in inst.subscriptions if s.subject == whole]:
            inst.subscriptions.remove(sub)
            # on the proc's loop (nats-py is not thread-safe); this sync endpoint waits for it
            asyncio.run_coroutine_threadsafe(sub.unsubscribe(), runtime().loop).result(30)
        return whole

    @endpoint
    def drop_whole_mesh_messages(self, n: int) -> None:
        """Let the next ``n`` messages sent to the whole mesh vanish before this actor
        sees them (as if lost with a broker node), then hear them again."""
        me = context().actor_instance
        inst = local_server(runtime()).find(me.actor_id)
        whole = subjects.actor(
            runtime().namespace, inst.name, inst.uid, [subjects.WILDCARD] * len(inst.extent.sizes)
        )
        left = [n]

        def deliver(msg):  # type: ignore[no-untyped-def]
            if left[0] > 0:
                left[0] -= 1
                return
            inst.deliver(msg)

        async def swap() -> None:
            for sub in [s for s in inst.subscriptions if s.subject == whole]:
                inst.subscriptions.remove(sub)
                await sub.unsubscribe()
            inst.subscriptions.append(await runtime().subscribe_mesh(whole, deliver))

        asyncio.run_coroutine_threadsafe(swap(), runtime().loop).result(30)
