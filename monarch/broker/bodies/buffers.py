"""Big anonymous buffers whose pages stay mapped between uses.

Why: a fresh 64 MiB buffer costs ~15 ms of page faults here (one per 4 KiB
page, each a trip through the hypervisor) before the ~10 ms copy that fills
it, on the sender (the message body) and again on the receiver (the fetched
copy), so faults were more than half of a big argument's transfer time
(NOTES 18). The codec's big bodies and the bulk fetches take their memory
from here; a buffer comes back to the pool by itself once nothing refers to
it any more (the body was released after its readers, or the tensor decoded
from it was freed), and is handed out again with its pages still mapped.

The pool tracks at most ``MONARCH_BUFFER_POOL_MB`` (default 256) of buffers
per process, in use or idle (beyond that, buffers are plain one-off mappings),
and lets go of any buffer idle for 30 s, at the next request. Buffers are reused only for sizes within a factor of two, so a
small request never pins a huge mapping. Reused memory is not zeroed: every
user overwrites the bytes it asked for before reading them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time

MIN_POOLED = 1 << 20  # smaller buffers are cheap to fault in; they are not pooled
IDLE_SECONDS = 30.0
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault a range in, in one system call
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):  # pragma: no cover - not a POSIX libc
    _madvise = None


def new_mapping(size: int) -> mmap.mmap:
    """Anonymous memory of ``size`` bytes with its pages faulted in, without the GIL.

    ``mmap(MAP_POPULATE)`` faults the pages in inside the ``mmap`` call, which
    CPython makes holding the GIL: 1 GiB of fresh pages took 0.24-1.5 s here,
    long enough to miss heartbeats. A foreign call through ctypes releases the
    GIL, so the pages are faulted in by ``madvise(MADV_POPULATE_WRITE)`` instead
    (or, on kernels without it, by the first copy into them, also GIL-free).
    """
    if size < MIN_POOLED or _madvise is None:
        return mmap.mmap(-1, max(size, 1), flags=_FLAGS)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with memoryview(mm) as view:
        _madvise(buffer_address(view), size, _MADV_POPULATE_WRITE)  # failure: faults later
    return mm


def _limit() -> int:
    raw = os.environ.get("MONARCH_BUFFER_POOL_MB", "")
    try:
        return max(0, int(raw)) << 20 if raw else 256 << 20
    except ValueError:
        raise ValueError(f"MONARCH_BUFFER_POOL_MB={raw!r}: expected a whole number") from None


class BufferPool:
    """Thread-safe; ``take(n)`` gives an n-byte writable memoryview of pre-faulted memory."""

    def __init__(self, limit_bytes: int | None = None) -> None:
        self._lock = threading.Lock()
        self._maps: list[list] = []  # [mmap, last time handed out]
        self._limit = _limit() if limit_bytes is None else limit_bytes
        self.reused = 0  # how many requests found a mapped buffer (for tests and benchmarks)
        self._pid = os.getpid()

    def take(self, size: int) -> memoryview:
        if size < MIN_POOLED or self._limit == 0:
            return memoryview(new_mapping(size))[:size]
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            for entry in self._maps:
                mm = entry[0]
                # Our list entry, this local and getrefcount's argument: 3. More means a
                # memoryview (and what was built on it) still uses the buffer.
                if size <= len(mm) <= 2 * size and sys.getrefcount(mm) == 3:
                    entry[1] = now
                    self.reused += 1
                    return memoryview(mm)[:size]
                del mm
            mm = new_mapping(size)
            if size + sum(len(e[0]) for e in self._maps) <= self._limit:
                self._maps.append([mm, now])
            else:  # over the limit: make room among idle buffers, or do not keep this one
                self._shrink(self._limit - size)
                if size + sum(len(e[0]) for e in self._maps) <= self._limit:
                    self._maps.append([mm, now])
            return memoryview(mm)[:size]

    def _idle(self, entry: list) -> bool:
        return sys.getrefcount(entry[0]) == 2  # the list entry and the argument

    def _expire(self, now: float) -> None:
        self._maps = [e for e in self._maps if not (self._idle(e) and now - e[1] > IDLE_SECONDS)]

    def _shrink(self, room: int) -> None:
        """Drop idle buffers, oldest first, until all pooled buffers fit in ``room`` bytes."""
        idle = sorted((e for e in self._maps if self._idle(e)), key=lambda e: e[1])
        total = sum(len(e[0]) for e in self._maps)
        for e in idle:
            if total <= room:
                break
            self._maps.remove(e)
            total -= len(e[0])

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(len(e[0]) for e in self._maps if self._idle(e))


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``: the only way to learn the address of read-only memory."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def buffer_address(view: memoryview) -> int:
    """The address of a contiguous memoryview's first byte (read-only ones too)."""
    pb = _PyBuffer()
    _get_buffer(view, ctypes.byref(pb), 0)  # PyBUF_SIMPLE: contiguous bytes
    try:
        return pb.buf or 0
    finally:
        _release_buffer(ctypes.byref(pb))


_GIL_FREE_COPY = 1 << 20


def copy_into(dst: memoryview, pos: int, src: memoryview) -> None:
    """``dst[pos:pos + len(src)] = src``, without holding the GIL when it is big.

    A slice assignment copies holding the GIL: a 1 GiB body stalls every other
    thread of the process for a second or more, its event loop (and with it the
    heartbeats the supervisor waits for) included. ``ctypes.memmove`` is a
    foreign call, which runs with the GIL released. Both views must stay alive
    for the call (they do: the caller holds them).
    """
    n = src.nbytes
    if n < _GIL_FREE_COPY:
        dst[pos : pos + n] = src
        return
    if dst.readonly or pos + n > dst.nbytes:
        raise ValueError("copy_into needs a writable destination with room for the source")
    ctypes.memmove(buffer_address(dst) + pos, buffer_address(src), n)


_pool: BufferPool | None = None
_pool_lock = threading.Lock()


def pool() -> BufferPool:
    """This process's pool (made on first use, so a forked child gets its own)."""
    global _pool
    if _pool is None or _pool._pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool._pid != os.getpid():
                _pool = BufferPool()
    return _pool


def take(size: int) -> memoryview:
    """An n-byte writable buffer, pre-faulted, from this process's pool."""
    return pool().take(size)
