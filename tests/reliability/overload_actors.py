"""Actors for the overload tests (importable by procs)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from monarch.actor import Actor, Channel, Port, endpoint
from monarch.actors.process_state import actor_process
from monarch.core.process_runtime import runtime


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


class StalledReceiver(Actor):
    """Like :class:`StalledSink`, and it reads numbered messages (mesh sends and a port
    of its own), checking that each sender's arrive in order."""

    def __init__(self) -> None:
        self.seen = 0
        self.nbytes = 0
        self.in_order = True
        self.receiver = None

    @endpoint
    async def stall(self, seconds: float) -> None:
        time.sleep(seconds)  # on the loop, on purpose: the proc reads nothing meanwhile

    @endpoint
    async def take(self, i: int, data: bytes) -> None:
        self.in_order = self.in_order and i == self.seen
        self.seen += 1
        self.nbytes += len(data)

    @endpoint
    async def open_port(self) -> Port:
        port, self.receiver = Channel.open()
        return port

    @endpoint
    async def count(self) -> tuple:
        """(seen, nbytes, in_order) of the mesh messages so far (answered in mailbox order:
        an endpoint that waited for more would hold up the very messages it waits for)."""
        return self.seen, self.nbytes, self.in_order

    @endpoint
    async def drain(self, n: int, timeout: float) -> tuple:
        """(seen, nbytes, in_order) of the first ``n`` values sent to the port: (i, data)."""
        seen, nbytes, in_order = 0, 0, True
        deadline = time.monotonic() + timeout
        while seen < n:
            try:
                i, data = await asyncio.wait_for(
                    self.receiver.recv(), max(0.01, deadline - time.monotonic())
                )
            except asyncio.TimeoutError:
                break
            in_order = in_order and i == seen
            seen += 1
            nbytes += len(data)
        return seen, nbytes, in_order


class SharedReceiver(StalledReceiver):
    """A :class:`StalledReceiver` for several senders: each numbers its own messages."""

    def __init__(self) -> None:
        super().__init__()
        self.next: dict[int, int] = {}  # sender -> the number its next message must have

    @endpoint
    async def take_from(self, sender: int, i: int, data: bytes) -> None:
        self.in_order = self.in_order and i == self.next.get(sender, 0)
        self.next[sender] = i + 1
        self.seen += 1
        self.nbytes += len(data)


class Flooder(Actor):
    """Sends from an async endpoint, that is from its proc's event loop, which must not
    block: over the window, its messages wait in its process (FlowControl.hold)."""

    @endpoint
    async def flood(self, mesh: Any, n: int, size: int) -> int:
        payload = b"x" * size
        for i in range(n):
            mesh.take.broadcast(i, payload)
        return getattr(mesh._state.flow, "holds", 0)

    @endpoint
    async def flood_port(self, port: Port, n: int, size: int) -> int:
        payload = b"x" * size
        for i in range(n):
            port.send((i, payload))
        flows = getattr(actor_process(runtime()), "port_flows", None)
        return flows.get(port.subject).holds if flows is not None else 0

    @endpoint
    async def flood_from(self, mesh: Any, me: int, start: int, n: int, size: int) -> int:
        """Send ``take_from(me, i, ...)`` for i in start..start+n; the flow window now."""
        payload = b"x" * size
        for i in range(start, start + n):
            mesh.take_from.broadcast(me, i, payload)
        return mesh._state.flow.window
