"""``monarch.Stream``: Monarch's named op queues, run here as one queue per proc.

In Monarch, ops issued inside ``with stream.activate():`` run on that
stream, concurrently with other streams, and a tensor crosses streams by
``stream.borrow(t)``. This engine runs every op of a mesh on one queue per
proc, in the order the client issued them, which is one of the orders
Monarch's streams may run them in: a program that follows Monarch's borrow
rules computes the same values here, without the overlap. What is *not*
done: ops of two streams never overlap, and using a tensor on a stream it
was not borrowed to is not detected (Monarch raises for it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_local = threading.local()


class Stream:
    """A named stream; ``with s.activate():`` makes it the active one (nesting restores)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        self.name = name
        self.default = _default

    def __repr__(self) -> str:
        return f"<Stream({self.name!r}) at {hex(id(self))}>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        previous = get_active_stream()
        _local.active = self
        try:
            yield
        finally:
            _local.active = previous

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """``t`` for use on this stream, and the borrow to ``drop()`` when done.

        With one queue per proc the borrowed tensor is ``t`` itself (same
        storage, as in Monarch); ``drop()`` ends the borrow.
        """
        return t, Borrow(t, self, mutable)


class Borrow:
    """A tensor lent to another stream; :meth:`drop` returns it (idempotent)."""

    def __init__(self, tensor: Any, stream: Stream, mutable: bool) -> None:
        self.tensor = tensor
        self.stream = stream
        self.mutable = mutable
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


_MAIN = Stream("main", _default=True)


def get_active_stream() -> Stream:
    """The stream ops are issued on: the ``main`` stream unless another is active."""
    return getattr(_local, "active", _MAIN)
