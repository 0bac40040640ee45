"""The owner side's table of registered memory, and the registration words.

Each registered buffer gets an id, a random access key, and a *registration
word*: an 8-byte slot in this process's memory that holds the buffer's token
while it is registered and 0 once it is dropped. Same-host peers copy memory
without asking the owner, so they read that word after each copy (and before
and after each write): a dropped buffer, or a pid that now belongs to another
process, shows as a mismatch. A dropped writable buffer's memory is kept
alive for ``GRACE`` seconds, so a one-sided write already under way cannot
land in memory the owner has freed and reused.

Entries registered by :mod:`monarch.rdma.bulk` are released after ``readers``
acknowledged reads, or when their time to live runs out (``sweep``).
"""

from __future__ import annotations

import ctypes
import itertools
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from monarch.rdma.errors import BufferDroppedError
from monarch.rdma.memory import Memory

GRACE = 5.0  # seconds a dropped writable buffer stays allocated (see module docstring)
_SLOTS_PER_BLOCK = 1024


class Entry:
    """One registered buffer (owner side)."""

    __slots__ = ("buffer_id", "key", "memory", "slot", "lock", "readers", "expires", "extra")

    def __init__(self, buffer_id: int, key: bytes, memory: Memory, slot: int) -> None:
        self.buffer_id, self.key, self.memory, self.slot = buffer_id, key, memory, slot
        self.lock = threading.Lock()  # serialises atomics (fetch_add, compare_and_swap)
        self.readers: int | None = None  # acknowledged reads still expected (bulk bodies)
        self.expires: float | None = None  # monotonic time (bulk bodies)
        self.extra: Any = None  # e.g. the ibverbs memory region, released on drop

    @property
    def token(self) -> int:
        return int.from_bytes(self.key[:8], "little") | 1


class _Words:
    """Registration words: blocks of c_uint64 that are never freed, so their addresses stay valid."""

    def __init__(self) -> None:
        self.blocks: list[Any] = []
        self.free: list[int] = []

    def take(self) -> int:
        if not self.free:
            base = len(self.blocks) * _SLOTS_PER_BLOCK
            self.blocks.append((ctypes.c_uint64 * _SLOTS_PER_BLOCK)())
            self.free.extend(range(base + _SLOTS_PER_BLOCK - 1, base - 1, -1))
        return self.free.pop()

    def set(self, slot: int, value: int) -> None:
        self.blocks[slot // _SLOTS_PER_BLOCK][slot % _SLOTS_PER_BLOCK] = value

    def get(self, slot: int) -> int:
        return self.blocks[slot // _SLOTS_PER_BLOCK][slot % _SLOTS_PER_BLOCK]

    def address(self, slot: int) -> int:
        block = self.blocks[slot // _SLOTS_PER_BLOCK]
        return ctypes.addressof(block) + 8 * (slot % _SLOTS_PER_BLOCK)


class Registry:
    """Registered buffers of this process, by id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._ids = itertools.count(1)
        self._words = _Words()
        self._lingering: list[tuple[float, Memory]] = []  # dropped writable memory, kept for GRACE
        self.on_release: Callable[[Entry], None] | None = None  # e.g. deregister from the NIC

    def add(self, memory: Memory, *, readers: int | None = None, ttl: float | None = None) -> Entry:
        with self._lock:
            entry = Entry(next(self._ids), secrets.token_bytes(16), memory, self._words.take())
            entry.readers = readers
            entry.expires = None if ttl is None else time.monotonic() + ttl
            self._words.set(entry.slot, entry.token)
            self._entries[entry.buffer_id] = entry
        return entry

    def word_address(self, entry: Entry) -> int:
        return self._words.address(entry.slot)

    def lookup(self, buffer_id: int, key: bytes) -> Entry:
        """The live entry, or BufferDroppedError (unknown, dropped, or the wrong key: all alike)."""
        entry = self._entries.get(buffer_id)
        if entry is None or not secrets.compare_digest(entry.key, key):
            raise BufferDroppedError(
                f"buffer {buffer_id} is not registered here: it was dropped (or released, for a "
                "big message), or the handle is not for this process"
            )
        return entry

    def is_live(self, entry: Entry) -> bool:
        return self._entries.get(entry.buffer_id) is entry

    def drop(self, buffer_id: int, key: bytes | None = None) -> bool:
        """Release a registration; False if it was not registered (dropping twice is harmless)."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None or (key is not None and not secrets.compare_digest(entry.key, key)):
                return False
            self._release(entry)
        return True

    def ack(self, buffer_id: int, key: bytes) -> None:
        """A reader finished reading a bulk body; release it after the last expected one."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None or not secrets.compare_digest(entry.key, key):
                return
            if entry.readers is not None:
                entry.readers -= 1
                if entry.readers <= 0:
                    self._release(entry)

    def sweep(self, now: float | None = None) -> None:
        """Release expired bulk bodies and the memory of buffers dropped more than GRACE ago."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for entry in [e for e in self._entries.values() if e.expires and e.expires <= now]:
                self._release(entry)
            self._lingering = [(t, m) for t, m in self._lingering if t > now]

    def clear(self) -> None:
        with self._lock:
            for entry in list(self._entries.values()):
                self._release(entry)
            self._lingering.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _release(self, entry: Entry) -> None:  # with self._lock held
        self._words.set(entry.slot, 0)
        self._words.free.append(entry.slot)
        del self._entries[entry.buffer_id]
        if entry.memory.writable:
            self._lingering.append((time.monotonic() + GRACE, entry.memory))
        if self.on_release is not None:
            try:
                self.on_release(entry)
            except Exception:  # pragma: no cover - deregistration failures are only logged
                import logging

                logging.getLogger(__name__).exception("releasing buffer %d", entry.buffer_id)
