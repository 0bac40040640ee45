"""The tcp transport: a direct socket to the owner's bulk server.

Works between any two processes that can reach each other, so it is the
fallback of every other transport, and it carries what needs the owner's
help everywhere: atomics (done by the owner under a lock) and ``drop`` /
``ack`` requests. Connections are pooled per server and reused; a
connection that saw any error is closed, never reused. Bytes are received
straight into the destination memoryview (``recv_into``) and sent straight
from the source (``sendall`` of a view): no copies beyond the kernel's.
"""

from __future__ import annotations

import socket
import threading
import time

from monarch.rdma import protocol as p
from monarch.rdma.errors import (
    BufferDroppedError,
    OwnerGoneError,
    RDMAError,
    RDMATimeoutError,
    ReadOnlyBufferError,
)
from monarch.rdma.handle import BufferHandle
from monarch.rdma.transports.base import Transport

_ATOMIC_OPS = {"fetch_add": p.FETCH_ADD, "compare_and_swap": p.CAS}


class _Retry(Exception):
    """A pooled connection was dead before the server answered: try once more on a fresh one."""


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()

    # -- the Transport interface ---------------------------------------------

    def read(self, handle: BufferHandle, offset: int, dst: memoryview, *, deadline: float) -> None:
        def run(conn: socket.socket) -> None:
            _send(conn, handle, p.READ, offset, len(dst), deadline=deadline)
            status, length, _ = _answer(conn, handle, p.READ, deadline)
            if length != len(dst):
                raise RDMAError(f"{handle.describe()}: server offered {length} of {len(dst)} bytes")
            got = 0
            while got < len(dst):
                _budget(conn, deadline)
                k = conn.recv_into(dst[got : got + p.CHUNK])
                if k == 0:
                    raise OwnerGoneError(
                        f"{handle.describe()}: connection closed after {got} of {len(dst)} bytes "
                        "(the owner process exited?); nothing was read"
                    )
                got += k

        self._with_connection(handle, run, deadline)

    def write(self, handle: BufferHandle, offset: int, src: memoryview, *, deadline: float) -> None:
        def run(conn: socket.socket) -> None:
            _send(conn, handle, p.WRITE, offset, len(src), deadline=deadline)
            _answer(conn, handle, p.WRITE, deadline)  # GO, or raises
            for start in range(0, len(src), p.CHUNK):
                _budget(conn, deadline)
                conn.sendall(src[start : start + p.CHUNK])
            _answer(conn, handle, p.WRITE, deadline, retry=False)  # every byte has landed

        self._with_connection(handle, run, deadline)

    def atomic(
        self, handle: BufferHandle, op: str, offset: int, a: int, b: int = 0, *, deadline: float
    ) -> int:
        code = _ATOMIC_OPS[op]

        def run(conn: socket.socket) -> int:
            _send(conn, handle, code, offset, 8, a, b, deadline=deadline)
            return _answer(conn, handle, code, deadline)[2]

        return self._with_connection(handle, run, deadline)

    def control(self, handle: BufferHandle, op: int, *, deadline: float) -> None:
        """``DROP`` or ``ACK``: small requests the owner's server answers at once."""

        def run(conn: socket.socket) -> None:
            _send(conn, handle, op, 0, 0, deadline=deadline)
            _answer(conn, handle, op, deadline)

        self._with_connection(handle, run, deadline)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- connections -------------------------------------------------------------

    def _with_connection(self, handle: BufferHandle, run, deadline: float):
        for attempt in range(2):
            conn, reused = self._acquire(handle, deadline)
            try:
                result = run(conn)
            except _Retry:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise OwnerGoneError(
                    f"{handle.describe()}: the bulk server closed the connection (the owner "
                    "process exited?)"
                ) from None
            except TimeoutError:
                conn.close()
                raise RDMATimeoutError(f"{handle.describe()}: timed out") from None
            except OSError as e:
                conn.close()
                raise OwnerGoneError(f"{handle.describe()}: connection failed: {e}") from e
            except BaseException:
                conn.close()
                raise
            self._release(handle.server, conn)
            return result
        raise AssertionError("unreachable")

    def _acquire(self, handle: BufferHandle, deadline: float) -> tuple[socket.socket, bool]:
        with self._lock:
            idle = self._idle.get(handle.server)
            if idle:
                return idle.pop(), True
        left = deadline - time.monotonic()
        if left <= 0:
            raise RDMATimeoutError(f"{handle.describe()}: timed out before connecting")
        try:
            conn = socket.create_connection(handle.server, timeout=min(left, 10.0))
        except TimeoutError:
            raise RDMATimeoutError(f"{handle.describe()}: timed out connecting") from None
        except OSError as e:
            raise OwnerGoneError(
                f"{handle.describe()}: cannot connect to the owner's bulk server: {e} (the owner "
                "process has exited, or its address is unreachable from here)"
            ) from e
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, False

    def _release(self, server: tuple[str, int], conn: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(server, []).append(conn)


def _budget(conn: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError()
    conn.settimeout(left)


def _send(
    conn: socket.socket,
    h: BufferHandle,
    op: int,
    offset: int,
    length: int,
    a: int = 0,
    b: int = 0,
    *,
    deadline: float,
) -> None:
    _budget(conn, deadline)
    head = p.REQUEST.pack(p.MAGIC, p.VERSION, op, 0, h.buffer_id, h.key, offset, length, a, b)
    try:
        conn.sendall(head)
    except (BrokenPipeError, ConnectionResetError):
        raise _Retry() from None


def _answer(
    conn: socket.socket, h: BufferHandle, op: int, deadline: float, retry: bool = True
) -> tuple[int, int, int]:
    """(status, length, value) of an OK/GO answer; raises the error an answer carries."""
    head = bytearray(p.RESPONSE.size)
    got = 0
    while got < len(head):
        _budget(conn, deadline)
        try:
            k = conn.recv_into(memoryview(head)[got:])
        except ConnectionResetError:
            k = 0
        if k == 0:
            if got == 0 and retry:
                raise _Retry()
            raise OwnerGoneError(
                f"{h.describe()}: the bulk server closed the connection "
                "mid-answer (the owner process exited?)"
            )
        got += k
    status, msg_len, length, value = p.RESPONSE.unpack(head)
    message = ""
    if msg_len:
        text = bytearray(msg_len)
        _budget(conn, deadline)
        conn.recv_into(text, msg_len, socket.MSG_WAITALL)
        message = text.decode(errors="replace")
    if status in (p.OK, p.GO):
        return status, length, value
    what = f"{p.OP_NAMES.get(op, op)} of {h.describe()} failed: {message}"
    if status == p.NO_BUFFER:
        raise BufferDroppedError(what)
    if status == p.READ_ONLY:
        raise ReadOnlyBufferError(what)
    if status == p.OUT_OF_RANGE:
        raise ValueError(what)
    raise RDMAError(what)
