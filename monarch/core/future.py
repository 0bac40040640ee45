"""``Future``: one result that sync code can ``.get()`` and async code can ``await``.

The runtime's event loop runs on its own thread in the client, and on the
main thread of a proc, so a future is completed on that loop but waited on
from anywhere: a plain script's thread, an actor's endpoint thread, or any
asyncio loop. A ``concurrent.futures.Future`` underneath makes that safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class _ThreadMark(threading.local):
    """Whether the calling thread runs a runtime loop. Thread-local, not a set of
    thread ids: an ended thread's id is soon reused by a new thread, which must
    not inherit the mark."""

    loop = False


_thread_mark = _ThreadMark()
_coro_loop: asyncio.AbstractEventLoop | None = None
_coro_loop_lock = threading.Lock()


def _coroutine_loop() -> asyncio.AbstractEventLoop:
    """The event loop (on a daemon thread, started on first use) of ``Future._from_coro``."""
    global _coro_loop
    with _coro_loop_lock:
        if _coro_loop is None or _coro_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="monarch-future-coroutines", daemon=True
            ).start()
            _coro_loop = loop
        return _coro_loop


def mark_loop_thread() -> None:
    """Record that the calling thread runs a runtime loop (blocking there would deadlock)."""
    _thread_mark.loop = True


def on_loop_thread() -> bool:
    """Whether the calling thread runs a runtime loop (see :func:`mark_loop_thread`)."""
    return _thread_mark.loop


class Future(Generic[R]):
    """The eventual result of a message, call or operation.

    ``get(timeout)`` blocks the calling thread; on timeout it raises
    ``TimeoutError`` and the future stays usable (a later ``get`` or ``await``
    still sees the result). ``await future`` works on any event loop.
    Calling ``get`` on the runtime's own loop thread (inside an ``async``
    endpoint) raises ``RuntimeError`` instead of deadlocking: ``await`` there.
    """

    __slots__ = ("_cf",)

    def __init__(self, cf: concurrent.futures.Future | None = None) -> None:
        if cf is None:
            cf = concurrent.futures.Future()
            # A running cf cannot be cancelled: an awaiter that gives up (wait_for's
            # timeout, a cancelled task) cancels its asyncio wrapper, which would
            # otherwise cancel this outcome for every waiter and drop the result.
            cf.set_running_or_notify_cancel()
        self._cf: concurrent.futures.Future = cf

    # -- completing (whoever produces the value) -------------------------

    def set_result(self, value: Any) -> None:
        """Complete with ``value``; a no-op when already complete (the first outcome wins)."""
        if not self._cf.done():
            self._cf.set_result(value)

    def set_exception(self, exc: BaseException) -> None:
        """Complete with ``exc``, raised by ``get``/``await``; a no-op when already complete."""
        if not self._cf.done():
            self._cf.set_exception(exc)

    def _done(self) -> bool:
        return self._cf.done()

    @classmethod
    def from_value(cls, value: Any) -> Future:
        f: Future = cls()
        f.set_result(value)
        return f

    @classmethod
    def _from_coro(cls, coro: Coroutine[Any, Any, Any]) -> Future:
        """A future of a coroutine's result, run on a loop thread of its own.

        Monarch's private constructor, which scripts and tests use to make a
        future that is not a message's. Not the runtime's loop: no broker is
        needed, and a slow coroutine holds up no actor.
        """
        return cls(asyncio.run_coroutine_threadsafe(coro, _coroutine_loop()))

    # -- waiting (user side) ---------------------------------------------

    def get(self, timeout: float | None = None) -> R:
        if not self._cf.done() and _thread_mark.loop:
            raise RuntimeError(
                "Future.get() would block the actor runtime's event loop (inside an async "
                "endpoint or callback); use `await future` there instead"
            )
        try:
            return self._cf.result(timeout)
        except concurrent.futures.TimeoutError:
            if self._cf.done():
                raise  # the result itself is a TimeoutError (on 3.11 the two are one class)
            raise TimeoutError(f"future not done after {timeout} s") from None

    def result(self, timeout: float | None = None) -> R:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            return e
        return None

    def done(self) -> bool:
        return self._cf.done()

    def add_callback(self, fn: Callable[[Future[R]], Any]) -> None:
        self._cf.add_done_callback(lambda _cf: fn(self))

    def as_asyncio(self) -> asyncio.Future:
        """An ``asyncio.Future`` on the running loop that completes with this one."""
        return asyncio.wrap_future(self._cf)

    def __await__(self) -> Generator[Any, None, R]:
        return asyncio.wrap_future(self._cf).__await__()

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<monarch Future {state}>"
