"""Where an actor's messages wait, and which thread handles them.

An actor handles one item at a time, in arrival order. Two runners do that:

* :class:`ThreadRunner`, for actors with any sync endpoint: the actor's own
  thread takes items straight from a thread-safe queue and runs sync
  endpoints inline, so a busy actor never waits for the event loop between
  messages (async endpoints of such an actor are run on the loop while the
  thread waits for them);
* :class:`LoopRunner`, for actors whose endpoints are all ``async``: a task on
  the proc's loop, with no thread hop at all.

Both take the same items: messages, ``Job`` (a call to make on the actor,
e.g. ``__init__`` or ``__cleanup__``), and the ``STOP`` sentinel.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from monarch.settings import settings

log = logging.getLogger(__name__)

STOP = object()


class Job:
    """Run ``fn(*args)`` in the actor's turn; ``done`` (a loop future) gets the outcome."""

    __slots__ = ("fn", "args", "done")

    def __init__(self, fn: Callable[..., Any], args: tuple, done: asyncio.Future) -> None:
        self.fn = fn
        self.args = args
        self.done = done


def _settle(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class ThreadRunner:
    """Items are handled on the actor's own thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        handle: Callable[[Any], None],
        post: Callable[..., None],
    ) -> None:
        self.loop = loop
        self._post = post  # the runtime's FIFO hand-over to the loop
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._handle = handle
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def put(self, item: Any) -> None:
        self._q.put(item)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """From the actor's thread: run ``fn(*args)`` on the loop, in the same order
        as everything else this thread hands over (sends to other actors too)."""
        self._post(fn, *args)

    def idle(self) -> bool:
        """From the actor's thread: nothing waits for it (the message it handles was the last)."""
        return self._q.empty()

    def run_async(self, coro: Awaitable[Any]) -> Any:
        """From the actor's thread: run a coroutine on the loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def _main(self) -> None:
        while True:
            item = self._q.get()
            if item is STOP:
                return
            if isinstance(item, Job):
                self._run_job(item)
                continue
            self._handle(item)

    def _run_job(self, job: Job) -> None:
        try:
            result = job.fn(*job.args)
            if asyncio.iscoroutine(result):
                result = self.run_async(result)
            self.post(_settle, job.done, True, result)
        except BaseException as e:
            self.post(_settle, job.done, False, e)

    def take_pending(self) -> list[Any]:
        items = []
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items

    def close(self) -> None:
        self._q.put(STOP)


class LoopRunner:
    """Items are handled by a task on the loop (actors whose endpoints are all async).

    A call (a message with a reply subject) delivered by a callback of the loop (the
    broker's intake, not a task) that finds the runner idle (nothing queued, nothing
    running) is started at once, as Python 3.12's eager tasks start: in the runner's
    context, with the runner's task as the current task, up to its first suspension.
    Most endpoints never suspend (``return x``): such a call is over before ``put``
    returns and the runner's task never wakes (a call to 8,192 actors -16-30%,
    benchmarks/NOTES.md 63). One that suspends is finished by the runner's task, before
    anything queued meanwhile. Everything else is queued as before: a message without
    a reply (sends come in floods, and a runner that takes its queued messages one
    after another handles a flood to a proc's 512 actors 3x faster than starting each
    as it comes, actor after actor: NOTES 63), and a message put from a task (an actor
    calling an actor of its own process), so one start never runs inside another.
    ``MONARCH_EAGER_START=0`` (``eager=False``) queues every message.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        handle: Callable[[Any], Awaitable[None]],
        eager: bool | None = None,
    ) -> None:
        self.loop = loop
        self._eager = settings().eager_start if eager is None else eager
        # A plain deque and one waiter rather than an asyncio.Queue: the queue's get and
        # put cost ~9% of a proc's CPU per message with 512 async actors (py-spy,
        # benchmarks/NOTES.md 58); this runner is the queue's only reader.
        self._q: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._handle = handle
        self._context = contextvars.copy_context()  # the runner's: set_context writes here
        self._task = loop.create_task(self._main(), name=name, context=self._context)

    def put(self, item: Any) -> None:
        """On the loop."""
        waiter = self._waiter
        if (
            self._eager
            and waiter is not None  # the runner waits for work: nothing queued, nothing running
            and not waiter.done()  # (done: its task was cancelled, or woken already)
            and getattr(item, "reply", None)  # a call (a Job or STOP has no reply subject)
            and _current_tasks.get(self.loop) is None  # from a callback, not from a task
        ):
            self._start(item)
            return
        self._q.append(item)
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def ready_to_start(self) -> bool:
        """Whether a call put now would be started at once: eager, idle (nothing queued,
        nothing running), and the loop is running a callback, not a task."""
        waiter = self._waiter
        return (
            self._eager
            and waiter is not None
            and not waiter.done()
            and _current_tasks.get(self.loop) is None
        )

    def step(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the runner's context with its task current: the first step of
        a handling begun outside the runner's task (:meth:`_start`,
        :mod:`monarch.actors.hosting.group_call`). Only while :meth:`ready_to_start`."""
        loop, task = self.loop, self._task
        _enter_task(loop, task)
        try:
            return self._context.run(fn, *args)
        finally:
            _leave_task(loop, task)

    def _start(self, item: Any) -> None:
        """Run ``item``'s handling up to its first suspension, as the runner's task would."""
        coro = self._handle(item)
        try:
            yielded = self.step(coro.send, None)
        except StopIteration:
            return  # over already: the common case
        except BaseException:  # the handler catches an endpoint's errors: this is ours
            log.exception("%s: handling a message failed", self._task.get_name())
            return
        self.go_on(coro, yielded)

    def go_on(self, coro: Coroutine, yielded: Any) -> None:
        """A handling begun with :meth:`step` that suspended on ``yielded``: the runner's
        task finishes it, before anything queued meanwhile."""
        self._q.appendleft(Resume(coro, yielded))
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _main(self) -> None:
        q = self._q
        try:
            while True:
                if not q:
                    self._waiter = self.loop.create_future()
                    await self._waiter
                    continue
                item = q.popleft()
                if item is STOP:
                    return
                if type(item) is Resume:
                    await item
                    continue
                if isinstance(item, Job):
                    await self._run_job(item)
                    continue
                await self._handle(item)
        finally:
            if q and type(q[0]) is Resume:  # cancelled before it went on with a begun handling
                q.popleft().cancel()

    async def _run_job(self, job: Job) -> None:
        try:
            if asyncio.iscoroutinefunction(job.fn):
                result = await job.fn(*job.args)
            else:  # a sync hook must not block the loop
                result = await self.loop.run_in_executor(None, job.fn, *job.args)
            _settle(job.done, True, result)
        except BaseException as e:
            _settle(job.done, False, e)

    def take_pending(self) -> list[Any]:
        items = list(self._q)
        self._q.clear()
        return items

    def close(self) -> None:
        self.put(STOP)

    def cancel(self) -> None:
        self._task.cancel()


class Resume:
    """The rest of a handling that :meth:`LoopRunner._start` began and that suspended:
    awaited by the runner's task, it drives the coroutine on as the task would have."""

    __slots__ = ("coro", "yielded")

    def __init__(self, coro: Any, yielded: Any) -> None:
        self.coro = coro
        self.yielded = yielded  # what its first step yielded (the future it waits on)

    def cancel(self) -> None:
        """Its runner ended before going on with it: it ends as a cancelled handling does."""
        if isinstance(self.yielded, asyncio.Future):
            self.yielded.cancel()  # what it waits on, as a task's cancel does
        try:
            self.coro.throw(asyncio.CancelledError())
        except BaseException:  # CancelledError, or what the handling raised instead
            return
        try:  # it swallowed the cancel and waits again: closed (as a destroyed task's)
            self.coro.close()
        except BaseException:
            log.exception("a handling its runner left behind would not close")

    def __await__(self) -> Any:
        coro, yielded = self.coro, self.yielded
        while True:
            try:
                yield yielded
            except BaseException as e:  # the runner's task was cancelled: so is the handling
                try:
                    yielded = coro.throw(e)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coro.send(None)
                except StopIteration as done:
                    return done.value


# What Python 3.12's eager tasks use to make a task current for its first step
# (asyncio's own, C-accelerated; present since 3.7): the loop -> its current task.
_current_tasks = asyncio.tasks._current_tasks  # noqa: SLF001
_enter_task = asyncio.tasks._enter_task  # noqa: SLF001
_leave_task = asyncio.tasks._leave_task  # noqa: SLF001
