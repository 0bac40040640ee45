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

import mmap
import os
import sys
import threading
import time

MIN_POOLED = 1 << 20  # smaller buffers are cheap to fault in; they are not pooled
IDLE_SECONDS = 30.0
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


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
            return memoryview(mmap.mmap(-1, max(size, 1), flags=_FLAGS))[:size]
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
            mm = mmap.mmap(-1, size, flags=_FLAGS)
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
