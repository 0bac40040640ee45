"""The receiving side of one actor: how its messages are handled, and its life.

Messages arrive from the ordered intake and are handled one at a time, in
arrival order, by the actor's runner (see :mod:`monarch.actors.hosting.mailbox`): sync
endpoints run on the actor's own thread, so they may block (even on another
actor's ``.get()``) without stalling the proc's loop; async endpoints run on
the loop. ``@concurrent_endpoint`` methods are the exception: they start in
order but run side by side.

An actor *fails* when an exception has nowhere else to go: a ``broadcast``
(no caller), an explicit-response-port endpoint that raises, an unhandled
failure of a mesh it owns, or a ``BaseException`` that is not an ``Exception``
(``SystemExit``, ``KeyboardInterrupt``) from any endpoint, as in Monarch: its
caller gets :class:`SupervisionError`, not ``ActorError``. A failed actor answers
every later call with :class:`SupervisionError`, stops what it owns, runs ``__cleanup__(exc)``, and
is reported to its owner (``on_failure``).

This module holds the actor's life (construction, stop, failure); its other
parts are mixins, one idea each: :mod:`~monarch.actors.hosting.delivery` (a
message enters the mailbox; the lost-message check),
:mod:`~monarch.actors.hosting.dispatch` (handling one item, on the actor's thread
or on the loop) and :mod:`~monarch.actors.hosting.reply` (answering callers).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.calls import activity
from monarch.actors.calls.context import Context, CreatorInstance, Instance, set_context
from monarch.actors.calls.endpoint import EndpointProperty, endpoints_of
from monarch.actors.errors import SupervisionError
from monarch.actors.hosting.delivery import Delivery
from monarch.actors.hosting.dispatch import Dispatch
from monarch.actors.hosting.init_thread import construct_on_thread
from monarch.actors.hosting.mailbox import Job, LoopRunner, ThreadRunner
from monarch.actors.hosting.reply import Replying, failure_reason
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.messaging.lost_sends import SequenceCheck
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)


class ActorInstance(Delivery, Dispatch, Replying):
    """One live actor in this proc."""

    # Where its proc's server keeps it: the mesh uid, or ``<uid>[<rank>]`` for an actor
    # of a ``per_proc`` mesh (several here); set when it is placed.
    server_key = ""

    def __init__(
        self,
        rt: Runtime,
        *,
        name: str,
        uid: str,
        rank: int,
        extent: Extent,
        cls: type,
        proc_mesh: Any = None,
        creator: CreatorInstance | None = None,
    ) -> None:
        self.rt = rt
        self.name = name
        self.uid = uid
        self.rank = rank
        self.extent = extent
        self.cls = cls
        self.actor_id = f"{name}.{uid}[{rank}]"
        self.endpoints: dict[str, EndpointProperty] = endpoints_of(cls)
        self.point = Point(rank, extent)
        self.info = Instance(
            actor_id=self.actor_id,
            name=name,
            rank=self.point,
            proc_uid=rt.proc_uid,
            _stop=self.request_stop,
            _abort=self.abort,
            _proc_mesh=proc_mesh,  # context().actor_instance.proc_mesh
            class_name=f"{cls.__module__}.{cls.__qualname__}",
            creator=creator,
        )
        # Its context for a message sent to its whole mesh (most are): made once, so a
        # runner whose context holds it already need not set it again (use_context).
        self.own_context = Context(self.info, self.point)
        self.obj: Any = None
        self.subscriptions: list[Any] = []
        self.failed: BaseException | None = None
        self.on_failure: Callable[[ActorInstance, BaseException], None] | None = None
        self.on_stopped: Callable[[ActorInstance], None] | None = None
        self.owner_proc = ""  # where this actor's owner lives (the proc uid)
        self.owner_actor = ""  # the owner's actor id ("client" for the root)
        self._concurrent: set[asyncio.Task] = set()
        self._stopping = False  # no new messages are taken
        self._stop_requested = False
        self._done = False  # stop or failure handling has begun
        self._constructing = False  # __init__ is queued or running
        self._unhandled = False  # __supervise__ left a failure unhandled: the actor fails
        self._sequence = SequenceCheck()  # holes in senders' numbering: lost messages
        self._flow_senders = 1  # the count for the flow marker being handled
        self._flow_prop = EndpointProperty(self._flow_marker)
        self._whole_group: dict[str, bool] = {}  # subject -> _to_whole_group's answer
        # What it is doing, for viewers (monarch top, monarch stacks, stall reports).
        self.activity = activity.book.add(
            self.actor_id, name, uid, rank,
            getattr(cls, "__qualname__", str(cls)), dict(extent),
        )  # fmt: skip
        label = f"actor {self.actor_id}"
        if any(not p.is_async for p in self.endpoints.values()):
            self._runner: ThreadRunner | LoopRunner = ThreadRunner(
                rt.loop, label, self._on_thread, rt.call_soon
            )
        else:
            self._runner = LoopRunner(rt.loop, label, self._on_loop)

    # -- lifecycle ----------------------------------------------------------

    async def call_on_actor(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the actor's turn (on its thread for sync code)."""
        return await self._queue_call(fn, *args)

    def _queue_call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Queue ``fn(*args)`` in the actor's mailbox now; the future gets its outcome."""
        done = self.rt.loop.create_future()
        if asyncio.iscoroutinefunction(fn):  # e.g. ``async def __cleanup__``: awaited on the loop

            async def in_context(*a: Any) -> Any:
                set_context(Context(self.info, self.point))
                return await fn(*a)

        else:

            def in_context(*a: Any) -> Any:
                set_context(Context(self.info, self.point))
                return fn(*a)

        self._runner.put(Job(in_context, args, done))
        return done

    async def construct(self, args: tuple, kwargs: dict) -> None:
        """Run ``__init__`` in the actor's turn; raises what it raises."""
        await self.begin_construct(args, kwargs)

    def begin_construct(self, args: tuple, kwargs: dict) -> asyncio.Future:
        """Queue ``__init__`` as the first item of the mailbox; the future: it has run.

        Messages delivered meanwhile wait behind it, as they wait behind
        Monarch's init message, and are refused if it raises. A sync actor
        runs it on its own thread; an async actor on a thread of its own too
        (:mod:`monarch.actors.hosting.init_thread`), so that an ``__init__`` that
        blocks, or never returns, holds only this actor, not its proc's loop.
        """

        async def own_thread() -> Any:
            return await construct_on_thread(
                self.rt.loop, lambda: self.cls(*args, **kwargs), f"actor {self.actor_id}"
            )

        def on_thread() -> Any:
            return self.cls(*args, **kwargs)

        build = own_thread if isinstance(self._runner, LoopRunner) else on_thread
        self._constructing = True
        return asyncio.ensure_future(self._finish_construct(self._queue_call(build)))

    async def _finish_construct(self, built: asyncio.Future) -> None:
        try:
            obj = await built
        except BaseException as e:
            self._constructing = False
            if self.failed is None:
                self.failed = e  # messages that came meanwhile are refused, saying why
            self._runner.close()
            self.activity.failed(f"__init__ raised {type(e).__name__}: {e}")
            self.activity.stopped()  # it is never served
            raise
        self._constructing = False
        self.obj = obj
        self.info._actor = obj
        if self._done:  # stopped while __init__ ran: nothing will serve it
            self._release()
            return
        self.activity.serving()

    def request_stop(self) -> None:
        """``context().actor_instance.stop()``: stop after the current message."""
        self._stop_requested = True

    def abort(self, reason: str | None = None) -> None:
        """``context().actor_instance.abort(reason)``: fail this actor, as in Monarch.

        Callable from the actor's own code (any thread). The endpoint that calls
        it still finishes; then the actor refuses further messages, cleans up,
        and its owner's ``__supervise__`` sees the failure with ``reason``.
        """
        err = SupervisionError(
            f"actor {self.actor_id} ({self.cls.__name__}) aborted: "
            f"{reason if reason is not None else 'no reason provided'}",
            actor_id=self.actor_id,
            rank=self.rank,
        )
        self.rt.call_soon(self.fail, err)

    async def stop(self, timeout: float, exc: BaseException | None = None) -> None:
        """Handle what is already queued, cancel concurrent tasks, stop owned meshes,
        run ``__cleanup__``. Bounded by ``timeout``: a mailbox that does not drain in
        time is cut off and its waiting callers get an error."""
        if self._done:  # failed earlier: cleanup already ran
            await self._unsubscribe()
            self._close_runner()
            self._release()
            self.activity.stopped()
            return
        self._done = True
        await self._unsubscribe()
        drained = self.rt.loop.create_future()
        # A marker the runner reaches after what is queued. On the loop it is a coroutine:
        # a sync one goes through the default executor, which refuses work once the
        # interpreter is exiting, and a this_proc() per_proc mesh left running at exit
        # never stopped ("Task was destroyed but it is pending!" once per actor).
        on_loop = isinstance(self._runner, LoopRunner)
        self._runner.put(Job(_reached_on_loop if on_loop else _reached, (), drained))
        try:
            if self._constructing:  # behind an __init__ still running: not reached in time
                raise asyncio.TimeoutError
            await asyncio.wait_for(asyncio.shield(drained), timeout)
        except asyncio.TimeoutError:
            log.warning("actor %s did not finish its mailbox in %.1f s", self.actor_id, timeout)
            if isinstance(self._runner, LoopRunner):
                self._runner.cancel()
        self._stopping = True
        for left in self._runner.take_pending():
            if isinstance(left, Msg) or hasattr(left, "data"):
                self._refuse(left)
        await self._cancel_concurrent()
        await self._stop_owned()
        if drained.done():
            await self._cleanup(exc)
        self._close_runner()
        self._release()
        self.activity.stopped()
        if self.on_stopped is not None:
            self.on_stopped(self)

    def _close_runner(self) -> None:
        self._runner.close()
        if isinstance(self._runner, LoopRunner):
            self._runner.cancel()

    async def _stop_owned(self) -> None:
        """Meshes this actor spawned stop before it cleans up (children first)."""
        for owned in reversed(self.info.owned):
            try:
                await owned.stop()
            except Exception:
                log.exception("stopping a mesh owned by %s failed", self.actor_id)
        self.info.owned.clear()

    async def _unsubscribe(self) -> None:
        subs, self.subscriptions = self.subscriptions, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def _cancel_concurrent(self) -> None:
        tasks = list(self._concurrent)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _release(self) -> None:
        """Drop the actor object, so that its ``__del__`` runs before the proc exits."""
        obj, self.obj, self.info._actor = self.obj, None, None
        if obj is None:
            return
        try:
            alive = weakref.ref(obj)
        except TypeError:  # a class with __slots__ and no __weakref__: nothing to check
            return
        del obj
        if alive() is not None:  # held by a reference cycle: collect it now
            gc.collect()

    async def _cleanup(self, exc: BaseException | None) -> None:
        hook = getattr(self.obj, "__cleanup__", None)
        if hook is None:
            return
        try:
            await self.call_on_actor(hook, exc)
        except asyncio.CancelledError:
            raise
        except BaseException:  # SystemExit too: it must not escape onto the proc's loop
            log.exception("__cleanup__ of %s raised", self.actor_id)

    def fail(self, exc: BaseException) -> None:
        """The actor cannot go on (loop only): refuse further messages, clean up, tell the owner."""
        if self.failed is not None or self._done:
            return
        self.failed = exc
        # INFO, as Monarch 0.7 keeps it out of the terminal: the failure goes to the owner
        # (with its traceback), and one nobody handles is printed once, by the client.
        log.info("actor %s failed: %r", self.actor_id, exc)
        self.activity.failed(failure_reason(self.actor_id, exc))
        self.rt.loop.create_task(self._after_failure(exc))

    async def _after_failure(self, exc: BaseException) -> None:
        # Subscriptions stay: until the actor is stopped, callers get a clear
        # SupervisionError instead of silence.
        self._done = True
        await self._cancel_concurrent()
        await self._stop_owned()
        await self._cleanup(exc)
        if self.on_failure is not None:
            self.on_failure(self, exc)


def _reached() -> None:
    """The mailbox marker of :meth:`ActorInstance.stop` (a thread actor's)."""


async def _reached_on_loop() -> None:
    """The mailbox marker of :meth:`ActorInstance.stop` (an actor on the loop)."""
