"""Actors and values for the port-flood tests (importable by procs)."""

from __future__ import annotations

import asyncio
import dataclasses

import torch

from monarch.actor import Actor, Channel, Port, endpoint

UNPICKLED: list[int] = []  # in each process: the Counted values it has unpickled, in order


def _unpickle_counted(i: int) -> Counted:
    UNPICKLED.append(i)
    return Counted(i)


@dataclasses.dataclass
class Counted:
    """A value that travels by pickle and notes, where it is read, that it was."""

    i: int

    def __reduce__(self) -> tuple:
        return _unpickle_counted, (self.i,)


@dataclasses.dataclass
class Rollout:
    """As Monarch's grpo_yield.py example sends: a few small tensors, by pickle."""

    state: torch.Tensor
    actions: torch.Tensor
    logps: torch.Tensor


class Sender(Actor):
    @endpoint
    async def send_counted(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send(Counted(i))


class Generator(Actor):
    """Streams rollouts into a port as fast as it can until drained, then sends None."""

    def __init__(self, out: Port) -> None:
        self.out = out
        self.task: asyncio.Task | None = None

    @endpoint
    async def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self.out.send(Rollout(torch.randn(4), torch.randint(0, 2, (8,)), torch.randn(8)))
            await asyncio.sleep(0)

    @endpoint
    async def drain(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.out.send(None)


class Scorer(Actor):
    """Reads rollouts until the first None; says how many it read."""

    def __init__(self) -> None:
        self.port, self.recv = Channel.open()

    @endpoint
    async def port_(self) -> Port:
        return self.port

    @endpoint
    async def run(self, first: int, started: Port) -> int:
        n = 0
        while True:
            r = await self.recv.recv()
            if r is None:
                return n
            n += 1
            if n == first:
                started.send(n)
