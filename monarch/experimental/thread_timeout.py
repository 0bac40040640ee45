"""``ThreadTimeout``: a deadline for synchronous Python code on any thread.

Why it exists: sync endpoints run on threads of their proc, and the usual
timeout, ``signal.alarm``, reaches only the main thread. This raises
:class:`ThreadTimeoutError` inside the thread that entered the ``with``
block, through CPython's ``PyThreadState_SetAsyncExc``: the exception lands
at the thread's next bytecode, so a long native call (``time.sleep``, a
C extension) is interrupted only when it returns to Python. Use
``finally``/``with`` for cleanup, as for ``KeyboardInterrupt``.

The error is a ``BaseException`` so that an ``except Exception`` in the
guarded code does not swallow it; and if the code swallows it anyway, the
``with`` block raises it again on exit. One guard per thread at a time (the
interpreter has one pending-exception slot per thread), each guard used once.
Keep ``await`` out of the block: the deadline targets the thread, which runs
other tasks while this one waits.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from types import TracebackType

__all__ = ["ThreadTimeout", "ThreadTimeoutError"]

_guarded = threading.local()  # .on: a guard is active on this thread


class ThreadTimeoutError(BaseException):
    """Raised in a thread whose :class:`ThreadTimeout` deadline passed."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> int:
    """Schedule ``exc`` in the thread (None clears it); how many threads it reached."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class ThreadTimeout:
    """``with ThreadTimeout(seconds):`` raises :class:`ThreadTimeoutError` in this thread at the deadline."""

    def __init__(self, seconds: float) -> None:
        if sys.implementation.name != "cpython":
            raise RuntimeError("ThreadTimeout needs CPython (it uses PyThreadState_SetAsyncExc)")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"ThreadTimeout takes a positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self._thread: int | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._done = False
        self.fired = False  # whether the deadline passed inside the block

    def _expire(self) -> None:
        with self._lock:  # never fire into a thread that has already left the block
            if self._done or self._thread is None:
                return
            self.fired = _raise_in(self._thread, ThreadTimeoutError) == 1

    def __enter__(self) -> ThreadTimeout:
        if self._thread is not None:
            raise RuntimeError("a ThreadTimeout is used once: make a new one")
        if getattr(_guarded, "on", False):
            raise RuntimeError("ThreadTimeout blocks cannot be nested on one thread")
        _guarded.on = True
        self._thread = threading.get_ident()
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _guarded.on = False
        assert self._timer is not None and self._thread is not None
        self._timer.cancel()
        with self._lock:
            self._done = True
            if self.fired:
                _raise_in(self._thread, None)  # not yet delivered: take it back
        if self.fired and exc_type is None:
            raise ThreadTimeoutError(f"the block ran past its {self.seconds:g} s deadline")
