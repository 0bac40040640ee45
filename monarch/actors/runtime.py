"""The per-process runtime: one NATS connection, one event loop, ports and local actors.

Every OS process that takes part (the client script and each proc) has exactly
one :class:`Runtime`. In a proc the loop is the main thread's; in the client
the runtime starts on first use, runs its loop on a daemon thread so that plain
synchronous scripts can block on ``.get()``, and, when ``MONARCH_NATS_URL`` is
unset, starts an embedded nats-server that it stops at exit.

All publishing goes through one ordered outbox on the loop, and all receiving
through one ordered intake (:mod:`monarch.broker.intake`), which is what makes
per-sender ordering hold end to end.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import itertools
import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from monarch.actors.busy_poll import WAIT_HEADER, BusyPoll
from monarch.actors.future import mark_loop_thread
from monarch.broker import batch, subjects
from monarch.broker.config import Settings, settings
from monarch.broker.connect import connect
from monarch.broker.intake import subscribe_ordered

log = logging.getLogger(__name__)

PortHandler = Callable[[Msg], None]


class LocalMsg:
    """A message that never left this process; quacks like nats-py's ``Msg``."""

    __slots__ = ("subject", "data", "reply", "headers")

    def __init__(self, subject: str, data: bytes, reply: str, headers: dict | None) -> None:
        self.subject = subject
        self.data = data
        self.reply = reply
        self.headers = headers


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed (faster I/O), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Runtime:
    """One process's connection to the system. Use :func:`runtime` to get it."""

    def __init__(self, *, proc_uid: str, loop: asyncio.AbstractEventLoop, cfg: Settings) -> None:
        self.proc_uid = proc_uid
        self.loop = loop
        self.settings = cfg
        self.namespace = cfg.namespace
        self.nats_url: str = ""
        self.nc: Client | None = None
        self.is_client = False
        self.root_uid = proc_uid  # the root client's proc uid (procs learn it from the environment)
        self._ports: dict[int, PortHandler] = {}
        self.mesh_states: dict[str, Any] = {}  # actor mesh uid -> MeshState known here
        self._port_ids = itertools.count(1)
        self._mesh_handlers: dict[str, Callable[[Msg], None]] = {}
        self._ctl_handler: Callable[[Msg], None] | None = None
        self._inbox: collections.deque = collections.deque()  # calls from other threads
        self._inbox_scheduled = False
        # Fire-and-forget messages to one subject waiting to leave as one (monarch.broker.batch).
        self._batch: list[tuple[dict[str, str], bytes]] = []
        self._batch_subject = ""
        self._batch_bytes = 0
        self._batch_scheduled = False
        self._batch_max = cfg.batch_max if cfg.wire == "msgpack" else 0  # JSON stays readable
        self._loop_thread_id: int | None = None
        self._pid = os.getpid()  # a forked child has our objects, not our loop
        self._closers: list[Callable[[], Any]] = []
        # Called with False when the broker connection drops and True when it is back.
        self.connection_listeners: list[Callable[[bool], None]] = []
        self.max_payload = 1024 * 1024
        self._own_port_prefix = subjects.port(cfg.namespace, proc_uid, "")
        self._own_ctl = subjects.ctl_proc(cfg.namespace, proc_uid)
        self.busy_poll = BusyPoll(loop, cfg.busy_poll_us)
        # What recovers lost calls, replies and sends (set up by connect).
        self.replies: Any = None  # monarch.actors.lost_replies.ReplyLedger
        self.prober: Any = None  # monarch.actors.lost_replies.CallProber
        self.sends: Any = None  # monarch.actors.lost_sends.SendCounter

    # -- start and stop ----------------------------------------------------

    async def connect(self, url: str) -> None:
        """Connect and subscribe to this proc's ports and control subject."""
        self._loop_thread_id = threading.get_ident()
        mark_loop_thread()
        self.nats_url = url
        self.nc = await connect(
            url,
            self.settings,
            name=f"monarch-{self.proc_uid}",
            error_cb=self._on_nats_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self.max_payload = self.nc.max_payload
        ns = self.namespace
        poke = self.busy_poll.on_message
        await subscribe_ordered(
            self.nc, subjects.port_wildcard(ns, self.proc_uid), self._on_port, poke
        )
        await subscribe_ordered(self.nc, subjects.ctl_proc(ns, self.proc_uid), self._on_ctl, poke)
        self._start_loss_recovery()

    def _start_loss_recovery(self) -> None:
        # Imported here: they speak the actor protocol, whose modules import this one.
        from monarch.actors.lost_replies import CallProber, ReplyLedger
        from monarch.actors.lost_sends import SendCounter

        self.replies = ReplyLedger(self)
        self.prober = CallProber(self)
        self.sends = SendCounter(self)
        self.connection_listeners.append(self.replies.connection_changed)
        self.connection_listeners.append(self.sends.connection_changed)
        self.prober.start()
        self.sends.start()

    async def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                res = closer()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:
                log.exception("error while closing the runtime")
        self._closers.clear()
        if self.nc is not None and not self.nc.is_closed:
            await self._flush_pending()
            try:
                await asyncio.wait_for(self.nc.drain(), 2.0)
            except Exception:
                await self.nc.close()
        self.busy_poll.close()

    def every(self, period: float, fn: Callable[[], None], what: str) -> None:
        """Call ``fn()`` on the loop every ``period`` seconds until the runtime closes.

        An exception is logged (``what`` failed) and the next period comes anyway.
        """

        async def repeat() -> None:
            while True:
                await asyncio.sleep(period)
                try:
                    fn()
                except Exception:
                    log.exception("%s failed", what)

        task = self.loop.create_task(repeat())
        self.on_close(task.cancel)

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Run ``closer`` (sync or async) when the runtime closes, last registered first."""
        self._closers.append(closer)

    async def _on_nats_error(self, e: Exception) -> None:
        log.warning("NATS error on %s: %s", self.proc_uid, e)

    async def _on_disconnected(self) -> None:
        log.info("%s disconnected from the broker", self.proc_uid)
        for listener in list(self.connection_listeners):
            listener(False)

    async def _on_reconnected(self) -> None:
        log.info("%s reconnected to the broker", self.proc_uid)
        for listener in list(self.connection_listeners):
            listener(True)

    # -- threads -----------------------------------------------------------

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread_id

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, in call order, from any thread.

        Calls from other threads go through one FIFO inbox that the loop drains
        in a single wake-up, so a burst of sends costs one wake-up, not one each.
        """
        if threading.get_ident() == self._loop_thread_id:
            fn(*args)
            return
        if os.getpid() != self._pid:
            raise self._forked_error()
        self._inbox.append((fn, args))
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain_inbox)
            except RuntimeError:  # the loop is closed: the process is exiting
                self._inbox_scheduled = False

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False  # first: an append from now on schedules a new drain
        inbox = self._inbox
        while inbox:
            fn, args = inbox.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("error in a call handed to the runtime loop")

    def run_coro(self, coro: Any) -> Any:
        """Schedule a coroutine on the loop from any thread; a concurrent future of its result."""
        if os.getpid() != self._pid:
            coro.close()
            raise self._forked_error()
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _forked_error(self) -> RuntimeError:
        return RuntimeError(
            f"this process (pid {os.getpid()}) was forked from the one that owns monarch "
            f"runtime {self.proc_uid} (pid {self._pid}): the meshes, futures and ports it made "
            "belong to the parent, whose event loop does not run here. In the child, spawn "
            "procs of its own (its own runtime starts on first use), or use a spawn start "
            "method for multiprocessing."
        )

    # -- sending -----------------------------------------------------------

    def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        reply: str = "",
        on_error: Callable[[BaseException], None] | None = None,
        batchable: bool = False,
    ) -> None:
        """Queue a message; messages leave in the order ``publish`` was called. Loop only.

        Messages to this process's own ports and control subject are handed
        over directly, without the broker round trip. ``batchable`` messages
        (small, no reply) may leave together with the ones next to them that
        go to the same subject, as one batch (:mod:`monarch.broker.batch`).
        """
        if subject.startswith(self._own_port_prefix):
            self._on_port(LocalMsg(subject, payload, reply, headers))
            return
        if subject == self._own_ctl:
            self._on_ctl(LocalMsg(subject, payload, reply, headers))
            return
        if headers and WAIT_HEADER in headers:  # its answer comes over the network, soon
            self.busy_poll.poke()
        if (
            batchable
            and self._batch_max
            and not reply
            and headers is not None
            and len(payload) <= batch.ITEM_MAX_BYTES
        ):
            self._add_to_batch(subject, payload, headers)
            return
        if self._batch:  # earlier messages wait there: they leave first
            self._flush_batch()
        self._publish_now(subject, payload, reply, headers, on_error)

    def _add_to_batch(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        if self._batch and subject != self._batch_subject:
            self._flush_batch()
        self._batch_subject = subject
        self._batch.append((headers, payload))
        self._batch_bytes += len(payload)
        if len(self._batch) >= self._batch_max or self._batch_bytes >= min(
            batch.BATCH_MAX_BYTES, self.max_payload // 2
        ):
            self._flush_batch()
        elif not self._batch_scheduled:
            # Whatever else this loop turn sends to the same subject joins the batch.
            self._batch_scheduled = True
            self.loop.call_soon(self._flush_batch_at_turn_end)

    def _flush_batch_at_turn_end(self) -> None:
        self._batch_scheduled = False
        self._flush_batch()

    def _flush_batch(self) -> None:
        items, subject = self._batch, self._batch_subject
        if not items:
            return
        self._batch, self._batch_bytes = [], 0
        if len(items) == 1:  # a lone message travels as itself
            headers, payload = items[0]
            self._publish_now(subject, payload, "", headers, None)
        else:
            self._publish_now(subject, batch.pack(items), "", batch.headers(len(items)), None)

    def _publish_now(
        self,
        subject: str,
        payload: bytes,
        reply: str,
        headers: dict[str, str] | None,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        """Run nats-py's ``publish`` coroutine right here, without a task switch.

        It queues the message's bytes before its first (rare) suspension, a
        forced flush of a full buffer, so the order of messages is fixed here
        either way; a suspended publish is finished by a task.
        """
        coro = self.nc.publish(subject, payload, reply=reply, headers=headers)
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as e:
            self._publish_failed(subject, e, on_error)
            return
        self.loop.create_task(self._finish_publish(coro, yielded, subject, on_error))

    async def _finish_publish(
        self,
        coro: Any,
        yielded: Any,
        subject: str,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        try:
            while True:
                if yielded is None:
                    await asyncio.sleep(0)
                else:
                    try:
                        await yielded
                    except BaseException:
                        pass  # the publish coroutine sees the outcome when resumed
                yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as e:
            self._publish_failed(subject, e, on_error)

    @staticmethod
    def _publish_failed(
        subject: str, e: BaseException, on_error: Callable[[BaseException], None] | None
    ) -> None:
        if on_error is not None:
            on_error(e)
        else:
            log.warning("could not publish to %s: %r", subject, e)

    async def _flush_pending(self) -> None:
        self._flush_batch()
        if self.nc is not None and self.nc.is_connected:
            try:
                await self.nc.flush(timeout=2)
            except Exception:
                pass

    # -- receiving -----------------------------------------------------------

    def open_port(self, handler: PortHandler) -> tuple[int, str]:
        """Register a handler for messages to a new port of this proc; (id, subject)."""
        port_id = next(self._port_ids)
        self._ports[port_id] = handler
        return port_id, subjects.port(self.namespace, self.proc_uid, port_id)

    def close_port(self, port_id: int) -> None:
        self._ports.pop(port_id, None)

    def _on_port(self, msg: Msg) -> None:
        port_id = msg.subject.rsplit(".", 1)[-1]
        handler = self._ports.get(int(port_id)) if port_id.isdigit() else None
        if handler is None:
            log.debug("message for closed or unknown port %s", msg.subject)
            return
        handler(msg)

    def set_ctl_handler(self, handler: Callable[[Msg], None]) -> None:
        self._ctl_handler = handler

    def _on_ctl(self, msg: Msg) -> None:
        kind = (msg.headers or {}).get("Mon-Kind")
        if kind == "probe" and self.replies is not None:
            self.replies.answer_probe(msg)  # here, in arrival order: after the calls it asks about
            return
        if kind == "lost":
            self._on_lost(msg)
            return
        if self._ctl_handler is None:
            log.warning("control message %s ignored: this process hosts no actors", msg.subject)
            return
        self._ctl_handler(msg)

    def _on_lost(self, msg: Msg) -> None:
        """An actor found a hole in this process's messages to it (see monarch.actors.lost_sends)."""
        from monarch.broker.codec import loads

        try:
            mesh_uid, rank, count, subject = loads(msg.data)
            st = self.mesh_states.get(mesh_uid)
            if st is not None:
                st.note_lost(int(rank), int(count), str(subject))
        except Exception as e:
            log.warning("malformed loss report on %s: %r", msg.subject, e)

    async def subscribe_mesh(self, subject: str, handler: Callable[[Msg], None]) -> Any:
        return await subscribe_ordered(self.nc, subject, handler, self.busy_poll.on_message)


# -- the process-wide instance -------------------------------------------------

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_embedded_url: str | None = None  # the URL of the broker this process started, if any
_parents_url: str | None = None  # in a forked child: the parent's embedded broker, not ours
_inherited: list[Runtime] = []  # in a forked child: the parent's runtime, kept and never used
_atexit_registered = False
_lost_timeout_set: list[str] = []  # the MONARCH_BROKER_LOST_TIMEOUT we set for our procs


def _forget_lost_timeout() -> None:
    while _lost_timeout_set:
        value = _lost_timeout_set.pop()
        if os.environ.get("MONARCH_BROKER_LOST_TIMEOUT") == value:
            del os.environ["MONARCH_BROKER_LOST_TIMEOUT"]


def runtime() -> Runtime:
    """This process's runtime, starting the client runtime on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    with _runtime_lock:
        if _runtime is None:
            _start_client_runtime()
        return _runtime  # type: ignore[return-value]


def install_runtime(rt: Runtime) -> None:
    """Make ``rt`` this process's runtime (a proc calls this at start-up)."""
    global _runtime
    _runtime = rt


def current_runtime_or_none() -> Runtime | None:
    return _runtime


def _start_client_runtime() -> None:
    """Start the broker if needed, the loop thread, and connect: the client becomes the root."""
    global _runtime, _embedded_url, _atexit_registered
    settings.cache_clear()  # the environment as it is now, when the client starts
    cfg = settings()
    from monarch.actors.launcher import prestart_zygote

    # Procs fork from it, so their imports are paid once, in the background, while
    # the broker starts; each fork request carries the proc's environment (URL too).
    prestart_zygote()
    broker = None
    url = cfg.nats_url
    if url and url == _parents_url:
        url = None  # a forked child's own broker: the parent's dies with the parent
    if not url:
        from monarch.broker.server import EmbeddedBroker

        # Loopback only, and a token that only the procs we start receive (in
        # MONARCH_NATS_URL, i.e. the environment, which only we can read; the
        # server reads it from a private config file, never from its argv).
        broker = EmbeddedBroker(token=secrets.token_urlsafe(18)).start()
        url = broker.url
        # Procs we start inherit the URL through the environment.
        os.environ["MONARCH_NATS_URL"] = url
        _embedded_url = url
        # This broker dies only with us: for our procs, losing it is losing their
        # owner, which the heartbeat timeout bounds (not the longer wait for a
        # broker that restarts). Matters where the kernel does not tie them to us
        # (MONARCH_DIE_WITH_PARENT=0).
        if "MONARCH_BROKER_LOST_TIMEOUT" not in os.environ:
            os.environ["MONARCH_BROKER_LOST_TIMEOUT"] = str(cfg.heartbeat_timeout)
            _lost_timeout_set.append(str(cfg.heartbeat_timeout))
    loop = new_event_loop()
    uid = subjects.new_uid()
    rt = Runtime(proc_uid=f"client-{uid}", loop=loop, cfg=cfg)
    rt.is_client = True
    started = threading.Event()
    thread = threading.Thread(
        target=_run_loop_forever, args=(loop, started), name="monarch-runtime", daemon=True
    )
    thread.start()
    started.wait()
    try:
        asyncio.run_coroutine_threadsafe(_connect_client(rt, url), loop).result(30)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        if broker is not None:
            broker.stop()
            if os.environ.get("MONARCH_NATS_URL") == url:
                del os.environ["MONARCH_NATS_URL"]  # a retry starts a new broker
            _embedded_url = None
            _forget_lost_timeout()
        raise
    _runtime = rt

    def shutdown() -> None:
        # Every wait is bounded (about stop_timeout + 20 s in all): exit never hangs.
        global _runtime, _embedded_url
        try:
            asyncio.run_coroutine_threadsafe(rt.close(), loop).result(cfg.stop_timeout + 5)
        except Exception:
            log.exception("monarch runtime did not close cleanly")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if broker is not None:
            broker.stop()
            if os.environ.get("MONARCH_NATS_URL") == url:
                del os.environ["MONARCH_NATS_URL"]
            _embedded_url = None
            _forget_lost_timeout()
        _runtime = None

    rt._shutdown = shutdown  # type: ignore[attr-defined]
    if not _atexit_registered:  # once: a restarted runtime is shut down by the same handler
        atexit.register(shutdown_runtime)
        _atexit_registered = True


def _forget_parent_after_fork() -> None:
    """In a forked child (``os.fork``, multiprocessing's fork): the parent's runtime is not ours.

    Its loop thread, heartbeats and launcher did not survive the fork, and its
    broker, zygote and procs belong to the parent: the child must neither use
    them (it would wait forever on a loop that does not run) nor stop them (at
    its exit it would kill them under the parent). So the child starts with
    no runtime; on first use it starts its own, with its own broker, and what
    it starts dies with it. The parent's objects are kept referenced, never
    collected: their destructors might act on sockets, pipes and event-loop
    state shared with the parent.
    """
    global _runtime, _runtime_lock, _embedded_url, _parents_url
    if _runtime is not None:
        _inherited.append(_runtime)
    _runtime = None
    _runtime_lock = threading.Lock()  # another thread may have held it at the fork
    if _embedded_url is not None:
        _parents_url = _embedded_url  # MONARCH_NATS_URL still names it; stays the parent's
    _embedded_url = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


async def _connect_client(rt: Runtime, url: str) -> None:
    await rt.connect(url)
    from monarch.actors.proc import local_server
    from monarch.actors.supervisor import start_supervision

    await start_supervision(rt, create_streams=True, owner_proc=None)
    # The root also serves control messages: this_proc() actors, controllers.
    local_server(rt)


def _run_loop_forever(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    loop.run_forever()


def shutdown_runtime() -> None:
    """Stop everything the client runtime started (procs, broker); idempotent."""
    rt = _runtime
    if rt is not None and getattr(rt, "_shutdown", None) is not None:
        fn = rt._shutdown  # type: ignore[attr-defined]
        rt._shutdown = None  # type: ignore[attr-defined]
        fn()


def shutdown_context() -> Any:
    """Stop everything this client started (procs, actors, embedded broker).

    Returns a future that completes when all is down. A later use of the API
    starts afresh. Not callable from inside an actor.
    """
    from monarch.actors.future import Future

    fut: Future[None] = Future()
    rt = _runtime
    if rt is None:
        fut._set_result(None)
        return fut
    if not rt.is_client or rt.on_loop_thread():
        raise RuntimeError(
            "shutdown_context() is for the client script, not for code inside actors"
        )

    def run() -> None:
        try:
            shutdown_runtime()
            fut._set_result(None)
        except BaseException as e:
            fut._set_exception(e)

    threading.Thread(target=run, name="monarch-shutdown", daemon=True).start()
    return fut
