"""Blocking transfers on a handle, and the worker threads that turn them into futures.

This is where what every operation shares lives: the range check (a
ValueError at the caller, before anything moves), staging of CUDA memory
through CPU, choosing the transport (with fallback), and the pool of
worker threads whose results complete :class:`~monarch.core.future.Future`
objects, so callers can ``.get()`` or ``await`` them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from monarch.core.future import Future
from monarch.rdma import protocol as p
from monarch.rdma import transports
from monarch.rdma.errors import BufferDroppedError, ReadOnlyBufferError
from monarch.rdma.handle import BufferHandle
from monarch.rdma.memory import Memory
from monarch.rdma.owner import current_owner

T = TypeVar("T")
WORKERS = 8  # transfers in flight at once per process (they mostly wait in system calls)

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="monarch-rdma")
    return _executor


class TransferFuture(Future[T]):
    """A :class:`Future` that raises a transfer's own ``TimeoutError`` as itself.

    ``Future.get`` turns any ``TimeoutError`` out of its concurrent future
    into "not done after N s", and on Python 3.11+ that includes a future
    *completed* with a TimeoutError (``concurrent.futures.TimeoutError`` is
    ``TimeoutError``), so an ``RDMATimeoutError`` would read as a wait that
    ran out. This tells the two apart; ``await`` needs no help.
    """

    __slots__ = ()

    def get(self, timeout: float | None = None) -> T:
        try:
            return super().get(timeout)
        except TimeoutError:
            if self._cf.done() and self._cf.exception() is not None:
                raise self._cf.exception() from None
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except BaseException as e:
            if self._cf.done():
                return e
            raise
        return None


def submit(fn: Callable[..., T], *args: Any) -> TransferFuture[T]:
    """Run ``fn(*args)`` on a worker thread; a Future of its result."""
    return TransferFuture(executor().submit(fn, *args))


def deadline_in(timeout: float | None) -> float:
    return time.monotonic() + (1e9 if timeout is None else check_timeout(timeout))


def check_timeout(timeout: Any) -> float:
    """``timeout`` in seconds, checked: a negative one is an OverflowError, as in Monarch."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if timeout < 0:
        raise OverflowError(f"timeout must not be negative, got {timeout}")
    return float(timeout)


def check_range(handle: BufferHandle, offset: Any, length: int, what: str, role: str = "") -> None:
    """``[offset, offset + length)`` must lie in the buffer (``role``: whose local size it is)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"{what}: offset must be an int, not {type(offset).__name__}")
    if offset < 0 or offset + length > handle.size:
        local = (
            f"{role} local memory size ({length}) at offset {offset} does not fit: " if role else ""
        )
        raise ValueError(
            f"{what}: {local}bytes [{offset}, {offset + length}) are outside "
            f"{handle.describe()}, whose valid range is [0, {handle.size})"
        )


def check_holds_all(handle: BufferHandle, length: int, what: str) -> None:
    """Monarch's read rule: the destination must hold the whole buffer."""
    if length < handle.size:
        raise ValueError(
            f"{what}: destination local memory size ({length}) must be >= remote buffer size "
            f"({handle.size}) of {handle.describe()}; pass offset= to read part of it"
        )


def read_span(handle: BufferHandle, dst: Memory, offset: Any, what: str) -> tuple[int, Memory]:
    """Where a read starts and the local memory it fills, checked.

    Monarch's form (``offset`` None): the whole buffer, into the first
    ``size()`` bytes of ``dst``, which must hold that many. With an
    ``offset``: exactly ``len(dst)`` bytes from ``offset``, which must fit.
    """
    if offset is None:
        check_holds_all(handle, dst.size, what)
        return 0, dst.head(handle.size)
    check_range(handle, offset, dst.size, what, "destination")
    return offset, dst


def check_writable(handle: BufferHandle, what: str) -> None:
    if not handle.writable:
        raise ReadOnlyBufferError(f"{what}: {handle.describe()} is read-only")


def read(handle: BufferHandle, offset: int, dst: Memory, deadline: float) -> None:
    """Blocking: copy the remote ``[offset, offset + dst.size)`` into ``dst``."""
    if not dst.size:
        return
    view = dst.cpu_view(fill=False)
    transports.run(handle, lambda t: t.read(handle, offset, view, deadline=deadline))
    dst.commit(0, view)


def write(handle: BufferHandle, offset: int, src: Memory, deadline: float) -> None:
    """Blocking: copy ``src`` into the remote buffer from ``offset``; returns once it all landed."""
    if not src.size:
        return
    view = src.cpu_view()
    transports.run(handle, lambda t: t.write(handle, offset, view, deadline=deadline))


def atomic(handle: BufferHandle, op: str, offset: int, a: int, b: int, deadline: float) -> int:
    """Blocking: an 8-byte atomic on the remote buffer; the old value."""
    return transports.run(handle, lambda t: t.atomic(handle, op, offset, a, b, deadline=deadline))


def drop(handle: BufferHandle, deadline: float) -> None:
    """Blocking: release the registration (locally if we own it, else by asking the owner)."""
    owner = current_owner()
    if owner is not None and owner.owns(handle):
        owner.registry.drop(handle.buffer_id, handle.key)
        return
    try:
        transports.tcp_transport().control(handle, p.DROP, deadline=deadline)
    except BufferDroppedError:
        pass  # dropping twice is harmless


def ack(handle: BufferHandle, deadline: float) -> None:
    """Blocking: tell the owner one reader has finished a bulk body."""
    owner = current_owner()
    if owner is not None and owner.owns(handle):
        owner.registry.ack(handle.buffer_id, handle.key)
        return
    transports.tcp_transport().control(handle, p.ACK, deadline=deadline)
