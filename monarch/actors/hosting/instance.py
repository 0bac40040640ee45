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
caller gets :class:`SupervisionError`, not ``ActorError``. A failed actor answers every later call with
:class:`SupervisionError`, stops what it owns, runs ``__cleanup__(exc)``, and
is reported to its owner (``on_failure``).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import traceback as tb
import weakref
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.calls import activity
from monarch.actors.calls.activity import call_listeners, tell_later
from monarch.actors.calls.context import Context, CreatorInstance, Instance, set_context
from monarch.actors.calls.endpoint import EndpointProperty, endpoints_of
from monarch.actors.calls.ports import Port
from monarch.actors.errors import (
    MalformedMessageError,
    MeshStoppedError,
    MessageLostError,
    SupervisionError,
    actor_failed_message,
    describe_actor,
)
from monarch.actors.hosting.init_thread import construct_on_thread
from monarch.actors.hosting.mailbox import Job, LoopRunner, ThreadRunner
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT
from monarch.actors.messaging.lost_sends import SequenceCheck
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import CodecError, dumps
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import decode_body, fetch_async, offload, stays_inline
from monarch.supervision.failure import MeshFailure, SupervisionFailure

log = logging.getLogger(__name__)

ADHOC = hdr.ADHOC  # the caller used as_endpoint() on a plain method


class _Supervise:
    __slots__ = ("failure",)

    def __init__(self, failure: MeshFailure) -> None:
        self.failure = failure


