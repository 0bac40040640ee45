"""``RDMABuffer``: a byte region of one process that other processes read and write.

Monarch's semantics: the process that creates an ``RDMABuffer`` owns the
memory; the object is a small handle that can be passed to any actor (in
endpoint arguments and return values, or pickled), and whoever holds it can
``read_into`` local memory from it or ``write_from`` local memory to it,
without the owner's code taking part. Both return a
:class:`~monarch.core.future.Future` of ``None`` (``.get()`` or ``await``).

As in Monarch: the memory is a 1-D contiguous tensor of any dtype (CPU or
CUDA; a contiguous view or slice is fine) or a 1-D contiguous memoryview of
bytes; sizes are in bytes; ``read_into(dst)`` copies the whole buffer into
the first ``size()`` bytes of ``dst`` (ValueError if ``dst`` is smaller) and
``write_from(src)`` copies all of ``src`` to the start of the buffer
(ValueError if it is bigger); the default timeout is 60 s, and a negative one
is an OverflowError.

Beyond Monarch: a bytearray or ``bytes`` (a read-only buffer: writes to it
fail with ReadOnlyBufferError) may be registered too; ``offset=`` reads or
writes part of a buffer (``read_into(dst, offset=k)`` copies exactly
``len(dst)`` bytes from ``k``); a timeout may be a float or None (no limit);
:attr:`RDMABuffer.transport` says which of our transports a transfer uses.

The registration (and a reference keeping the memory alive) lasts until
``drop()``, by the owner or by anyone holding the handle, or until the owner
process exits. It does not end when the owner's Python object is garbage
collected: returning ``RDMABuffer(t)`` from an endpoint is the usual way to
hand memory out.
"""

from __future__ import annotations

from typing import Any

from monarch.broker.bodies.ext import register_ext
from monarch.core.future import Future
from monarch.rdma import transfer
from monarch.rdma.backend import fallback_allowed, monarch_name
from monarch.rdma.handle import BufferHandle
from monarch.rdma.memory import as_memory
from monarch.rdma.owner import current_owner, local_owner
from monarch.rdma.transports import choose_transport

DEFAULT_TIMEOUT = 60.0  # seconds, as in Monarch
BUFFER_EXT = 20


class RDMABuffer:
    """A handle to a registered byte region of its owner process (see the module docstring)."""

    __slots__ = ("_handle",)

    def __init__(self, data: Any) -> None:
        """Register ``data`` (kept alive until ``drop()``) in this process.

        Raises UnsupportedMemoryError (a ValueError, as in Monarch, and a
        TypeError) for anything but a 1-D contiguous tensor (CPU or CUDA),
        a 1-D contiguous memoryview of bytes, a bytearray or bytes,
        ValueError for size 0, and RuntimeError, as Monarch, where there is no
        RDMA hardware and ``monarch.configure(rdma_allow_tcp_fallback=False)``.
        """
        memory = as_memory(data, "RDMABuffer data")
        if memory.size == 0:
            raise ValueError("cannot create an RDMABuffer of size 0")
        if not fallback_allowed():  # Monarch's error and words
            raise RuntimeError(
                "Tried to create an RDMABuffer, but RDMA is not available on this platform "
                "(no ibverbs RDMA hardware, and rdma_allow_tcp_fallback is False). To enable "
                "TCP fallback transport, call monarch.configure(rdma_allow_tcp_fallback=True) "
                "before creating buffers."
            )
        self._handle = local_owner().register(memory)

    @classmethod
    def _from_handle(cls, handle: BufferHandle) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._handle = handle
        return buf

    @property
    def handle(self) -> BufferHandle:
        return self._handle

    def size(self) -> int:
        """The buffer's size in bytes."""
        return self._handle.size

    @property
    def owner(self) -> str:
        """The proc uid of the owning process."""
        return self._handle.owner

    @property
    def backend(self) -> str:
        """Monarch's name for how a transfer from this process moves bytes: ``ibverbs`` or ``tcp``.

        ``tcp`` stands for every fallback (a same-host copy included), as
        Monarch's ``tcp`` does; :attr:`transport` tells them apart.
        """
        return monarch_name(self.transport)

    @property
    def transport(self) -> str:
        """The transport a transfer from this process would use: ``ibverbs``, ``same_host`` or ``tcp``."""
        return choose_transport(self._handle).name

    def read_into(
        self, dst: Any, *, offset: int | None = None, timeout: float | None = DEFAULT_TIMEOUT
    ) -> Future[None]:
        """Copy this buffer into local ``dst``; a Future of None, done once every byte arrived.

        Without ``offset`` (Monarch's form), all ``size()`` bytes go to the
        start of ``dst``, which must be at least that big; the rest of ``dst``
        is left alone. With ``offset``, exactly ``len(dst)`` bytes from
        ``offset`` are copied. A destination that does not fit raises
        ValueError here, before anything moves; one that is not usable memory
        raises UnsupportedMemoryError. The future fails with an
        :class:`~monarch.rdma.errors.RDMAError` (a timeout: ``RDMATimeoutError``).
        """
        memory = as_memory(dst, "read_into destination", need_writable=True)
        start, memory = transfer.read_span(self._handle, memory, offset, "read_into")
        deadline = transfer.deadline_in(timeout)
        return transfer.submit(transfer.read, self._handle, start, memory, deadline)

    def write_from(
        self, src: Any, *, offset: int = 0, timeout: float | None = DEFAULT_TIMEOUT
    ) -> Future[None]:
        """Copy all of local ``src`` into this buffer from ``offset`` (default 0); a Future of None.

        ``src`` must fit (ValueError here otherwise, as in Monarch); the rest
        of the buffer is left alone. The future completes once the owner's
        memory holds every byte, or fails; a failed write may have changed
        part of the range, but is never reported done.
        """
        memory = as_memory(src, "write_from source")
        transfer.check_range(self._handle, offset, memory.size, "write_from", "source")
        transfer.check_writable(self._handle, "write_from")
        deadline = transfer.deadline_in(timeout)
        return transfer.submit(transfer.write, self._handle, offset, memory, deadline)

    def drop(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> Future[None]:
        """Release the registration; later transfers by anyone fail with BufferDroppedError.

        Harmless if already dropped. In the owner it is done before this
        returns; another process asks the owner (the future completes when it has).
        """
        owner = current_owner()
        if owner is not None and owner.owns(self._handle):
            owner.registry.drop(self._handle.buffer_id, self._handle.key)
            return transfer.TransferFuture.from_value(None)
        return transfer.submit(transfer.drop, self._handle, transfer.deadline_in(timeout))

    def __reduce__(self) -> tuple:
        return (RDMABuffer._from_handle, (self._handle,))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RDMABuffer):
            return NotImplemented
        h, o = self._handle, other._handle
        return (h.owner, h.pid, h.buffer_id, h.key) == (o.owner, o.pid, o.buffer_id, o.key)

    def __hash__(self) -> int:
        return hash((self._handle.owner, self._handle.buffer_id))

    def __repr__(self) -> str:
        h = self._handle
        return f"<RDMABuffer {h.size} bytes on {h.device} of {h.owner}, id {h.buffer_id}>"


register_ext(
    BUFFER_EXT,
    RDMABuffer,
    lambda b: b._handle.fields(),
    lambda fields: RDMABuffer._from_handle(BufferHandle.from_fields(fields)),
)
