"""Actors for tests/compat/test_torchtitan_names.py (importable by the procs that host them)."""

from __future__ import annotations

import asyncio
import os

import cloudpickle

from monarch.actor import Actor, Channel, concurrent_endpoint, current_rank, current_size


class RolePeer(Actor):
    """Reports its launch env, hands out a port as bytes, sends on one, and waits on its receiver."""

    def __init__(self) -> None:
        self.receiver = None
        self.gate = asyncio.Event()

    @concurrent_endpoint
    async def env(self, names: list[str]) -> dict[str, str | None]:
        return {n: os.environ.get(n) for n in names}

    @concurrent_endpoint
    async def open_port_as_bytes(self) -> bytes:
        port, self.receiver = Channel.open()
        return cloudpickle.dumps(port)

    @concurrent_endpoint
    async def send_through(self, port_bytes: bytes, value: object) -> None:
        cloudpickle.loads(port_bytes).send(value)

    @concurrent_endpoint
    async def next_received(self) -> object:
        return await self.receiver.recv()

    @concurrent_endpoint
    async def wait_for_gate(self) -> str:
        await self.gate.wait()
        return f"released {current_rank().rank}"

    @concurrent_endpoint
    async def open_gate(self) -> None:
        self.gate.set()

    @concurrent_endpoint
    async def all_reduce_rank(self) -> float:
        return await asyncio.to_thread(self._all_reduce_rank)

    def _all_reduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            t = torch.tensor([float(dist.get_rank())])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()


class SingletonCheck(Actor):
    """Counts the actors of its mesh at construction, as a singleton router does."""

    def __init__(self) -> None:
        self.size = dict(current_size())

    @concurrent_endpoint
    async def mesh_size(self) -> dict[str, int]:
        return self.size