class ActorInstance:
    """One live actor in this proc."""

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

    def deliver(self, msg: Msg) -> None:
        """Called by the intake, in wire order, on the loop."""
        hole = self._sequence.check(msg)
        if hole is not None and self._lost_before(msg, *hole):
            return
        headers = msg.headers
        if headers and headers.get(m.KIND) == "sync":
            return  # a sender's count so far: checked, nothing to run
        if call_listeners:  # someone records calls: when this one arrived
            try:
                msg._mon_delivered = activity.wall_now()  # type: ignore[attr-defined]
            except AttributeError:  # a message type with no room for it: time unknown
                pass
        replies = actor_process(self.rt).replies
        if msg.reply and replies is not None:
            replies.received(msg.reply, self.rank)  # a caller may ask about it later
        if self._stopping or self.failed is not None:
            self._refuse(msg)
            return
        self._runner.put(msg)

    def _lost_before(self, msg: Msg, sender: str, count: int) -> bool:
        """Messages from ``sender`` were lost before ``msg``: tell it; True if ``msg`` is refused.

        A call is refused, so that its caller learns at once; anything else is
        handled, and the sender's process is told (its next call on the mesh raises).
        """
        headers = msg.headers or {}
        log.warning(
            "actor %s: %d message(s) from %s on %s were lost on the way (a broker node died?)",
            self.actor_id, count, sender, msg.subject,
        )  # fmt: skip
        if msg.reply and headers.get(m.KIND) == "call" and headers.get(m.ENDPOINT) != FLOW_ENDPOINT:
            err = MessageLostError(
                f"{count} earlier message(s) from this process to {self.actor_id} were lost on "
                "the way (a broker node died?), so this call was not run there",
                mesh=self.name,
                counts={self.rank: count},
            )
            actor_process(self.rt).replies.received(msg.reply, self.rank)
            self._publish_reply(msg.reply, "error", m.encode_error(err))
            return True
        notice = dumps([self.uid, self.rank, count, msg.subject])
        self.rt.publish(
            subjects.ctl_proc(self.rt.namespace, sender),
            notice,
            {m.KIND: "lost", m.FROM: self.actor_id},
        )
        return False

    def supervise(self, failure: MeshFailure) -> None:
        """A mesh this actor owns failed: run ``__supervise__``.

        An async actor hears of it at once, beside an endpoint that is awaiting
        (as Monarch's control items run first): left unhandled, the actor fails
        now and callers waiting on it learn so, instead of when that endpoint
        ends. A sync actor's thread runs it after the message it is handling.
        """
        if self._done or self.failed is not None:
            return
        if isinstance(self._runner, LoopRunner):
            self.rt.loop.create_task(self._on_loop(_Supervise(failure)))
        else:
            self._runner.put(_Supervise(failure))

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
        self._runner.put(Job(lambda: None, (), drained))
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
        log.error("actor %s failed: %r", self.actor_id, exc)
        self.activity.failed(_failure_reason(self.actor_id, exc))
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

    # -- handling: on the actor's thread (ThreadRunner) --------------------------------

    def _on_thread(self, item: Any) -> None:
        runner: ThreadRunner = self._runner  # type: ignore[assignment]
        if isinstance(item, _Supervise):
            if self._unhandled:
                return  # failing already: later events of the same failure are not offered
            handled, error = self._supervise_sync(item.failure)
            self._unhandled = error is not None or not handled
            runner.post(self._after_supervise, item.failure, handled, error)
        elif self.failed is not None:
            runner.post(self._refuse, item)
        else:
            prop = self._endpoint_for(item)
            if prop is None:
                runner.post(self._respond_unknown, item)
            elif prop.concurrent:
                runner.post(self._start_concurrent, prop, item)
            else:
                # Recording finished calls (telemetry): their records are made after
                # the reply is written, off its latency path (benchmarks/NOTES.md 47).
                later: list[tuple] | None = [] if call_listeners else None
                if prop.is_async:
                    ok, body, at = runner.run_async(self._invoke_async(prop, item))
                else:
                    ok, body, at = self._invoke_sync(prop, item, later)
                if not (ok and self._reply_from_thread(item, body, prop, at)):
                    runner.post(self._respond, item, ok, body, prop, at)
                if later:
                    tell_later(later)
        if self._stop_requested:
            self._stop_requested = False
            runner.post(self._stop_soon)

    def _supervise_sync(self, failure: MeshFailure) -> tuple[bool, BaseException | None]:
        hook = getattr(self.obj, "__supervise__", None)
        if hook is None:
            return False, None
        try:
            set_context(Context(self.info, self.point))
            result = hook(failure)
            if asyncio.iscoroutine(result):
                result = self._runner.run_async(result)  # type: ignore[union-attr]
            return bool(result), None
        except BaseException as e:  # SystemExit too: it must not end the actor's thread
            return False, e

    # -- handling: on the loop (LoopRunner) -------------------------------------------

    async def _on_loop(self, item: Any) -> None:
        if isinstance(item, _Supervise):
            if self._unhandled:
                return  # failing already: later events of the same failure are not offered
            handled, error = await self._supervise_async(item.failure)
            self._unhandled = error is not None or not handled
            self._after_supervise(item.failure, handled, error)
        elif self.failed is not None:
            self._refuse(item)
        else:
            prop = self._endpoint_for(item)
            if prop is None:
                self._respond_unknown(item)
            elif prop.concurrent:
                self._start_concurrent(prop, item)
            else:
                await self._run_one(prop, item)
        if self._stop_requested:
            self._stop_requested = False
            self._stop_soon()

    async def _supervise_async(self, failure: MeshFailure) -> tuple[bool, BaseException | None]:
        hook = getattr(self.obj, "__supervise__", None)
        if hook is None:
            return False, None
        try:
            if asyncio.iscoroutinefunction(hook):
                set_context(Context(self.info, self.point))
                return bool(await hook(failure)), None
            ctx = contextvars.copy_context()  # the executor's thread has none of ours
            ctx.run(set_context, Context(self.info, self.point))
            return bool(await self.rt.loop.run_in_executor(None, ctx.run, hook, failure)), None
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # SystemExit too: it must not escape onto the proc's loop
            return False, e

    # -- handling: shared, on the loop --------------------------------------------------

    def _after_supervise(
        self, failure: MeshFailure, handled: bool, error: BaseException | None
    ) -> None:
        if error is not None:  # raising is a new failure, caused by the one being handled
            self.fail(SupervisionFailure(_wrap(failure, error)))
        elif not handled:
            self.fail(SupervisionFailure(failure))

    def _stop_soon(self) -> None:
        if not self._done:
            self.rt.loop.create_task(self.stop(self.rt.settings.stop_timeout))

    def _start_concurrent(self, prop: EndpointProperty, msg: Msg) -> None:
        task = self.rt.loop.create_task(self._run_one(prop, msg))
        self._concurrent.add(task)
        task.add_done_callback(self._concurrent.discard)

    async def _run_one(self, prop: EndpointProperty, msg: Msg) -> None:
        if prop.is_async:
            ok, body, at = await self._invoke_async(prop, msg)
        else:  # a sync concurrent or ad-hoc endpoint: a worker thread, never the loop
            ok, body, at = await self.rt.loop.run_in_executor(None, self._invoke_sync, prop, msg)
        self._respond(msg, ok, body, prop, at)

    def _endpoint_for(self, msg: Msg) -> EndpointProperty | None:
        headers = msg.headers or {}
        name = headers.get(m.ENDPOINT, "")
        prop = self.endpoints.get(name)
        if prop is None and name == FLOW_ENDPOINT:
            # A sender's flow marker: answered when reached, in order, with how many
            # processes send to this proc (monarch.core.flow_answers).
            if msg.reply:
                self._flow_senders = self.rt.flow_answers.heard(msg.reply)
            return self._flow_prop
        if prop is None and headers.get(ADHOC) and not name.startswith("_"):
            method = getattr(self.cls, name, None)
            if callable(method):  # the caller opted in with as_endpoint()
                prop = EndpointProperty(method, explicit_response_port=headers.get(ADHOC) == "port")
                self.endpoints[name] = prop
        return prop

    def _flow_marker(self, _actor: Any) -> int:
        """The ``__flow__`` endpoint: its answer, set when the marker was reached."""
        return self._flow_senders

    def _prepare(
        self, prop: EndpointProperty, msg: Msg, data: bytes | None = None
    ) -> tuple[tuple, dict, int]:
        """The call's arguments, and this actor's rank in the mesh (or slice) it was sent to."""
        # A big message arrives as a reference to its bytes (monarch.rdma.bulk): fetch them.
        try:
            # A fetched big body is ours alone: tensors in it are used in place.
            if data is None:
                args, kwargs, view_spec = decode_body(msg.data)
            else:
                args, kwargs, view_spec = decode_body(data, owned=data is not msg.data)
            if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
                raise TypeError("the body is not (args, kwargs, view)")
            if view_spec is not None:
                labels, sizes, ranks = view_spec
                message_point = Point(ranks.index(self.rank), Extent(labels, sizes))
        except Exception as e:  # the message is at fault, not the actor: it lives on
            raise MalformedMessageError(
                f"{self.actor_id} could not read a message for {prop.name!r} on {msg.subject}: {e}"
            ) from e
        if view_spec is None:
            message_point = self.point
        set_context(Context(self.info, message_point))
        if prop.explicit_response_port:
            args = (Port(msg.reply or "", self.rank, message_point.rank), *args)
        return args, kwargs, message_point.rank

    def _invoke_sync(
        self, prop: EndpointProperty, msg: Msg, later: list[tuple] | None = None
    ) -> tuple[bool, bytes, int]:
        """Run a sync endpoint: (ok, reply body, this actor's rank where the message was sent).

        ``later``: as :meth:`ActorActivity.end`'s (the caller tells it after replying).
        """
        at = self.rank
        call = self.activity.begin(prop.name, prop.concurrent, msg)
        try:
            args, kwargs, at = self._prepare(prop, msg)
            result = prop._method(self.obj, *args, **kwargs)
            body = self._encode_result(prop, msg, result)
        except BaseException as e:  # SystemExit too: it must not end the actor's thread
            self.activity.end(call, False, later)
            return (*self._failure(prop, e), at)
        self.activity.end(call, True, later)
        return True, body, at

    async def _invoke_async(self, prop: EndpointProperty, msg: Msg) -> tuple[bool, bytes, int]:
        at = self.rank
        call = self.activity.begin(prop.name, prop.concurrent, msg)
        try:
            try:
                data = await fetch_async(msg.data)
            except Exception as e:  # the message's bytes are gone: not the actor's failure
                raise MalformedMessageError(
                    f"{self.actor_id} could not fetch a message: {e}"
                ) from e
            args, kwargs, at = self._prepare(prop, msg, data)
            result = await prop._method(self.obj, *args, **kwargs)
            body = self._encode_result(prop, msg, result)
        except asyncio.CancelledError:
            self.activity.end(call, False)
            raise  # the actor is being stopped: its runner's task was cancelled
        except BaseException as e:  # SystemExit too: it must not escape onto the proc's loop
            self.activity.end(call, False)
            return (*self._failure(prop, e), at)
        self.activity.end(call, True)
        return True, body, at

    @staticmethod
    def _encode_result(prop: EndpointProperty, msg: Msg, result: Any) -> bytes:
        if not msg.reply or prop.explicit_response_port:
            return b""
        return dumps(result)

    def _failure(self, prop: EndpointProperty, e: BaseException) -> tuple[bool, bytes]:
        if not isinstance(e, Exception):
            # A BaseException (SystemExit, KeyboardInterrupt, ...) fails the actor, as in
            # Monarch: its caller gets SupervisionError, later calls too, the owner hears.
            self.rt.call_soon(self.fail, e)  # runs before the reply is sent (same FIFO)
            err = SupervisionError(
                actor_failed_message(self._describe(), _failure_reason(self.actor_id, e)),
                actor_id=self.actor_id,
                rank=self.rank,
            )
            return False, m.encode_error(err)
        if isinstance(e, CodecError):
            log.warning("%s.%s: %s", self.actor_id, prop.name, e)
        body = m.encode_error(e)
        if isinstance(e, MalformedMessageError):
            return False, body  # an error for a caller that waits; never the actor's failure
        if prop.explicit_response_port:
            # Nobody waits for a return value here: the exception escapes the actor.
            self.rt.call_soon(self.fail, e)
        return False, body

    def _respond_unknown(self, msg: Msg) -> None:
        name = (msg.headers or {}).get(m.ENDPOINT, "")
        err = AttributeError(
            f"actor {self.actor_id} ({self.cls.__name__}) has no endpoint {name!r}"
        )
        self._respond(msg, False, m.encode_error(err), None)

    def _respond(
        self,
        msg: Msg,
        ok: bool,
        body: bytes,
        prop: EndpointProperty | None,
        at: int | None = None,
    ) -> None:
        """Send a handled message's outcome (loop only); ``at``: this actor's rank in the
        mesh or slice the message was sent to (what a ranked PortReceiver reports)."""
        if prop is not None and prop.explicit_response_port:
            if not ok and msg.reply:  # the caller learns why, instead of waiting
                if self.failed is not None:
                    self._refuse(msg)
                else:
                    self._publish_reply(msg.reply, "error", body)
            return  # the endpoint answers through its port
        if not msg.reply:
            if not ok and prop is not None:
                err = m.decode_error(
                    body, actor_id=self.actor_id, rank=self.rank, endpoint=prop.name
                )
                if isinstance(err.exception, MalformedMessageError):
                    log.warning("dropped a malformed message: %s", err.exception)
                    return
                self.fail(_with_traceback(err))  # no caller to receive it
            return
        if ok:  # a big reply stays here and travels out of band; the caller fetches it
            try:
                body = offload(body, readers=1, ttl=None)
            except Exception as e:
                ok, body = False, m.encode_error(e)
        if len(body) > self.rt.max_payload:
            too_big = ValueError(
                f"the reply of {self.actor_id} is {len(body)} bytes, over the broker's "
                f"max_payload of {self.rt.max_payload}"
            )
            ok, body = False, m.encode_error(too_big)
        wait = bool(msg.headers and m.WAIT in msg.headers)
        self._publish_reply(msg.reply, "reply" if ok else "error", body, wait, at)

    def _reply_from_thread(self, msg: Msg, body: bytes, prop: EndpointProperty, at: int) -> bool:
        """On the actor's thread: write a call's plain reply itself; False: nothing sent,
        the loop answers (:meth:`_respond`).

        Only a return value that travels in the message, to a caller that waits
        on it, when no other message waits for this actor (replies to a burst
        of calls are cheaper as the loop's few writes than as one write each),
        and while the runtime has nothing queued before it
        (:meth:`Runtime.publish_from_thread`): what ``_respond`` would do for it
        is this, and it saves the loop's wake-up before the write
        (benchmarks/NOTES.md 42).
        """
        if (
            not msg.reply
            or not self._runner.idle()  # type: ignore[union-attr]  (a burst: the loop batches)
            or prop.explicit_response_port
            or self.failed is not None
            or not stays_inline(len(body))
            or len(body) > self.rt.max_payload
        ):
            return False
        wait = bool(msg.headers and m.WAIT in msg.headers)
        headers = self._reply_headers("reply", wait, at)
        replies = actor_process(self.rt).replies
        if replies is not None:
            # kept, should it be lost (if the loop sends it after all, its own call of
            # sent() finds the call answered already and keeps nothing twice)
            replies.sent(msg.reply, self.rank, body, headers)
        return self.rt.publish_from_thread(msg.reply, body, headers)

    def _reply_headers(self, kind: str, wait: bool, at: int | None) -> dict[str, str]:
        headers = {m.KIND: kind, m.RANK: str(self.rank), m.FROM: self.actor_id}
        if at is not None and at != self.rank:  # sent to a slice: the rank within it
            headers[m.MSG_RANK] = str(at)
        if wait:  # the caller blocks on this reply (see monarch.core.busy_poll)
            headers[m.WAIT] = "one"
        return headers

    def _publish_reply(
        self, subject: str, kind: str, body: bytes, wait: bool = False, at: int | None = None
    ) -> None:
        headers = self._reply_headers(kind, wait, at)
        replies = actor_process(self.rt).replies
        if replies is not None:
            replies.sent(subject, self.rank, body, headers)  # kept, should it be lost
        self.rt.publish(subject, body, headers)

    def _refuse(self, msg: Msg) -> None:
        if not getattr(msg, "reply", None):
            return
        if self.failed is not None:
            err: Exception = SupervisionError(
                actor_failed_message(self._describe(), _failure_reason(self.actor_id, self.failed)),
                actor_id=self.actor_id,
                rank=self.rank,
            )
        else:
            err = MeshStoppedError(f"actor {self.actor_id} is stopping")
        self._publish_reply(msg.reply, "error", m.encode_error(err))

    def _describe(self) -> str:
        return describe_actor(self.cls, "", self.name, self.point)


def _failure_reason(actor_id: str, exc: BaseException) -> str:
    """Why an actor failed, for its callers: the exception and, when known, its traceback."""
    if isinstance(exc, SupervisionFailure):
        return f"{actor_id} did not handle a failure of a mesh it owns:\n{exc.failure.report()}"
    head = f"{actor_id} failed: {type(exc).__name__}: {exc}"
    text = getattr(exc, "_monarch_traceback", None)
    if not text and exc.__traceback__ is not None:
        text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n{text}" if text else head


def _wrap(failure: MeshFailure, exc: BaseException) -> MeshFailure:
    """A failure raised while handling ``failure``: a new failure whose cause is that one."""
    return MeshFailure(
        failure.mesh_name, failure.mesh_uid, failure.ranks, "supervise_raised",
        f"__supervise__ raised {type(exc).__name__}: {exc}", cause=failure, exception=exc,
    )  # fmt: skip


def _with_traceback(err: Any) -> BaseException:
    """The endpoint's exception, keeping the remote traceback text for the report."""
    exc = err.exception
    try:
        exc._monarch_traceback = err.traceback
    except Exception:
        pass
    return exc
