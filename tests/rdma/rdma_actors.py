"""Actor classes for the rdma tests (importable by procs, so they travel by reference).

torch is imported inside functions, not here: a proc imports this module on its
event loop when it resolves the class, and importing torch there (seconds on a
busy machine) would stall the proc's heartbeats past MONARCH_HEARTBEAT_TIMEOUT.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from monarch.actor import Actor, endpoint
from monarch.rdma import RDMAAction, RDMABuffer

if TYPE_CHECKING:
    import torch


def pattern(n: int, seed: int = 0) -> torch.Tensor:
    """Position-dependent bytes (byte i is (i * 7 + seed) % 251), cheap to check anywhere."""
    import torch

    return ((torch.arange(n, dtype=torch.int64) * 7 + seed) % 251).to(torch.uint8)


def checksum(t: torch.Tensor) -> int:
    """A cheap position-sensitive-enough sum: 8 bytes at a time as int64 (wrapping), then the tail."""
    import torch

    body = t.numel() - t.numel() % 8
    return int(t[:body].view(torch.int64).sum()) + int(t[body:].sum())


class BufferOwner(Actor):
    """Owns buffers in its proc and uses buffers owned elsewhere."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    def set_transport(self, name: str | None) -> None:
        if name is None:
            os.environ.pop("MONARCH_RDMA_TRANSPORT", None)
        else:
            os.environ["MONARCH_RDMA_TRANSPORT"] = name

    @endpoint
    def make(self, name: str, size: int, seed: int = 0, device: str = "cpu") -> RDMABuffer:
        self.tensors[name] = pattern(size, seed).to(device)
        self.buffers[name] = RDMABuffer(self.tensors[name])
        return self.buffers[name]

    @endpoint
    def contents(self, name: str) -> torch.Tensor:
        return self.tensors[name].clone()

    @endpoint
    def drop(self, name: str) -> None:
        self.buffers[name].drop().get(timeout=30)

    @endpoint
    def read(self, buf: RDMABuffer, offset: int, n: int) -> bytes:
        dst = bytearray(n)
        buf.read_into(dst, offset=offset).get(timeout=30)
        return bytes(dst)

    @endpoint
    def write(self, buf: RDMABuffer, data: bytes, offset: int) -> None:
        buf.write_from(data, offset=offset).get(timeout=30)

    @endpoint
    def read_error(self, buf: RDMABuffer) -> str:
        try:
            buf.read_into(bytearray(buf.size())).get(timeout=30)
        except Exception as e:
            return type(e).__name__
        return "no error"

    @endpoint
    def transport(self, buf: RDMABuffer) -> str:
        return buf.transport

    @endpoint
    def add_many(self, buf: RDMABuffer, times: int) -> list[int]:
        """``times`` separate fetch_add(1) on word 0; the old values seen."""
        return [RDMAAction().fetch_add(buf, 0, 1).submit().get(timeout=30)[0] for _ in range(times)]

    @endpoint
    def summary(self, t: torch.Tensor, picks: list[int]) -> tuple[int, int, list[int]]:
        """(numel, checksum, bytes at picks) of a tensor argument: checks a big one cheaply."""
        return t.numel(), checksum(t), [int(t[i]) for i in picks]

    @endpoint
    def big(self, n: int, seed: int) -> torch.Tensor:
        return pattern(n, seed)


class AsyncSummary(Actor):
    """Reads a tensor argument in an async endpoint (its bytes are fetched on the loop)."""

    @endpoint
    async def asummary(self, t: torch.Tensor) -> tuple[int, int]:
        return t.numel(), checksum(t)


class BigInit(Actor):
    """Takes a big __init__ argument and sends big values through a port."""

    def __init__(self, blob: bytes) -> None:
        self.n = len(blob)

    @endpoint
    def init_len(self) -> int:
        return self.n

    @endpoint
    def send_big(self, port, n: int) -> None:
        port.send(b"b" * n)

    @endpoint
    def send_small(self, port) -> None:
        port.send(b"s")
