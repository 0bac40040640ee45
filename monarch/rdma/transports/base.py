"""The one interface every transport implements.

A transport moves bytes between a local CPU memoryview and a remote buffer
named by a :class:`~monarch.rdma.handle.BufferHandle`, synchronously, on the
calling thread (the caller runs it on a worker thread and completes a
future). Ranges were checked by the caller; a transport still refuses
what the owner refuses. ``deadline`` is a ``time.monotonic()`` value: past it,
the transport gives up with :class:`~monarch.rdma.errors.RDMATimeoutError`.

A transport that finds it cannot serve this peer after all (``EPERM`` from
the kernel, a failed queue-pair setup) raises
:class:`~monarch.rdma.errors.TransportDenied`; :func:`~monarch.rdma.transports.run`
then remembers that and uses the next transport.
"""

from __future__ import annotations

from monarch.rdma.handle import BufferHandle


class Transport:
    """Moves bytes to and from remote buffers. Subclasses set ``name``."""

    name: str = ""

    def read(self, handle: BufferHandle, offset: int, dst: memoryview, *, deadline: float) -> None:
        """Copy ``handle``'s bytes ``[offset, offset + len(dst))`` into ``dst``; all or raise."""
        raise NotImplementedError

    def write(self, handle: BufferHandle, offset: int, src: memoryview, *, deadline: float) -> None:
        """Copy ``src`` into ``handle``'s bytes from ``offset``; returns once all of it landed."""
        raise NotImplementedError

    def atomic(
        self, handle: BufferHandle, op: str, offset: int, a: int, b: int = 0, *, deadline: float
    ) -> int:
        """``op`` is ``fetch_add`` (add ``a``) or ``compare_and_swap`` (``a`` expected, ``b`` new)
        on the 8-byte unsigned little-endian word at ``offset``; returns its old value."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections and other resources (the transport stays usable)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
