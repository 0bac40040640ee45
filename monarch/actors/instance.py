"""The receiving side of one actor: its mailbox, its thread, and how a message is handled.

Messages arrive from the ordered intake into an asyncio queue and are handled
one at a time by the actor's task. A sync endpoint runs on the actor's own
thread (so it may block, even on another actor's ``.get()``, without stalling
the proc's loop); an async endpoint runs on the loop. Either way the next
message waits until this one is done, which is what gives per-sender order.
``@concurrent_endpoint`` methods are the exception: they start in order but
run side by side.

An actor *fails* when an exception has nowhere else to go: a ``broadcast``
(no caller), an explicit-response-port endpoint that raises. A failed actor
answers every later call with :class:`SupervisionError`, runs
``__cleanup__(exc)``, and is reported to its owner (``on_failure``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nats.aio.msg import Msg

from monarch.actors import messages as m
from monarch.actors.context import Context, Instance, set_context
from monarch.actors.endpoint import EndpointProperty, endpoints_of
from monarch.actors.errors import MeshStoppedError, SupervisionError
from monarch.actors.ports import Port
from monarch.actors.runtime import Runtime
from monarch.actors.shape import Extent, Point
from monarch.broker.codec import CodecError, dumps, loads
from monarch.rdma.bulk import fetch, fetch_async, offload
from monarch.supervision.failure import SupervisionFailure

log = logging.getLogger(__name__)

_STOP = object()


class _Supervise:
    __slots__ = ("failure",)

    def __init__(self, failure: Any) -> None:
        self.failure = failure


def _wrap(failure: Any, exc: BaseException) -> Any:
    """A failure raised while handling ``failure``: a new failure whose cause is that one."""
    from monarch.supervision.failure import MeshFailure

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


ADHOC = "Mon-Adhoc"  # header: the caller used as_endpoint() on a plain method


class ActorInstance:
    """One live actor in this proc."""

    def __init__(
        self, rt: Runtime, *, name: str, uid: str, rank: int, extent: Extent, cls: type
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
        )
        self.obj: Any = None
        self.subscriptions: list[Any] = []
        self.failed: BaseException | None = None
        self.on_failure: Callable[[ActorInstance, BaseException], None] | None = None
        self.on_stopped: Callable[[ActorInstance], None] | None = None
        self.owner_proc = ""  # where this actor's owner lives (the proc uid)
        self.owner_actor = ""  # the owner's actor id ("client" for the root)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"actor-{name}-{rank}")
        self._mailbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._concurrent: set[asyncio.Task] = set()
        self._stopping = False
        self._stop_requested = False
        self._done = False

    # -- lifecycle ----------------------------------------------------------

    async def construct(self, args: tuple, kwargs: dict) -> None:
        """Run ``__init__`` on the actor's thread; raises what it raises."""

        def build() -> Any:
            set_context(Context(self.info, self.point))
            return self.cls(*args, **kwargs)

        try:
            self.obj = await self.rt.loop.run_in_executor(self._thread, build)
        except BaseException:
            self._thread.shutdown(wait=False)
            raise
        self.info._actor = self.obj
        self._task = self.rt.loop.create_task(self._run(), name=f"actor {self.actor_id}")

    def deliver(self, msg: Msg) -> None:
        """Called by the intake, in wire order, on the loop."""
        if self._stopping or self.failed is not None:
            self._refuse(msg)
            return
        self._mailbox.put_nowait(msg)

    def supervise(self, failure: Any) -> None:
        """A mesh this actor owns failed: run ``__supervise__`` in mailbox order."""
        if self._done or self.failed is not None:
            return
        self._mailbox.put_nowait(_Supervise(failure))

    async def _run_supervise(self, failure: Any) -> None:
        hook = getattr(self.obj, "__supervise__", None)
        handled = False
        try:
            if hook is not None:
                if asyncio.iscoroutinefunction(hook):
                    handled = bool(await hook(failure))
                else:
                    handled = bool(
                        await self.rt.loop.run_in_executor(
                            self._thread, self._call_in_context, hook, failure
                        )
                    )
        except Exception as e:  # raising is a new failure, caused by the one being handled
            e.__cause__ = SupervisionFailure(failure)
            self.fail(SupervisionFailure(_wrap(failure, e)))
            return
        if not handled:
            self.fail(SupervisionFailure(failure))

    def _call_in_context(self, fn: Callable[..., Any], *args: Any) -> Any:
        set_context(Context(self.info, self.point))
        return fn(*args)

    def request_stop(self) -> None:
        """``context().actor_instance.stop()``: stop after the current message."""
        self._stop_requested = True

    async def stop(self, timeout: float, exc: BaseException | None = None) -> None:
        """Handle what is already queued, cancel concurrent tasks, run ``__cleanup__``.

        Bounded by ``timeout``: a mailbox that does not drain in time is cut off.
        """
        if self._done:
            # Failed earlier (cleanup already ran): just let go of what is left.
            await self._unsubscribe()
            if self._task is not None:
                self._task.cancel()
            return
        self._done = True
        await self._unsubscribe()
        if self._task is not None and not self._task.done():
            self._mailbox.put_nowait(_STOP)
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except asyncio.TimeoutError:
                log.warning("actor %s did not finish its mailbox in %.1f s", self.actor_id, timeout)
                self._task.cancel()
        self._stopping = True
        await self._cancel_concurrent()
        while not self._mailbox.empty():
            left = self._mailbox.get_nowait()
            if hasattr(left, "data"):  # a message, not a sentinel
                self._refuse(left)
        await self._stop_owned()
        await self._cleanup(exc)
        self._thread.shutdown(wait=False)
        if self.on_stopped is not None:
            self.on_stopped(self)

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

    async def _cleanup(self, exc: BaseException | None) -> None:
        hook = getattr(self.obj, "__cleanup__", None)
        if hook is None:
            return
        try:
            if asyncio.iscoroutinefunction(hook):
                await hook(exc)
            else:
                await self.rt.loop.run_in_executor(self._thread, hook, exc)
        except Exception:
            log.exception("__cleanup__ of %s raised", self.actor_id)

    def fail(self, exc: BaseException) -> None:
        """The actor cannot go on: refuse further messages, clean up, tell the owner."""
        if self.failed is not None:
            return
        self.failed = exc
        log.error("actor %s failed: %r", self.actor_id, exc)
        self.rt.loop.create_task(self._after_failure(exc))

    async def _after_failure(self, exc: BaseException) -> None:
        # Subscriptions stay: until the actor is stopped, callers get a clear
        # SupervisionError instead of silence.
        await self._cancel_concurrent()
        while not self._mailbox.empty():
            left = self._mailbox.get_nowait()
            if hasattr(left, "data"):
                self._refuse(left)
        self._done = True
        await self._stop_owned()
        await self._cleanup(exc)
        self._thread.shutdown(wait=False)
        if self.on_failure is not None:
            self.on_failure(self, exc)

    # -- handling -------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            msg = await self._mailbox.get()
            if msg is _STOP:
                return
            if isinstance(msg, _Supervise):
                if self.failed is None:
                    await self._run_supervise(msg.failure)
                continue
            if self.failed is not None:
                self._refuse(msg)
                continue
            try:
                await self._handle(msg)
            except Exception:
                log.exception("actor %s failed to handle a message", self.actor_id)
            if self._stop_requested and not self._done:
                self.rt.loop.create_task(self.stop(self.rt.settings.stop_timeout))
                return

    def _endpoint_for(self, msg: Msg) -> EndpointProperty | None:
        headers = msg.headers or {}
        name = headers.get(m.ENDPOINT, "")
        prop = self.endpoints.get(name)
        if prop is None and headers.get(ADHOC) and not name.startswith("_"):
            method = getattr(self.cls, name, None)
            if callable(method):  # the caller opted in with as_endpoint()
                prop = EndpointProperty(method, explicit_response_port=headers.get(ADHOC) == "port")
                self.endpoints[name] = prop
        return prop

    async def _handle(self, msg: Msg) -> None:
        prop = self._endpoint_for(msg)
        if prop is None:
            name = (msg.headers or {}).get(m.ENDPOINT, "")
            err = AttributeError(
                f"actor {self.actor_id} ({self.cls.__name__}) has no endpoint {name!r}"
            )
            self._respond(msg, False, m.encode_error(err), prop=None)
            return
        if prop.concurrent:
            task = self.rt.loop.create_task(self._run_one(prop, msg))
            self._concurrent.add(task)
            task.add_done_callback(self._concurrent.discard)
            return
        await self._run_one(prop, msg)

    async def _run_one(self, prop: EndpointProperty, msg: Msg) -> None:
        if prop.is_async:
            ok, body = await self._invoke_async(prop, msg)
        elif prop.concurrent:
            ok, body = await self.rt.loop.run_in_executor(None, self._invoke_sync, prop, msg)
        else:
            ok, body = await self.rt.loop.run_in_executor(
                self._thread, self._invoke_sync, prop, msg
            )
        self._respond(msg, ok, body, prop)

    def _prepare(
        self, prop: EndpointProperty, msg: Msg, data: bytes | None = None
    ) -> tuple[tuple, dict]:
        # A big message arrives as a reference to its bytes (monarch.rdma.bulk): fetch them.
        args, kwargs, view_spec = loads(fetch(msg.data) if data is None else data)
        if view_spec is None:
            set_context(Context(self.info, self.point))
        else:
            labels, sizes, ranks = view_spec
            set_context(Context(self.info, Point(ranks.index(self.rank), Extent(labels, sizes))))
        if prop.explicit_response_port:
            args = (Port(msg.reply or "", self.rank), *args)
        return args, kwargs

    def _invoke_sync(self, prop: EndpointProperty, msg: Msg) -> tuple[bool, bytes]:
        try:
            args, kwargs = self._prepare(prop, msg)
            result = prop._method(self.obj, *args, **kwargs)
            return True, self._encode_result(prop, msg, result)
        except Exception as e:
            return self._failure(prop, e)

    async def _invoke_async(self, prop: EndpointProperty, msg: Msg) -> tuple[bool, bytes]:
        try:
            args, kwargs = self._prepare(prop, msg, await fetch_async(msg.data))
            result = await prop._method(self.obj, *args, **kwargs)
            return True, self._encode_result(prop, msg, result)
        except Exception as e:
            return self._failure(prop, e)

    @staticmethod
    def _encode_result(prop: EndpointProperty, msg: Msg, result: Any) -> bytes:
        if not msg.reply or prop.explicit_response_port:
            return b""
        return dumps(result)

    def _failure(self, prop: EndpointProperty, e: Exception) -> tuple[bool, bytes]:
        if isinstance(e, CodecError):
            log.warning("%s.%s: %s", self.actor_id, prop.name, e)
        body = m.encode_error(e)
        if prop.explicit_response_port:
            # Nobody waits for a return value here: the exception escapes the actor.
            self.rt.call_soon(self.fail, e)
        return False, body

    def _respond(self, msg: Msg, ok: bool, body: bytes, prop: EndpointProperty | None) -> None:
        if prop is not None and prop.explicit_response_port:
            if not ok and msg.reply:
                self._refuse(msg)  # the caller learns the actor failed, instead of waiting
            return  # the endpoint answers through its port
        if not msg.reply:
            if not ok and prop is not None:
                err = m.decode_error(
                    body, actor_id=self.actor_id, rank=self.rank, endpoint=prop.name
                )
                self.fail(_with_traceback(err))  # no caller to receive it
            return
        if ok:  # a big reply stays here and travels out of band; the caller fetches it
            try:
                body = offload(body, readers=1, ttl=None)
            except Exception as e:
                ok, body = False, m.encode_error(e)
        if len(body) > self.rt.max_payload:
            ok, body = (
                False,
                m.encode_error(
                    ValueError(
                        f"the reply of {self.actor_id} is {len(body)} bytes, over the broker's "
                        f"max_payload of {self.rt.max_payload}"
                    )
                ),
            )
        self._publish_reply(msg.reply, "reply" if ok else "error", body)

    def _publish_reply(self, subject: str, kind: str, body: bytes) -> None:
        headers = {m.KIND: kind, m.RANK: str(self.rank), m.FROM: self.actor_id}
        self.rt.publish(subject, body, headers)

    def _refuse(self, msg: Msg) -> None:
        if not msg.reply:
            return
        if self.failed is not None:
            err: Exception = SupervisionError(
                f"actor {self.actor_id} failed: {self.failed!r}",
                actor_id=self.actor_id,
                rank=self.rank,
            )
        else:
            err = MeshStoppedError(f"actor {self.actor_id} is stopping")
        self._publish_reply(msg.reply, "error", m.encode_error(err))
