"""Handling an actor's messages, one at a time: which endpoint, its arguments, its run.

The actor's runner (:mod:`monarch.actors.hosting.mailbox`) hands each item to
:meth:`Dispatch._on_thread` (a :class:`ThreadRunner`: sync endpoints run inline on the
actor's own thread) or :meth:`Dispatch._on_loop` (a :class:`LoopRunner`: an actor whose
endpoints are all async, on the proc's loop). The two are written out separately on
purpose: each is the per-message hot path of its kind of actor, and the thread's one
hands its outcomes to the loop (``runner.post``) where the loop's acts at once.
``@concurrent_endpoint`` methods start in order but run side by side.

A mixin of :class:`~monarch.actors.hosting.instance.ActorInstance`, which holds
the state it uses (set in its ``__init__``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.calls.activity import Call, call_listeners, tell_later
from monarch.actors.calls.context import Context, set_context, use_context
from monarch.actors.calls.endpoint import EndpointProperty
from monarch.actors.calls.ports import Port
from monarch.actors.errors import (
    MalformedMessageError,
    SupervisionError,
    actor_failed_message,
)
from monarch.actors.hosting.group_fanout import unchangeable
from monarch.actors.hosting.mailbox import ThreadRunner
from monarch.actors.hosting.reduce import IMMUTABLE, Unencoded
from monarch.actors.hosting.reply import failure_reason
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT
from monarch.broker.bodies.codec import CodecError, dumps
from monarch.broker.vocabulary.headers import ADHOC
from monarch.rdma.bulk import decode_body, fetch_async, is_reference
from monarch.supervision.failure import MeshFailure, SupervisionFailure

log = logging.getLogger(__name__)


class Supervise:
    """A failure of a mesh the actor owns, queued for its ``__supervise__``."""

    __slots__ = ("failure",)

    def __init__(self, failure: MeshFailure) -> None:
        self.failure = failure


class Dispatch:
    """Handling one item of the mailbox: a message, or a failure for ``__supervise__``."""

    # -- handling: on the actor's thread (ThreadRunner) --------------------------------

    def _on_thread(self, item: Any) -> None:
        runner: ThreadRunner = self._runner  # type: ignore[assignment]
        if isinstance(item, Supervise):
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
        if isinstance(item, Supervise):
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
            elif prop.is_async:  # what _run_one does, one coroutine fewer a message
                ok, body, at = await self._invoke_async(prop, item)
                self._respond(item, ok, body, prop, at)
            else:
                await self._run_one(prop, item)
        if self._stop_requested:
            self._stop_requested = False
            self._stop_soon()

    async def _go_on_async(
        self, prop: EndpointProperty, msg: Msg, call: Call, rest: Awaitable[Any]
    ) -> None:
        """The rest of a call that :mod:`monarch.actors.hosting.group_call` began and whose
        endpoint suspended (``rest`` drives it on): what :meth:`_on_loop` does after the
        endpoint returns, in the runner's task."""
        ok, body, at = await self._invoke_async(prop, msg, (call, rest))
        self._respond(msg, ok, body, prop, at)
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
            # A message to a whole per_proc group: its siblings may have decoded it.
            share = getattr(msg, "_mon_share", None)
            shared = share.args if share is not None else None
            if shared:
                args, kwargs, view_spec = shared
            else:
                # A fetched big body is ours alone: tensors in it are used in place.
                if data is None:
                    args, kwargs, view_spec = decode_body(msg.data)
                else:
                    args, kwargs, view_spec = decode_body(data, owned=data is not msg.data)
                if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
                    raise TypeError("the body is not (args, kwargs, view)")
                if share is not None and shared is None:  # the first of its group to read it
                    share.args = (args, kwargs, view_spec) if unchangeable(args, kwargs) else False
            if view_spec is not None:
                labels, sizes, ranks = view_spec
                message_point = Point(ranks.index(self.rank), Extent(labels, sizes))
        except Exception as e:  # the message is at fault, not the actor: it lives on
            raise MalformedMessageError(
                f"{self.actor_id} could not read a message for {prop.name!r} on {msg.subject}: {e}"
            ) from e
        if view_spec is None:
            message_point = self.point
            use_context(self.own_context)
        else:
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

    async def _invoke_async(
        self, prop: EndpointProperty, msg: Msg, begun: tuple[Call, Awaitable[Any]] | None = None
    ) -> tuple[bool, bytes, int]:
        """Run an async endpoint: (ok, reply body, this actor's rank where the message was
        sent). ``begun``: its activity record and the rest of a run begun elsewhere, to
        await instead (:meth:`_go_on_async`; a whole-mesh call, so ``at`` is the rank)."""
        at = self.rank
        if begun is None:
            call = self.activity.begin(prop.name, prop.concurrent, msg)
        else:
            call, rest = begun
        try:
            if begun is None:
                data = msg.data
                if is_reference(data):  # big: its bytes are fetched off the loop (else no await)
                    try:
                        data = await fetch_async(data)
                    except Exception as e:  # the message's bytes are gone: not the actor's failure
                        raise MalformedMessageError(
                            f"{self.actor_id} could not fetch a message: {e}"
                        ) from e
                args, kwargs, at = self._prepare(prop, msg, data)
                result = await prop._method(self.obj, *args, **kwargs)
            else:
                result = await rest
            body = self._encode_result(prop, msg, result)
        except BaseException as e:  # SystemExit too: it must not escape onto the proc's loop
            self.activity.end(call, False)
            if isinstance(e, asyncio.CancelledError) and _being_cancelled():
                raise  # the actor is being stopped: its runner's task was cancelled
            return (*self._failure(prop, e), at)
        self.activity.end(call, True)
        return True, body, at

    def _encode_result(self, prop: EndpointProperty, msg: Msg, result: Any) -> Any:
        """The reply body; for a reply that its proc merges (a reducing call to the whole
        group), a plain immutable value stays as it is (:class:`Unencoded`): the merge
        would decode it at once. Anything else is encoded, so the reducer works on a
        copy and never on an object the actor keeps."""
        if not msg.reply or prop.explicit_response_port:
            return b""
        if type(result) in IMMUTABLE and self._merged_here(msg):
            return Unencoded(result)
        return dumps(result)

    def _failure(self, prop: EndpointProperty, e: BaseException) -> tuple[bool, bytes]:
        if not isinstance(e, Exception):
            # A BaseException (SystemExit, KeyboardInterrupt, ...) fails the actor, as in
            # Monarch: its caller gets SupervisionError, later calls too, the owner hears.
            self.rt.call_soon(self.fail, e)  # runs before the reply is sent (same FIFO)
            err = SupervisionError(
                actor_failed_message(self._describe(), failure_reason(self.actor_id, e)),
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


def _wrap(failure: MeshFailure, exc: BaseException) -> MeshFailure:
    """A failure raised while handling ``failure``: a new failure whose cause is that one."""
    return MeshFailure(
        failure.mesh_name, failure.mesh_uid, failure.ranks, "supervise_raised",
        f"__supervise__ raised {type(exc).__name__}: {exc}", cause=failure, exception=exc,
    )  # fmt: skip


def _being_cancelled() -> bool:
    """Whether the running task was asked to stop, rather than an endpoint raising
    ``CancelledError`` itself (awaiting a future someone cancelled, or ``raise``): that
    one fails the actor as any ``BaseException`` does, where it used to end the
    runner's task, leaving its caller and every later call waiting for their timeouts
    (Monarch 0.7 hangs so, docs/reliability.md). Python 3.10 cannot tell: stopping."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0
