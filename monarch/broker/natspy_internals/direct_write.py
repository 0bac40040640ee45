"""Writing a message to the broker's socket from the thread that sends it, when nothing waits.

A ``call_one`` from a plain thread (the user's script, a sync actor's thread
answering a call) is handed to the runtime's loop, which wakes, writes it, and
sleeps again: one thread wake-up and a loop turn per leg, worth 35-60 us of a
~550 us round trip here (benchmarks/NOTES.md 39 and 42). :class:`DirectWrite`
lets that thread write the message's bytes to the socket itself, but only
while nothing else of this connection waits to be written, so the order of
messages is what it would have been through the loop:

* the caller's ``quiet()`` says the runtime has nothing queued for the loop
  (its inbox, its batch; :meth:`monarch.core.runtime.Runtime.publish_from_thread`);
* nats-py has nothing pending, the connection is up and not draining;
* uvloop's transport holds nothing unwritten (its buffer and libuv's queue are
  empty, so libuv writes nothing behind our back: it only ever writes a queue);
* no earlier direct write left a remainder.

All of it is checked, and the bytes written, under one lock, which every
write of the loop's to this socket also takes (:meth:`_wrap`: the transport's
``write`` and ``writelines``, through which nats-py, our write-through and
uvloop's first attempt all go). So no two writes interleave, and nothing the
loop queued can be overtaken. The thread's own ``os.write`` releases the GIL;
the loop waits on the lock for those few microseconds if it wants to write.
The thread writes to a ``dup`` of the socket, closed when the transport is
(its ``close`` is wrapped too), so its number never names another file.
A write the kernel takes only in part (a full socket buffer: a slow broker)
leaves its rest here, and the loop writes it before anything else
(:meth:`_write_rest`, and first thing in every wrapped write).

Plain TCP only: a TLS or WebSocket connection, a new socket not yet taken
over (after a reconnect: taken over on the loop at the next try), or anything
unusual makes :meth:`DirectWrite.try_write` return False, having written
nothing, and the caller hands the message to the loop as before.
``MONARCH_DIRECT_WRITE=0`` turns it off. What this reads of nats-py and
uvloop: ``Client._transport``, ``_pending_data_size``, ``stats``; the TCP
transport's ``_io_writer``/``_bare_io_writer``; the asyncio transport's
``get_write_buffer_size`` and its socket. ``tests/broker/test_direct_write.py``
runs it against a real nats-server, through a full socket buffer, threads
racing the loop, and a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.transport import TcpTransport

from monarch.broker.natspy_internals import fast_headers
from monarch.broker.natspy_internals.sync_publish import command_builder
from monarch.broker.settings import settings

log = logging.getLogger(__name__)


class DirectWrite:
    """Direct writes for one connection; ``nc._monarch_direct_write`` after :func:`install`."""

    def __init__(self, nc: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self.loop = loop
        self.lock = threading.Lock()
        self._build = command_builder(nc)
        self._transport: Any = None  # the nats-py transport whose writes take the lock
        self._writer: Any = None  # its asyncio transport (uvloop's)
        self._fd = -1
        self._rest: bytes | None = None  # the unwritten end of a direct write, for the loop
        self._taking_over = False  # a take-over of a new socket is scheduled on the loop
        self.writes = 0  # messages written directly (for tests and benchmarks)

    # -- any thread -------------------------------------------------------------

    def try_write(
        self,
        subject: str,
        payload: bytes,
        reply: str,
        headers: dict[str, str] | None,
        quiet: Callable[[], bool],
    ) -> bool:
        """Write the message now if nothing waits to be written before it; False: nothing written."""
        nc = self.nc
        if nc._transport is not self._transport:
            self._take_over_soon()
            return False
        if self._rest is not None or nc._pending_data_size or not quiet():
            return False  # (checked again under the lock) not worth building the bytes
        cmd = self._build(subject, payload, reply, headers)
        if cmd is None:
            return False
        if not self.lock.acquire(blocking=False):
            return False  # the loop is writing: it is awake anyway
        try:
            if (
                self._rest is not None
                or self._fd < 0
                or nc._pending_data_size
                or not nc.is_connected
                or nc.is_draining_pubs
                or nc._transport is not self._transport
                or self._writer.get_write_buffer_size()
                or not quiet()
            ):
                return False
            try:
                written = os.write(self._fd, cmd)
            except BlockingIOError:
                return False
            except OSError:
                return False  # the loop's next write meets the same error; nats-py handles it
            if written < len(cmd):
                self._rest = cmd[written:]
                self.loop.call_soon_threadsafe(self._write_rest)
            stats = nc.stats
            stats["out_msgs"] += 1
            stats["out_bytes"] += len(payload)
            self.writes += 1
            return True
        finally:
            self.lock.release()

    def _take_over_soon(self) -> None:
        if not self._taking_over:
            self._taking_over = True
            try:
                self.loop.call_soon_threadsafe(self._take_over)
            except RuntimeError:  # the loop is closed
                pass

    # -- the loop ---------------------------------------------------------------

    def _take_over(self) -> None:
        """Make the current socket's writes take the lock (once per socket)."""
        self._taking_over = False
        transport = self.nc._transport
        if transport is self._transport or not self.nc.is_connected:
            return
        writer = _plain_tcp_writer(transport)
        if writer is None:
            return  # TLS, WebSocket, closing: every message goes through the loop
        with self.lock:
            self._release_fd()
            if getattr(transport, "_monarch_direct_lock", None) is not self.lock:
                self._wrap(transport)
            self._rest = None  # the old socket's: that connection is gone
            self._transport, self._writer = transport, writer
            # A descriptor of our own for the socket: its number cannot be reused for
            # another file while we hold it, however the loop closes its own.
            self._fd = os.dup(writer.get_extra_info("socket").fileno())

    def _release_fd(self) -> None:
        """Under the lock: forget the socket (closed, or replaced after a reconnect)."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._transport = self._writer = None
        self._rest = None

    def _wrap(self, transport: TcpTransport) -> None:
        write, writelines, close = transport.write, transport.writelines, transport.close
        lock = self.lock

        def locked_write(payload: Any) -> Any:
            with lock:
                self._flush_rest(transport)
                return write(payload)

        def locked_writelines(payload: Any) -> Any:
            with lock:
                self._flush_rest(transport)
                return writelines(payload)

        def locked_close() -> Any:
            with lock:
                if transport is self._transport:
                    self._release_fd()
            return close()

        transport._monarch_direct_lock = lock  # type: ignore[attr-defined]
        transport.write = locked_write  # type: ignore[method-assign]
        transport.writelines = locked_writelines  # type: ignore[method-assign]
        transport.close = locked_close  # type: ignore[method-assign]

    def _flush_rest(self, transport: Any) -> None:
        """Under the lock: hand a direct write's remainder to uvloop before anything else."""
        rest, self._rest = self._rest, None
        if rest is not None and transport is self._transport:
            transport._io_writer.write(rest)

    def _write_rest(self) -> None:
        transport = self._transport
        with self.lock:
            try:
                self._flush_rest(transport)
            except Exception as e:  # closed meanwhile: nats-py's reconnect takes over
                log.debug("nats: could not write the rest of a direct write: %r", e)


