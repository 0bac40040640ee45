"""Parsing what the broker sends in the socket's own callback, not in nats-py's reader task.

nats-py feeds each chunk the socket receives to an ``asyncio.StreamReader``
and parses it in a *reader* task, on that task's next turn of the event loop.
On each leg of a call that is a task switch, and on the other side of it a
second hand-over to the thread that waits. :func:`install` replaces the
``StreamReader``'s ``feed_data``, which the transport calls with each chunk,
with a call of nats-py's own parser, so a message reaches its subscription
(our ordered intake, :mod:`monarch.broker.natspy_internals.intake`) in the callback that
brought its bytes. Whole, plain frames for our own subscriptions skip even
nats-py's parser (:mod:`monarch.broker.natspy_internals.fast_delivery`, NOTES 31).
benchmarks/NOTES.md entry 30 has what reading on arrival changed, alone and
with :mod:`monarch.broker.natspy_internals.write_through` (together: ``call_one`` p50 -6-9%,
broadcast-and-gather +7-19%, pipelined calls -13-21%).

Parsing almost never waits; when it does (an error callback, a JetStream
flow-control reply) a task finishes it, and bytes that arrive meanwhile
queue in the parser's buffer behind it, so wire order holds; the socket stops
being read while more than :data:`PAUSE_READING_AT` bytes wait so, as
``StreamReader``'s limit would. nats-py's reader task stays parked on the
emptied ``StreamReader`` and still sees end of file and socket errors, so
losing the server and reconnecting remain nats-py's; each new socket's
reader is taken over when nats-py's reader task for it starts. Connecting,
TLS, PING/PONG, INFO and subscriptions stay nats-py's (writing:
:mod:`monarch.broker.natspy_internals.write_through`).

What this touches are nats-py internals (``Client._read_loop``, ``_ps``, the
TCP transport's ``_io_reader``/``_io_writer``) and ``asyncio.StreamReader``'s
``_buffer``/``_waiter``: :func:`install` checks that they are there and
otherwise leaves the connection as nats-py made it (slower, still correct),
as it does for a WebSocket connection and when ``MONARCH_DIRECT_READ=0``.
``tests/broker/test_direct_read.py`` runs it against a real nats-server,
through a reconnect, a parse that waits and a server that breaks protocol.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

from nats import errors
from nats.aio.client import Client
from nats.aio.transport import TcpTransport

from monarch.broker.natspy_internals.fast_delivery import deliver_chunk, usable
from monarch.broker.natspy_internals.inline import run_inline
from monarch.broker.settings import settings

log = logging.getLogger(__name__)

# Bytes that may pile up in the parser's buffer while a parse waits; above it the
# socket is not read until the parse is done.
PAUSE_READING_AT = 8 * 1024 * 1024
# How many loop turns install() waits for nats-py's reader task to park on its reader.
_PARK_TURNS = 1000


class DirectReader:
    """Takes over the reading of one connection; ``nc._monarch_direct_read`` after install."""

    def __init__(self, nc: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self.loop = loop
        self.reader: asyncio.StreamReader | None = None  # the reader taken over last
        self.parsing: asyncio.Task[None] | None = None  # a parse that waited, until it ends
        self.paused = False
        self.op_errors: set[asyncio.Task[None]] = set()
        # whole plain frames skip nats-py's parser (where its internals are as known)
        self.fast = settings().fast_delivery and usable(nc)

    async def read_loop(self) -> None:
        """nats-py starts this as its reader task on every reconnection."""
        self.take_over_reader()
        await Client._read_loop(self.nc)

    def take_over_when_parked(self, turns: int = _PARK_TURNS) -> None:
        """Take over the current reader once nats-py's reader task waits on it (empty)."""
        if self.nc.is_closed:
            return
        reader = self.nc._transport._io_reader
        waiter = getattr(reader, "_waiter", None)
        if waiter is not None and not waiter.done():
            self.take_over_reader()
        elif turns > 0:
            self.loop.call_soon(self.take_over_when_parked, turns - 1)
        else:
            log.debug("nats-py's reader task never parked; this connection reads through it")

    def take_over_reader(self) -> None:
        reader = self.nc._transport._io_reader
        if reader is None or reader is self.reader:
            return
        self.reader = reader

        def feed_data(data: bytes) -> None:
            self.feed(reader, data)

        reader.feed_data = feed_data  # type: ignore[method-assign]
        if reader._buffer:  # arrived before the reader task's first turn: first in line
            leftover = bytes(reader._buffer)
            reader._buffer.clear()
            resume = getattr(reader, "_maybe_resume_transport", None)
            if resume is not None:
                resume()
            self.feed(reader, leftover)

    def feed(self, reader: asyncio.StreamReader, data: bytes) -> None:
        nc = self.nc
        if reader is not nc._transport._io_reader or nc.is_closed or nc.is_reconnecting:
            return  # a dead socket's last bytes: nats-py's reader task would drop them too
        ps = nc._ps
        if self.parsing is not None:  # a parse waits: these bytes queue behind it
            ps.buf.extend(data)
            if len(ps.buf) > PAUSE_READING_AT and not self.paused:
                self.paused = True
                nc._transport._io_writer.transport.pause_reading()
            return
        if self.fast:  # whole plain frames go straight to their subscription
            try:
                data = deliver_chunk(nc, data)
            except Exception as e:  # as a parse that fails: drop the socket, reconnect
                self.parse_failed(e)
                return
            if not data and not ps.buf:
                return
        task = run_inline(ps.parse(data), self.loop, self.parse_failed)
        if task is not None:
            self.parsing = task
            task.add_done_callback(self.parse_done)

    def parse_done(self, task: asyncio.Task[None]) -> None:
        self.parsing = None
        if self.paused:
            self.paused = False
            try:
                self.nc._transport._io_writer.transport.resume_reading()
            except Exception:  # closed meanwhile: nats-py's reader task sees that
                pass
        reader = self.reader
        if reader is not None and self.nc._ps.buf:  # bytes queued after the parse's last look
            self.feed(reader, b"")

    def parse_failed(self, e: Exception) -> None:
        """Drop the socket and reconnect, as nats-py's reader task does on a protocol error.

        (On any other error nats-py's reader task logs it and stops reading,
        leaving a connection that hears nothing; a reconnect is better.)
        """
        if not isinstance(e, errors.ProtocolError):
            log.error("nats: error while parsing what the broker sent", exc_info=e)
            e = errors.ProtocolError()
        task = self.loop.create_task(self.nc._process_op_err(e))
        self.op_errors.add(task)
        task.add_done_callback(self.op_errors.discard)


