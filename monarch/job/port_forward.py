"""``PortForwarder``: TCP port forwarding between the procs of two meshes, over the broker.

``forwarder.forward.call_one(dst_procs, dst_port, src_procs, "127.0.0.1:8080")``
makes each source proc listen on its address and relay every connection to
``dst_port`` on the destination proc at the same mesh point (any process
that can reach the broker can reach any port a rank can reach: a notebook
on a laptop reaches a dashboard on a cluster node). Stopping the forwarder
actor closes every forward it started.

Bytes travel as port messages of at most 64 KiB. Each direction has a
credit window (TCP-like): a side reads from its socket only while the peer
has acknowledged all but ``_WINDOW`` bytes, and acknowledges bytes once its
own socket accepted them. So a slow reader slows the writer at the far
end, memory stays bounded, and nothing is dropped. A half-close (EOF) is
passed on as a half-close; a reset or error on one side aborts (RSTs) the
other.

Beyond Monarch: ``dst_port`` may also be ``"host:port"`` (a service the
destination proc reaches, not only its loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any

from monarch.actor import (
    Actor,
    Channel,
    Point,
    Port,
    PortReceiver,
    ProcMesh,
    current_rank,
    endpoint,
)

_CHUNK = 64 * 1024
_WINDOW = 1024 * 1024  # unacknowledged bytes in flight per direction
_DATA, _ACK, _EOF, _ABORT = 0, 1, 2, 3  # message kinds: [kind, payload]

_PortSpec = int | str | Callable[[Point], int | str]
_Address = str | Callable[[Point], str]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (not a FIN), so the far end learns the connection broke."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Credit:
    """Bytes this side may still send before the peer acknowledges more."""

    def __init__(self) -> None:
        self.left = _WINDOW
        self.more = asyncio.Event()
        self.more.set()

    def take(self, n: int) -> None:
        self.left -= n
        if self.left <= 0:
            self.more.clear()

    def give(self, n: int) -> None:
        self.left += n
        if self.left > 0:
            self.more.set()


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    peer: Port[Any],
    inbox: PortReceiver[Any],
) -> None:
    """Copy bytes both ways between a socket and the peer's relay until both sides sent EOF."""
    credit = _Credit()
    sent_eof, got_eof = asyncio.Event(), asyncio.Event()

    async def outward() -> None:  # socket -> peer
        while True:
            await credit.more.wait()
            data = await reader.read(min(_CHUNK, credit.left))
            if not data:
                break
            credit.take(len(data))
            peer.send([_DATA, data])
        peer.send([_EOF, None])
        sent_eof.set()

    async def inward() -> None:  # peer -> socket
        while True:
            kind, payload = await inbox.recv()
            if kind == _DATA:
                writer.write(payload)
                await writer.drain()  # the socket took it: the peer may send that much more
                peer.send([_ACK, len(payload)])
            elif kind == _ACK:
                credit.give(payload)
            elif kind == _EOF:
                if writer.can_write_eof():
                    writer.write_eof()
                got_eof.set()
            elif kind == _ABORT:
                raise ConnectionAbortedError("the other side of the forward was reset")
            else:
                raise RuntimeError(f"unexpected port-forward message kind {kind!r}")

    async def both_closed() -> None:
        await sent_eof.wait()
        await got_eof.wait()

    tasks = [asyncio.ensure_future(t()) for t in (outward, inward, both_closed)]
    clean = False
    try:
        while not tasks[2].done():  # until both sides sent EOF; an error ends it sooner
            done, _ = await asyncio.wait(
                [t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                t.result()
        clean = True
    except (asyncio.CancelledError, Exception):
        with contextlib.suppress(Exception):
            peer.send([_ABORT, None])
        raise
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        inbox.close()
        if clean:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)
        else:
            _reset(writer)


class _Connections:
    """The relays of one actor; cancelling them aborts each connection."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def add(self, reader: Any, writer: Any, peer: Port[Any], inbox: PortReceiver[Any]) -> None:
        task = asyncio.ensure_future(_swallow(_relay(reader, writer, peer, inbox)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _swallow(relay: Any) -> None:
    """A connection's end (reset, refused, closed) concerns that connection, not the actor."""
    with contextlib.suppress(OSError, ConnectionError, RuntimeError):
        await relay


class _DestinationActor(Actor):
    """Connects to the destination service once per forwarded connection."""

    def __init__(self) -> None:
        self._target: tuple[str, int] | None = None
        self._connections = _Connections()

    @endpoint
    async def configure(self, dst_port: _PortSpec) -> None:
        self._target = _destination(dst_port, current_rank())

    @endpoint
    async def open(self, peer: Port[Any]) -> Port[Any]:
        if self._target is None:
            raise RuntimeError("port forward destination is not configured")
        reader, writer = await asyncio.open_connection(*self._target)
        port, inbox = Channel.open()
        self._connections.add(reader, writer, peer, inbox)
        return port

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._connections.close()


class _SourceActor(Actor):
    """Listens on the source address and relays each connection to the destination rank."""

    def __init__(self) -> None:
        self._destination: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._connections = _Connections()

    @endpoint
    async def start(self, destination: Any, src_address: _Address) -> None:
        point = current_rank()
        self._destination = destination.slice(**dict(point))
        host, port = _address(src_address(point) if callable(src_address) else src_address)
        self._server = await asyncio.start_server(
            self._accept,
            host,
            port,
            reuse_port=True,  # ranks of one host may share an address
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            port, inbox = Channel.open()
            peer = await self._destination.open.call_one(port)
        except Exception:
            _reset(writer)  # the destination refused: so do we
            return
        self._connections.add(reader, writer, peer, inbox)

    async def __cleanup__(self, exc: Exception | None) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        await self._connections.close()


class PortForwarder(Actor):
    """Owns TCP port forwards between proc meshes; stop it to close them all.

    Spawn it in the client (``this_proc().spawn("fwd", PortForwarder)``) and
    call :meth:`forward` once per forward.
    """

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: _PortSpec,
        src_proc_mesh: ProcMesh,
        src_address: _Address,
    ) -> None:
        """Make each source proc listen on ``src_address`` and relay to ``dst_port`` at its point.

        The meshes must have the same extent. ``dst_port`` is a port on the
        destination proc's loopback (or ``"host:port"``), ``src_address`` is
        ``"address:port"``; either may be a function of the ``Point``.
        Returns once every source listens. Raises (as ActorError) ValueError
        for different shapes or a bad static port or address; a setup that
        fails part way stops what it started.
        """
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "destination and source process meshes must have the same shape: "
                f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}"
            )
        if not callable(dst_port):
            _destination(dst_port, None)
        if not callable(src_address):
            _address(src_address)
        suffix = uuid.uuid4().hex[:12]
        started: list[Any] = []
        try:
            destination = dst_proc_mesh.spawn(f"port_forward_dst_{suffix}", _DestinationActor)
            started.append(destination)
            source = src_proc_mesh.spawn(f"port_forward_src_{suffix}", _SourceActor)
            started.append(source)
            await destination.configure.call(dst_port)
            await source.start.call(destination, src_address)
        except Exception:
            for actor in started:  # nothing half set up stays listening
                with contextlib.suppress(Exception):
                    await actor.stop()
            raise


def _port(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{name} must be an integer from 1 through 65535, got {value!r}")
    return value


def _address(address: Any) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:80"`` too) -> (host, port); ValueError otherwise."""
    if not isinstance(address, str):
        raise ValueError(f"address must be a string 'address:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address must use 'address:port' form, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"the port of {address!r} must be an integer") from None
    return host, _port("address port", number)


def _destination(dst_port: _PortSpec, point: Point | None) -> tuple[str, int]:
    value = dst_port(point) if callable(dst_port) and point is not None else dst_port
    if isinstance(value, str):
        return _address(value)
    return "127.0.0.1", _port("dst_port", value)
