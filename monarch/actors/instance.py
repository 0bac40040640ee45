"""The receiving side of one actor: its mailbox, its thread, and how a message is handled.

Messages arrive from the ordered intake into an asyncio queue and are handled
one at a time by the actor's task. A sync endpoint runs on the actor's own
thread (so it may block, even on another actor's ``.get()``, without stalling
the proc's loop); an async endpoint runs on the loop. Either way the next
message waits until this one is done, which is what gives per-sender order.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nats.aio.msg import Msg

from monarch.actors import messages as m
from monarch.actors.context import Context, Instance, set_context
from monarch.actors.endpoint import EndpointProperty, endpoints_of
from monarch.actors.runtime import Runtime
from monarch.actors.shape import Extent, Point
from monarch.broker.codec import CodecError, dumps, loads

log = logging.getLogger(__name__)

_STOP = object()


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
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"actor-{name}-{rank}")
        self._mailbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------

    async def construct(self, args: tuple, kwargs: dict) -> None:
        """Run ``__init__`` on the actor's thread; raises what it raises."""

        def build() -> Any:
            set_context(Context(self.info, self.point))
            return self.cls(*args, **kwargs)

        self.obj = await self.rt.loop.run_in_executor(self._thread, build)
        self.info._actor = self.obj
        self._task = self.rt.loop.create_task(self._run(), name=f"actor {self.actor_id}")

    def deliver(self, msg: Msg) -> None:
        """Called by the intake, in wire order, on the loop."""
        if self._stopping:
            self._reply_stopped(msg)
            return
        self._mailbox.put_nowait(msg)

    def request_stop(self) -> None:
        self.rt.call_soon(self._mailbox.put_nowait, _STOP)

    async def stop(self, timeout: float) -> None:
        """Handle what is already queued, run ``__cleanup__``, then release the thread."""
        for sub in self.subscriptions:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        self._mailbox.put_nowait(_STOP)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except asyncio.TimeoutError:
                log.warning("actor %s did not finish its mailbox in %.1f s", self.actor_id, timeout)
                self._task.cancel()
        self._stopping = True
        await self._cleanup(None)
        self._thread.shutdown(wait=False)

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

    # -- handling -------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            msg = await self._mailbox.get()
            if msg is _STOP:
                return
            try:
                await self._handle(msg)
            except Exception:
                log.exception("actor %s failed to handle a message", self.actor_id)

    async def _handle(self, msg: Msg) -> None:
        headers = msg.headers or {}
        name = headers.get(m.ENDPOINT, "")
        prop = self.endpoints.get(name)
        if prop is None:
            err = AttributeError(
                f"actor {self.actor_id} ({self.cls.__name__}) has no endpoint {name!r}"
            )
            self._respond(msg, False, m.encode_error(err))
            return
        if prop.is_async:
            ok, body = await self._invoke_async(prop, msg)
        else:
            ok, body = await self.rt.loop.run_in_executor(
                self._thread, self._invoke_sync, prop, msg
            )
        self._respond(msg, ok, body)

    def _context_for(self, view_spec: Any) -> Context:
        if view_spec is None:
            return Context(self.info, self.point)
        labels, sizes, ranks = view_spec
        return Context(self.info, Point(ranks.index(self.rank), Extent(labels, sizes)))

    def _invoke_sync(self, prop: EndpointProperty, msg: Msg) -> tuple[bool, bytes]:
        try:
            args, kwargs, view_spec = loads(msg.data)
            set_context(self._context_for(view_spec))
            result = prop._method(self.obj, *args, **kwargs)
            return True, dumps(result) if msg.reply else b""
        except Exception as e:
            return self._failure(prop, e)

    async def _invoke_async(self, prop: EndpointProperty, msg: Msg) -> tuple[bool, bytes]:
        try:
            args, kwargs, view_spec = loads(msg.data)
            set_context(self._context_for(view_spec))
            result = await prop._method(self.obj, *args, **kwargs)
            return True, dumps(result) if msg.reply else b""
        except Exception as e:
            return self._failure(prop, e)

    def _failure(self, prop: EndpointProperty, e: Exception) -> tuple[bool, bytes]:
        if isinstance(e, CodecError):
            log.warning("%s.%s: %s", self.actor_id, prop.name, e)
        return False, m.encode_error(e)

    def _respond(self, msg: Msg, ok: bool, body: bytes) -> None:
        if not msg.reply:
            if not ok:
                # No caller to tell: supervision reports it (see monarch.supervision).
                err = m.decode_error(body, actor_id=self.actor_id, rank=self.rank, endpoint="")
                log.error(
                    "unhandled error in %s (no caller to receive it):\n%s", self.actor_id, err
                )
            return
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
        headers = {
            m.KIND: "reply" if ok else "error",
            m.RANK: str(self.rank),
            m.FROM: self.actor_id,
        }
        self.rt.publish(msg.reply, body, headers)

    def _reply_stopped(self, msg: Msg) -> None:
        if msg.reply:
            from monarch.actors.errors import MeshStoppedError

            err = MeshStoppedError(f"actor {self.actor_id} is stopping")
            self.rt.publish(
                msg.reply,
                m.encode_error(err),
                {m.KIND: "error", m.RANK: str(self.rank), m.FROM: self.actor_id},
            )
