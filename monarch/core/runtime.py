"""The per-process runtime: one NATS connection, one event loop, ports and control.

Every OS process that takes part (the client script and each proc) has exactly
one :class:`Runtime`. In a proc the loop is the main thread's; in the client it
runs on a daemon thread so that plain synchronous scripts can block on
``.get()``. Who starts it is not this module's business: a proc builds one at
start-up (:mod:`monarch.actors.hosting.proc`), the client's is started on first use by
the starter that :mod:`monarch.actors.client` hands in
(:func:`monarch.core.process_runtime.set_starter`). Which runtime is this
process's (:func:`~monarch.core.process_runtime.runtime`, fork handling) lives in
:mod:`monarch.core.process_runtime`, and which handler a message that arrived
goes to (ports, control kinds) in :mod:`monarch.core.dispatch`; this module is
the connection, the loop's threads and the ordered outbox.

The runtime knows NATS and nothing of actors: the actor layer plugs in what it
needs (control kinds with :meth:`Runtime.handle_ctl_kind`, connection listeners,
closers), so the core never imports upward.

All publishing goes through one ordered outbox on the loop, and all receiving
through one ordered intake (:mod:`monarch.broker.natspy_internals.intake`), which is what makes
per-sender ordering hold end to end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client

from monarch.broker.bodies import batch
from monarch.broker.connections.connect import connect
from monarch.broker.natspy_internals import sync_publish
from monarch.broker.natspy_internals.direct_write import DirectWrite
from monarch.broker.natspy_internals.inline import run_inline
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.natspy_internals.sync_publish import Publisher
from monarch.broker.vocabulary import subjects
from monarch.core.busy_poll import WAIT_HEADER, BusyPoll
from monarch.core.dispatch import PortsAndControl
from monarch.core.future import mark_loop_thread
from monarch.settings import Settings

log = logging.getLogger(__name__)


class LocalMsg:
    """A message handed over inside this process; quacks like nats-py's ``Msg``.

    ``owned``: ``data`` belongs to this message alone (a big body fetched out of
    band), so a decoder may use its memory in place instead of copying it.
    """

    # _mon_delivered: when an actor got it, set only while someone records calls
    # (monarch.actors.calls.activity.call_listeners); _mon_share: the arguments a
    # per_proc group's actors may read once (monarch.actors.hosting.group_fanout)
    __slots__ = ("subject", "data", "reply", "headers", "owned", "_mon_delivered", "_mon_share")

    def __init__(
        self, subject: str, data: Any, reply: str, headers: dict | None, owned: bool = False
    ) -> None:
        self.subject = subject
        self.data = data
        self.reply = reply
        self.headers = headers
        self.owned = owned


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed (faster I/O), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Runtime(PortsAndControl):
    """One process's connection to the system.

    Use :func:`monarch.core.process_runtime.runtime` to get it. Its receiving
    half, ports and control dispatch, is :class:`~monarch.core.dispatch.PortsAndControl`.
    """

    def __init__(self, *, proc_uid: str, loop: asyncio.AbstractEventLoop, cfg: Settings) -> None:
        self.proc_uid = proc_uid
        self.loop = loop
        self.settings = cfg
        self.namespace = cfg.namespace
        self.nats_url: str = ""
        self.nc: Client | None = None
        self.is_client = False
        self.root_uid = proc_uid  # the root client's proc uid (procs learn it from the environment)
        self._init_ports_and_control()
        self._inbox: collections.deque = collections.deque()  # calls from other threads
        self._inbox_scheduled = False
        self._draining = False  # the loop is running calls taken from the inbox
        # Fire-and-forget messages to one subject waiting to leave as one (monarch.broker.bodies.batch).
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
        # The connection's plain publish (monarch.broker.natspy_internals.sync_publish), made on first use.
        self._sync_publish_nc: Client | None = None
        self._sync_publish: Publisher | None = None
        # Threads' own writes to the broker's socket while the outbox is empty (connect()).
        self._direct_write: DirectWrite | None = None
        # Output of this proc (its forwarded prints) queued to leave, and how to send it
        # (loop only): it leaves before any other message, so a line printed before a
        # reply arrives before it. Set by monarch.actors.hosting.log_forwarding, the
        # flag from whichever thread printed.
        self.output_waiting = False
        self.flush_output: Callable[[], None] | None = None
        self._closing = False
        # Stops this process's runtime and all it started; set by whoever started
        # it (the client bootstrap), called once by shutdown_runtime().
        self.stop_process: Callable[[], None] | None = None

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
        self._direct_write = getattr(self.nc, "_monarch_direct_write", None)
        ns = self.namespace
        poke = self.busy_poll.on_message
        await subscribe_ordered(
            self.nc, subjects.port_wildcard(ns, self.proc_uid), self._on_port, poke
        )
        await subscribe_ordered(self.nc, subjects.ctl_proc(ns, self.proc_uid), self._on_ctl, poke)

    async def close(self) -> None:
        self._closing = True  # the broker connection's end is expected from now on
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

    def forget_on_close(self, closer: Callable[[], Any]) -> None:
        """Undo :meth:`on_close` for ``closer`` (what it closes was closed already)."""
        with contextlib.suppress(ValueError):
            self._closers.remove(closer)

    async def _on_nats_error(self, e: Exception) -> None:
        log.warning("NATS error on %s: %s", self.proc_uid, e)

    async def _on_disconnected(self) -> None:
        level = logging.DEBUG if self._closing else logging.INFO  # closing: nothing to report
        log.log(level, "%s disconnected from the broker", self.proc_uid)
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
        self._draining = True  # what it takes out may still be on its way to the socket
        self._inbox_scheduled = False  # first: an append from now on schedules a new drain
        inbox = self._inbox
        try:
            while inbox:
                fn, args = inbox.popleft()
                try:
                    fn(*args)
                except Exception:
                    log.exception("error in a call handed to the runtime loop")
        finally:
            self._draining = False

    def publish_from_thread(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, reply: str = ""
    ) -> bool:
        """From a thread other than the loop's: write the message now if nothing waits.

        The outbox's order holds: the message is written on this thread only
        while the loop has nothing of this process queued to write (its inbox,
        its batch; the connection's own queues, :mod:`monarch.broker.natspy_internals.direct_write`),
        so it could not have overtaken anything handed over before it. False:
        nothing was sent, hand it to the loop (:meth:`call_soon`) as usual.
        Messages to this process itself, and all of them while busy polling,
        stay on the loop.
        """
        direct = self._direct_write
        if (
            direct is None
            or self.nc is not direct.nc
            or threading.get_ident() == self._loop_thread_id
            or os.getpid() != self._pid  # call_soon says why
            or subject.startswith(self._own_port_prefix)
            or subject == self._own_ctl
            or self.busy_poll.window
            or self.output_waiting  # prints wait: the loop sends them first
        ):
            return False
        return direct.try_write(subject, payload, reply, headers, self._outbox_empty)

    def _outbox_empty(self) -> bool:
        return not (self._inbox or self._inbox_scheduled or self._draining or self._batch)

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
        go to the same subject, as one batch (:mod:`monarch.broker.bodies.batch`).
        """
        if subject.startswith(self._own_port_prefix):
            self._on_port(LocalMsg(subject, payload, reply, headers))
            return
        if subject == self._own_ctl:
            self._on_ctl(LocalMsg(subject, payload, reply, headers))
            return
        if self.output_waiting and self.flush_output is not None:
            self._flush_output()  # prints made before this message leave before it
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

    def _flush_output(self) -> None:
        try:
            self.flush_output()  # type: ignore[misc]
        except Exception:  # the message that asked goes on regardless
            log.exception("could not send this proc's waiting output")

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
        """Publish right here, without a task switch.

        In one plain call where the connection allows (:mod:`monarch.broker.natspy_internals.sync_publish`),
        else by running nats-py's ``publish`` coroutine here. It queues (or writes,
        :mod:`monarch.broker.natspy_internals.write_through`) the message's bytes before its first
        (rare) suspension, a forced flush of a full buffer, so the
        order of messages is fixed here either way; a suspended publish is
        finished by a task (:func:`monarch.broker.natspy_internals.inline.run_inline`).
        """
        nc = self.nc
        if nc is not self._sync_publish_nc:  # once per connection
            self._sync_publish_nc, self._sync_publish = nc, sync_publish.publisher(nc)
        if self._sync_publish is not None and self._sync_publish(subject, payload, reply, headers):
            return
        coro = nc.publish(subject, payload, reply=reply, headers=headers)
        run_inline(coro, self.loop, lambda e: self._publish_failed(subject, e, on_error))

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