def _has_internals(nc: Client) -> bool:
    """Whether ``nc`` has every nats-py internal this module replaces or reads."""
    parser = getattr(nc, "_ps", None)
    transport = getattr(nc, "_transport", None)
    reader = getattr(transport, "_io_reader", None)
    return (
        inspect.iscoroutinefunction(getattr(Client, "_read_loop", None))
        and inspect.iscoroutinefunction(getattr(nc, "_process_op_err", None))
        and inspect.iscoroutinefunction(getattr(parser, "parse", None))
        and isinstance(getattr(parser, "buf", None), bytearray)
        and isinstance(transport, TcpTransport)
        and isinstance(reader, asyncio.StreamReader)
        and isinstance(getattr(reader, "_buffer", None), bytearray)
        and hasattr(reader, "_waiter")
        and getattr(transport, "_io_writer", None) is not None
    )


def install(nc: Client) -> bool:
    """Parse what ``nc`` receives on arrival; False (nc untouched) where it cannot.

    Call it on the loop that runs ``nc``, once it is connected; a second call
    does nothing.
    """
    if getattr(nc, "_monarch_direct_read", None) is not None:
        return True
    if not settings().direct_read or not nc.is_connected or not _has_internals(nc):
        return False
    direct = DirectReader(nc, asyncio.get_running_loop())
    nc._monarch_direct_read = direct  # type: ignore[attr-defined]
    nc._read_loop = direct.read_loop  # type: ignore[method-assign]  (its next reader tasks)
    direct.take_over_when_parked()  # the reader task of this connection already runs
    return True