def _plain_tcp_writer(transport: Any) -> Any:
    """The asyncio transport under a plain TCP nats-py transport; None for anything else."""
    if not isinstance(transport, TcpTransport):
        return None
    io_writer = getattr(transport, "_io_writer", None)
    if io_writer is None or io_writer is not getattr(transport, "_bare_io_writer", None):
        return None  # upgraded to TLS
    writer = getattr(io_writer, "transport", None)
    if writer is None or writer.is_closing():
        return None
    if writer.get_extra_info("sslcontext") is not None:
        return None
    sock = writer.get_extra_info("socket")
    if sock is None or not callable(getattr(writer, "get_write_buffer_size", None)):
        return None
    return writer


def install(nc: Client) -> DirectWrite | None:
    """Let threads write ``nc``'s messages directly; None (nc untouched) where it cannot.

    Call it on the loop that runs ``nc``, once it is connected, after
    :mod:`monarch.broker.natspy_internals.write_through` and :mod:`monarch.broker.natspy_internals.fast_headers`.
    """
    direct = getattr(nc, "_monarch_direct_write", None)
    if direct is not None:
        return direct
    if (
        not settings().direct_write
        or not nc.is_connected
        or getattr(nc, "_monarch_write_through", None) is None
        or not fast_headers.installed(nc)
        or _plain_tcp_writer(getattr(nc, "_transport", None)) is None
        or not all(hasattr(nc, a) for a in ("_pending_data_size", "stats", "is_draining_pubs"))
    ):
        return None
    direct = DirectWrite(nc, asyncio.get_running_loop())
    direct._take_over()
    nc._monarch_direct_write = direct  # type: ignore[attr-defined]
    return direct
