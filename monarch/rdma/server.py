"""The bulk server: every process that owns buffers answers tcp transfers here.

One listening socket and a thread per connection (transfers spend their time
in ``send``/``recv``, which release the GIL, so threads are the simple way to
run many at once). Bytes go straight between the socket and the registered
memory: ``sendall`` from a view of it, ``recv_into`` a view of it, in
:data:`~monarch.rdma.protocol.CHUNK` pieces; CUDA memory is staged per chunk.
The accept loop wakes once a second to release expired bulk bodies.

It is the owner side of the ``tcp`` transport, of atomics on every
transport but ibverbs, and of ``drop``/``ack`` requests from other processes.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

from monarch.rdma import protocol as p
from monarch.rdma.errors import BufferDroppedError
from monarch.rdma.registry import Entry, Registry

log = logging.getLogger(__name__)
_U64 = struct.Struct("<Q")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def recv_exact(conn: socket.socket, view: memoryview) -> int:
    """Fill ``view`` from ``conn``; returns how many bytes arrived (less only at EOF)."""
    got, n = 0, len(view)
    while got < n:
        k = conn.recv_into(view[got : got + p.CHUNK])
        if k == 0:
            break
        got += k
    return got


class BulkServer:
    """Serves the buffers of ``registry`` on ``host`` (port chosen by the kernel)."""

    def __init__(self, registry: Registry, host: str) -> None:
        self.registry = registry
        self._sock = socket.create_server((host, 0), backlog=128)
        self._sock.settimeout(1.0)
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"monarch-bulk-{self.address[1]}", daemon=True
        )
        self._acceptor.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, cut open connections, and wait (bounded) for their threads."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() at once
        except OSError:
            pass
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(timeout)
        for t in threads:
            t.join(timeout)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                self.registry.sweep()
                continue
            except OSError:
                if not self._closed:
                    log.exception("bulk server accept failed")
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(
                target=self._serve, args=(conn,), name="monarch-bulk-conn", daemon=True
            )
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        head = bytearray(p.REQUEST.size)
        try:
            while not self._closed and recv_exact(conn, memoryview(head)) == len(head):
                if not self._handle(conn, p.REQUEST.unpack(head)):
                    break
        except OSError:
            pass  # the peer went away mid-request; it reports its own error
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()

    def _handle(self, conn: socket.socket, req: tuple) -> bool:
        """Serve one request; False when the connection must close."""
        magic, version, op, _, buffer_id, key, offset, length, a, b = req
        if magic != p.MAGIC or version != p.VERSION:
            _respond(conn, p.BAD_REQUEST, f"not a monarch bulk request (version {version})")
            return False
        try:
            if op == p.ACK:
                self.registry.ack(buffer_id, key)
                return _respond(conn, p.OK)
            if op == p.DROP:
                self.registry.drop(buffer_id, key)
                return _respond(conn, p.OK)
            entry = self.registry.lookup(buffer_id, key)
            if offset + length > entry.memory.size or (op in (p.FETCH_ADD, p.CAS) and length != 8):
                raise _Refused(
                    p.OUT_OF_RANGE,
                    f"[{offset}, {offset + length}) is outside "
                    f"buffer {buffer_id} of {entry.memory.size} bytes",
                )
            if op == p.READ:
                return self._read(conn, entry, offset, length)
            if not entry.memory.writable:
                raise _Refused(p.READ_ONLY, f"buffer {buffer_id} is read-only")
            if op == p.WRITE:
                return self._write(conn, entry, offset, length)
            if op in (p.FETCH_ADD, p.CAS):
                return _respond(conn, p.OK, value=self._atomic(entry, op, offset, a, b))
            raise _Refused(p.BAD_REQUEST, f"unknown operation {op}")
        except BufferDroppedError as e:
            return _respond(conn, p.NO_BUFFER, str(e))
        except _Refused as e:
            return _respond(conn, e.status, str(e))

    def _read(self, conn: socket.socket, entry: Entry, offset: int, length: int) -> bool:
        mem = entry.memory
        _respond(conn, p.OK, length=length)
        for start in range(offset, offset + length, p.CHUNK):
            conn.sendall(mem.cpu_view(start, min(start + p.CHUNK, offset + length)))
        return True

    def _write(self, conn: socket.socket, entry: Entry, offset: int, length: int) -> bool:
        mem = entry.memory
        _respond(conn, p.GO)
        for start in range(offset, offset + length, p.CHUNK):
            stop = min(start + p.CHUNK, offset + length)
            chunk = mem.cpu_view(start, stop, fill=False)
            if recv_exact(conn, chunk) < len(chunk):
                return False  # the writer went away: nothing to acknowledge
            mem.commit(start, chunk)
        if not self.registry.is_live(entry):
            return _respond(
                conn, p.NO_BUFFER, f"buffer {entry.buffer_id} was dropped during the write"
            )
        return _respond(conn, p.OK)

    def _atomic(self, entry: Entry, op: int, offset: int, a: int, b: int) -> int:
        mem = entry.memory
        with entry.lock:
            view = mem.cpu_view(offset, offset + 8)
            (old,) = _U64.unpack(view)
            if op == p.FETCH_ADD:
                _U64.pack_into(view, 0, (old + a) & p.MASK64)
            elif old == a:
                _U64.pack_into(view, 0, b)
            mem.commit(offset, view)
        return old


def _respond(
    conn: socket.socket, status: int, message: str = "", *, length: int = 0, value: int = 0
) -> bool:
    text = message.encode()
    conn.sendall(p.RESPONSE.pack(status, len(text), length, value) + text)
    return True
