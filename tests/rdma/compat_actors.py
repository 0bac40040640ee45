"""Actors for the Monarch-compatibility tests of ``monarch.rdma`` (importable by procs).

They use buffers the way Monarch 0.7's own tests and examples do: async
endpoints that ``await buf.read_into(t)`` / ``await buf.write_from(t)`` with
tensors of any dtype, and ``RDMAAction`` in Monarch's argument order.
torch is imported inside the methods (see ``rdma_actors``: not on a proc's
event loop when the class is resolved).
"""

from __future__ import annotations

from typing import Any

from monarch.actor import Actor, endpoint
from monarch.rdma import RDMAAction, RDMABuffer


def as_bytes(t: Any) -> bytes:
    """A tensor's bytes, whatever its dtype."""
    import torch

    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


def sample(dtype_name: str, numel: int, seed: int = 0) -> Any:
    """A tensor of ``numel`` elements of the named dtype, whose bytes depend on ``seed``."""
    import torch

    dtype = getattr(torch, dtype_name)
    raw = ((torch.arange(numel, dtype=torch.int64) * 5 + seed) % 13).to(torch.float32)
    if dtype == torch.bool:
        return raw.remainder(2).to(torch.bool)
    if dtype.is_complex:
        return torch.complex(raw, -raw).to(dtype)
    return raw.to(dtype)


class CompatPeer(Actor):
    """Owns tensors of any dtype behind RDMABuffers, and reads or writes other buffers."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    async def make(self, name: str, values: list[float], dtype_name: str = "float32") -> RDMABuffer:
        """Register a 1-D tensor of ``values`` (Monarch's ``RDMABuffer(t)`` on a float tensor)."""
        import torch

        self.tensors[name] = torch.tensor(values, dtype=getattr(torch, dtype_name))
        self.buffers[name] = RDMABuffer(self.tensors[name])
        return self.buffers[name]

    @endpoint
    async def contents(self, name: str) -> list[float]:
        return self.tensors[name].tolist()

    @endpoint
    async def read_bytes(self, buf: RDMABuffer, dtype_name: str, numel: int) -> bytes:
        """Read ``buf`` into a fresh tensor of that dtype and size; its bytes."""
        import torch

        dst = torch.zeros(numel, dtype=getattr(torch, dtype_name))
        assert await buf.read_into(dst) is None
        return as_bytes(dst)

    @endpoint
    async def read_floats(self, buf: RDMABuffer, n: int, fill: float) -> list[float]:
        """Read ``buf`` into ``n`` float32 slots that start as ``fill``."""
        import torch

        dst = torch.full((n,), fill, dtype=torch.float32)
        await buf.read_into(dst)
        return dst.tolist()

    @endpoint
    async def write_sample(self, buf: RDMABuffer, dtype_name: str, numel: int, seed: int) -> None:
        await buf.write_from(sample(dtype_name, numel, seed))

    @endpoint
    async def write_floats(self, buf: RDMABuffer, values: list[float]) -> Any:
        """Write float32 ``values`` into ``buf``; what awaiting the write gave."""
        import torch

        return await buf.write_from(torch.tensor(values, dtype=torch.float32))

    @endpoint
    async def awaited_values(self, remote: RDMABuffer) -> list[Any]:
        """What each public operation resolves to, as Monarch's tests check (all None there)."""
        readback = bytearray(remote.size())
        own = RDMABuffer(memoryview(bytearray(b"own buffer")))
        return [
            await remote.read_into(memoryview(readback)),
            await remote.write_from(memoryview(bytes(readback[::-1]))),
            await RDMAAction().submit(),
            await RDMAAction().read_remote(memoryview(readback), remote).submit(),
            await own.drop(),
            await own.drop(),
        ]

    @endpoint
    async def batch(
        self, read_from: list[RDMABuffer], write_to: list[RDMABuffer], n: int
    ) -> list[list[float]]:
        """One RDMAAction in Monarch's order: read each of ``read_from`` into local float32
        slots, write slots of 7s into each of ``write_to``; the read slots."""
        import torch

        slots = [torch.zeros(n, dtype=torch.float32) for _ in read_from]
        sevens = torch.full((n,), 7.0, dtype=torch.float32)
        action = RDMAAction()
        for slot, buf in zip(slots, read_from):
            action.read_remote(slot, buf)
        for buf in write_to:
            action.write_remote(buf, sevens)
        assert await action.submit() is None
        return [s.tolist() for s in slots]
