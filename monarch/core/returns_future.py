"""``@returns_future``: an ``async def`` that sync callers ``.get()`` and async callers await.

Monarch 0.7's decorator. A library function written once as a coroutine is
handed to both kinds of caller as a :class:`~monarch.core.future.Future`.
As in Monarch, calling the function does not start its body: the first
observer does, so a future nobody looks at runs none of the body's code
(put side effects that must happen at the call in a plain wrapper around it).

Where the body runs, here:

* ``await f`` / ``f.as_asyncio()``: as a task on the awaiting loop (an async
  endpoint's loop, a user's ``asyncio.run``);
* ``f.get()``: on the helper loop thread that ``Future._from_coro`` uses
  (Monarch runs it on a loop of the calling thread; the difference shows only
  to code that inspects which thread it runs on). Its timeout leaves the body
  running, as for every Future of ours, so a later ``get`` still sees the result.

The body runs in a copy of the caller's context variables taken at the call,
so it sees the calling actor's ``context()``. Inside a body, ``await`` other
such futures: a ``.get()`` of one there would wait on the loop it blocks, so
it raises ``RuntimeError`` instead (Monarch raises its ``WouldBlockRuntime``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, ParamSpec, TypeVar

from monarch.core import future as _future
from monarch.core.future import Future, _coroutine_loop, on_loop_thread

P = ParamSpec("P")
R = TypeVar("R")

_running: set[asyncio.Task] = set()  # asyncio keeps tasks weakly: started bodies live here


class _DeferredFuture(Future[R]):
    """A Future whose coroutine starts when it is first observed."""

    __slots__ = ("_body", "_context", "_lock")

    def __init__(self, body: Coroutine[Any, Any, R], context: contextvars.Context) -> None:
        super().__init__()
        self._body: Coroutine[Any, Any, R] | None = body
        self._context = context
        self._lock = threading.Lock()

    def _take_body(self) -> Coroutine[Any, Any, R] | None:
        with self._lock:
            body, self._body = self._body, None
        return body

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the body (if not yet started) as a task on ``loop``; call on ``loop``'s thread."""
        body = self._take_body()
        if body is None:
            return
        task = loop.create_task(body, context=self._context)
        _running.add(task)
        task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task) -> None:
        _running.discard(task)
        if task.cancelled():
            self.set_exception(asyncio.CancelledError())
        elif task.exception() is not None:
            self.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            self.set_result(task.result())

    def get(self, timeout: float | None = None) -> R:
        if not self._cf.done() and _on_helper_loop():
            # Its body would be queued behind the very body that now blocks: a deadlock.
            # The future fails with the error; a body not yet started never will.
            error = RuntimeError(
                "Future.get() of a @returns_future function inside another one's body "
                "would deadlock: await it there instead"
            )
            body = self._take_body()
            if body is None:
                raise error  # started elsewhere: its outcome stays its own
            body.close()
            self.set_exception(error)
        if self._body is not None and not on_loop_thread():
            loop = _coroutine_loop()
            loop.call_soon_threadsafe(self._start_on, loop)
        return super().get(timeout)

    def as_asyncio(self) -> asyncio.Future:
        self._start_on(asyncio.get_running_loop())
        return super().as_asyncio()

    def __await__(self) -> Generator[Any, None, R]:
        return self.as_asyncio().__await__()

    def __del__(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:
            body.close()  # never observed: none of its code runs (and no "never awaited" warning)


def _on_helper_loop() -> bool:
    """Whether the calling code runs on the helper loop that ``get()`` runs bodies on."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return running is _future._coro_loop


def returns_future(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Future[R]]:
    """Make the ``async def`` ``fn`` return a :class:`Future` of its result (see the module)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@returns_future needs an async def, got {fn!r}")

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Future[R]:
        return _DeferredFuture(fn(*args, **kwargs), contextvars.copy_context())

    return wrapper
