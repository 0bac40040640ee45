"""Local memory that the rdma layer reads from or writes into, checked once.

``as_memory(obj)`` accepts what Monarch's RDMABuffer accepts: a 1-D
contiguous ``torch.Tensor`` of any dtype (CPU, or CUDA when torch has it;
views and slices included, as long as they are contiguous), or a 1-D
C-contiguous memoryview of one-byte items; and, beyond Monarch, a bytearray,
or ``bytes`` (read-only). Sizes and offsets are always in bytes
(``numel() * element_size()`` for a tensor). Anything else is an
:class:`~monarch.rdma.errors.UnsupportedMemoryError` (a ``ValueError``, as in
Monarch, and a ``TypeError``) that says how to get there. The result knows
the memory's address and size and keeps the owning object alive.

torch is never imported here: a tensor can only be one if torch is loaded
already, so byte buffers work in processes that never import it.

Transports only move bytes between CPU memoryviews; CUDA memory is staged
through a CPU copy here (:meth:`Memory.cpu_view` / :meth:`Memory.commit`).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from monarch.broker.bodies.buffers import buffer_address
from monarch.rdma.errors import UnsupportedMemoryError

_HINT = (
    "pass a 1-D contiguous tensor (t.contiguous().view(-1), or t.view(torch.uint8).flatten() "
    "for its bytes) or a 1-D contiguous memoryview of bytes (memoryview(x).cast('B'))"
)


def view_at(addr: int, size: int) -> memoryview:
    """A writable byte view of ``size`` bytes at ``addr`` (the caller keeps the memory alive)."""
    return memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")


class Memory:
    """A checked region of local memory: address, size, device, and what keeps it alive."""

    __slots__ = ("obj", "addr", "size", "device", "writable", "_view")

    def __init__(
        self, obj: Any, addr: int, size: int, device: str, writable: bool, view: memoryview | None
    ) -> None:
        self.obj, self.addr, self.size = obj, addr, size
        self.device, self.writable, self._view = device, writable, view

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    def view(self) -> memoryview:
        """The bytes as a memoryview (CPU memory only)."""
        if self._view is None:
            self._view = view_at(self.addr, self.size) if self.size else memoryview(b"")
        return self._view

    def cpu_view(self, start: int = 0, stop: int | None = None, *, fill: bool = True) -> memoryview:
        """CPU bytes for ``[start, stop)``: the memory itself, or a staged copy of CUDA memory.

        ``fill=False`` skips copying device bytes into the staging area (when
        the caller is about to overwrite it and then :meth:`commit`).
        """
        stop = self.size if stop is None else stop
        if self.is_cpu:
            return self.view()[start:stop]
        import torch

        staged = torch.empty(stop - start, dtype=torch.uint8)  # pageable: copies are synchronous
        if fill:
            staged.copy_(self.obj[start:stop])
        return memoryview(staged.numpy())

    def head(self, size: int) -> Memory:
        """The first ``size`` bytes of this memory (``size`` <= ``self.size``)."""
        if size == self.size:
            return self
        if self.is_cpu:
            return Memory(self.obj, self.addr, size, self.device, self.writable, self.view()[:size])
        return Memory(self.obj[:size], self.addr, size, self.device, self.writable, None)

    def commit(self, start: int, staged: memoryview) -> None:
        """Copy ``staged`` (from :meth:`cpu_view` with ``fill=False``) back to device memory."""
        if self.is_cpu:
            return
        import torch

        src = torch.frombuffer(staged, dtype=torch.uint8)
        self.obj[start : start + len(staged)].copy_(src)
        torch.cuda.synchronize(self.obj.device)

    def __repr__(self) -> str:
        return f"<Memory {self.size} bytes on {self.device} at {self.addr:#x}>"


def as_memory(obj: Any, what: str = "memory", *, need_writable: bool = False) -> Memory:
    """Check ``obj`` and describe its bytes; UnsupportedMemoryError (saying what to do) if unusable."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor_memory(torch, obj, what)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        view = obj if isinstance(obj, memoryview) else memoryview(obj)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise UnsupportedMemoryError(
                f"{what} must be a torch.Tensor, memoryview, bytearray or bytes, not "
                f"{type(obj).__name__}: {_HINT}"
            ) from None
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
        raise UnsupportedMemoryError(
            f"{what} must be 1-D, contiguous, one byte per item (got ndim={view.ndim}, "
            f"itemsize={view.itemsize}, contiguous={view.c_contiguous}): {_HINT}"
        )
    if need_writable and view.readonly:
        raise UnsupportedMemoryError(
            f"{what} is read-only; it must be writable (a bytearray, not bytes)"
        )
    view = view.cast("B") if view.format != "B" else view
    addr = buffer_address(view) if view.nbytes else 0
    return Memory(obj, addr, view.nbytes, "cpu", not view.readonly, view)


def _tensor_memory(torch: Any, t: Any, what: str) -> Memory:
    if t.layout != torch.strided or t.is_meta or t.is_quantized:
        kind = "meta" if t.is_meta else "quantized" if t.is_quantized else str(t.layout)
        raise UnsupportedMemoryError(f"{what}: a {kind} tensor has no plain bytes to use: {_HINT}")
    if t.dim() != 1 or not t.is_contiguous():
        raise UnsupportedMemoryError(
            f"{what} must be a 1-D contiguous tensor, got shape={tuple(t.shape)}, "
            f"stride={tuple(t.stride())}, contiguous={t.is_contiguous()}: {_HINT}"
        )
    if t.is_conj() or t.is_neg():
        raise UnsupportedMemoryError(
            f"{what}: a lazily conjugated or negated tensor's memory does not hold its values; "
            "call t.resolve_conj() / t.resolve_neg() first"
        )
    device = t.device.type if t.device.index is None else f"{t.device.type}:{t.device.index}"
    if t.device.type not in ("cpu", "cuda"):
        raise UnsupportedMemoryError(
            f"{what}: tensors on {device} are not supported (CPU and CUDA are)"
        )
    # The bytes of the tensor, whatever its dtype (a view: same storage, kept alive with it).
    data = t.detach().view(torch.uint8) if t.dtype != torch.uint8 else t.detach()
    return Memory(data, t.data_ptr(), data.numel(), device, True, None)
