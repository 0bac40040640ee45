"""Heartbeats out: this process's beat, sent (and watched beats heard) on a thread of its own.

Every proc (and the client, and host agents) publishes a small message to
``mon.<ns>.hb.<uid>`` every ``MONARCH_HEARTBEAT_INTERVAL`` seconds; the
heartbeat stream keeps the latest per subject. A :class:`~monarch.supervision.watcher.Watcher` subscribes to
the heartbeats of the processes it cares about and calls back when one is
silent for ``MONARCH_HEARTBEAT_TIMEOUT`` or announces its own end (a ``dead``
heartbeat, published by whoever reaped the process).

Liveness does not depend on what the event loop is busy with. Heartbeats go
out from a thread of their own, on a broker connection of their own (nats-py's
client is not thread-safe), so an async endpoint that blocks the loop, or the
first tensor a proc decodes importing torch, does not silence them. Watched
heartbeats come in on that same connection and thread
(:meth:`Heartbeater.listen`), for the same reason the other way round: a proc
flooded with messages (a client broadcasting thousands to its actors) has
seconds of them queued on its main connection, and a heartbeat behind them
would be read too late; its owner would look dead to it. That thread too can
be kept from running (a CPU-starved proc whose GIL 64 busy actor threads
take turns at), so a watcher calls a silence only once the thread has read
its socket past the deadline (:meth:`Heartbeater.probe`; a thread that has
not read for :data:`~monarch.supervision.watcher.DEAF_LIMIT` timeouts holds nothing back). Each
heartbeat says for how long the process's event loop has not turned
(``Mon-Loop-Stall``, seconds; a cheap callback on the loop stamps the time it
last ran). A watcher that hears of a loop stalled for longer than the timeout
reports a *stalled loop* (a warning naming the process, and its
``stall_listeners``), not a dead process. Only silence (the process is gone,
frozen by SIGSTOP, or cut off from the broker) or a ``dead`` heartbeat makes a
process dead. The one thing the thread still shares with the loop is the GIL:
a C call that holds it for longer than the timeout would silence it too. The
known such calls, importing torch, are announced beforehand and buy the
process a longer allowance of silence (``Mon-Quiet``, see
:mod:`monarch.supervision.heavy_imports`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.supervision import heavy_imports
from monarch.supervision.loop_clock import LoopClock

log = logging.getLogger(__name__)

KIND = hdr.KIND
STALL = hdr.LOOP_STALL  # seconds the sender's event loop has not turned (0.000: it turns)
QUIET = hdr.QUIET  # seconds of silence to allow: the sender is importing torch
# Seconds the thread that hears heartbeats waits for the broker to confirm new
# subscriptions (Heartbeater.in_place); if it does not, the next beat's turn asks again.
PLACE_WAIT = 1.0


class Heartbeater:
    """Publishes this process's heartbeat from a thread of its own until stopped.

    ``connect`` makes the thread's own broker connection; it is called on the
    thread's private event loop (and again after a failed attempt, every
    interval). Give it the same connect function as the process's main
    connection, so both get the same credentials and message treatment.
    :meth:`start` is called on the event loop whose progress the heartbeats
    report.
    """

    def __init__(
        self,
        namespace: str,
        uid: str,
        interval: float,
        connect: Callable[[], Awaitable[Client]],
    ) -> None:
        self.subject = subjects.heartbeat(namespace, uid)
        self.uid = uid
        self.interval = interval
        self._connect = connect
        self.clock: LoopClock | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None  # set (on the thread's loop): beat now
        self._waiting: list[threading.Event] = []  # set once a beat has reached the broker
        self._nc: Client | None = None  # the thread's connection (used on the thread only)
        # subject -> handler of what :meth:`listen` asked to hear (under the lock)
        self._heard: dict[str, Callable[[Any], None]] = {}
        # Everything this thread's socket held at this time has been read (see probe()).
        self.heard_through = time.monotonic()
        self._probing = False  # a probe() is under way (set and cleared under the lock)
        self._nc_subs: dict[str, Any] = {}  # on the thread: subject -> nats subscription
        # Subjects the broker is known to hold our subscription to (a flush after the
        # SUB came back), and who waits for one to be (see in_place()); under the lock.
        self._placed: set[str] = set()
        self._placing: dict[str, list[concurrent.futures.Future]] = {}
        self._sync_lock = asyncio.Lock()  # used on the thread's loop only
        # Called on the thread with False when its connection drops and True when back.
        self.connection_listeners: list[Callable[[bool], None]] = []
        # Called on the thread at each beat, connected or not: checks that must run
        # while the process's loop may be blocked (stalled calls, monarch.actors.hosting.stalls).
        self.beat_listeners: list[Callable[[], None]] = []

    def start(self) -> None:
        # Stamped once per heartbeat: a stall matters only past the timeout, and each
        # stamp wakes a loop that may be carrying calls.
        self.clock = LoopClock(asyncio.get_running_loop(), self.interval)
        self.clock.start()
        self._thread = threading.Thread(
            target=self._run, name=f"monarch-heartbeat-{self.uid}", daemon=True
        )
        self._thread.start()
        heavy_imports.add_listener(self.beat_now)

    def beat_now(self) -> None:
        """Beat at once, and wait (at most ``heavy_imports.NOTICE_WAIT``) until it is sent.

        Called on a thread about to start a heavy import, so that watchers hear
        of it before the import's long C calls keep this thread from beating.
        """
        if threading.current_thread() is self._thread:
            return
        sent = threading.Event()
        with self._lock:
            loop, wake = self._loop, self._wake
            if loop is None or wake is None or self._stopping:
                return
            self._waiting.append(sent)
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # its loop has ended
            return
        sent.wait(heavy_imports.NOTICE_WAIT)

    def probe(self) -> None:
        """From any thread: move :attr:`heard_through` up to now, once this thread has read.

        For a watcher about to call a silence: heartbeats are heard on this
        thread, and a thread kept from running (a CPU-starved process, its GIL
        taken by busy actor threads) has not read what its socket holds. The
        time is taken on the thread's loop and kept after two more turns of
        it: each turn polls the socket, so whatever arrived before that time
        has been read (and its time noted by :meth:`Watcher._on_beat`) by then.
        """
        with self._lock:
            loop = self._loop
            if loop is None or self._probing or self._stopping:
                return
            self._probing = True

        def asked() -> None:
            since = time.monotonic()
            loop.call_soon(lambda: loop.call_soon(read_through, since))

        def read_through(since: float) -> None:
            with self._lock:
                self.heard_through = max(self.heard_through, since)
                self._probing = False

        try:
            loop.call_soon_threadsafe(asked)
        except RuntimeError:  # its loop has ended
            with self._lock:
                self._probing = False

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        task = loop.create_task(self._beat())
        with self._lock:
            self._loop, self._task = loop, task
            if self._stopping:
                task.cancel()
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    async def _beat(self) -> None:
        nc: Client | None = None
        n = failures = 0
        explained = False  # the loop's current stall came from a heavy import
        subscribed = False  # what listen() asked for is subscribed on this connection
        wake = asyncio.Event()
        with self._lock:
            self._wake = wake
        try:
            while True:
                with self._lock:
                    waiting, self._waiting = self._waiting, []
                if nc is None:
                    try:
                        nc = await self._connect(
                            disconnected_cb=self._disconnected, reconnected_cb=self._reconnected
                        )
                        self._nc = nc
                    except Exception as e:
                        failures += 1
                        level = logging.WARNING if failures == 1 else logging.DEBUG
                        log.log(
                            level, "heartbeat connection of %s failed (retrying): %s", self.uid, e
                        )
                if nc is not None and (not subscribed or self._unplaced()):
                    try:  # what watchers asked to hear before we were connected
                        await self._sync_heard()
                        subscribed = True
                    except Exception as e:
                        log.warning("heartbeat subscriptions of %s failed (retrying): %r",
                                    self.uid, e)  # fmt: skip
                if nc is not None:
                    n += 1
                    headers = {KIND: "alive", hdr.SEQ: str(n)}
                    stalled = self.clock.stalled_for() if self.clock is not None else 0.0
                    if self.clock is not None:
                        headers[STALL] = f"{stalled:.3f}"
                    # A stall that began during a heavy import stays explained until the
                    # loop turns again: the import may be over before the loop runs.
                    importing = heavy_imports.in_progress() is not None
                    explained = importing or (explained and stalled > 0)
                    if explained:
                        headers[QUIET] = f"{heavy_imports.ALLOWANCE:g}"
                    try:
                        await nc.publish(self.subject, str(time.time()).encode(), headers=headers)
                        if waiting:  # someone waits until watchers can have heard it
                            await nc.flush(timeout=heavy_imports.NOTICE_WAIT)
                    except Exception as e:
                        log.debug("heartbeat not sent: %r", e)
                for sent in waiting:
                    sent.set()
                for listener in list(self.beat_listeners):
                    try:
                        listener()
                    except Exception:
                        log.exception("beat listener of %s failed", self.uid)
                self.probe()  # heard_through stays fresh while this thread turns
                try:
                    await asyncio.wait_for(wake.wait(), self.interval)
                except asyncio.TimeoutError:
                    pass
                wake.clear()
        finally:
            self._nc = None
            if nc is not None:
                try:
                    await asyncio.wait_for(nc.close(), 2.0)
                except BaseException:
                    pass

    # -- hearing others' heartbeats on this thread ------------------------------

    async def listen(self, subject: str, handler: Callable[[Any], None]) -> HeardSubject:
        """Hear ``subject`` on this thread's connection; ``handler(msg)`` runs on this thread.

        Awaitable on any event loop, and it does not suspend (callers rely on
        that: a proc mesh's start goes on to mark itself settled): the
        subscription is made on the thread soon after, or once it is connected.
        A beat missed meanwhile is within the watcher's grace.
        """
        with self._lock:
            self._heard[subject] = handler
        self._sync_soon()
        return HeardSubject(self, subject)

    def publish(self, subject: str, body: bytes, headers: dict[str, str] | None = None) -> bool:
        """From any thread: publish on this thread's connection; False if it has none now.

        The side channel of a process: it is answered from here while the
        process's event loop is blocked (an async endpoint in a long call, a
        paused debugger), so ``monarch stacks`` and ``monarch debug`` are heard
        then too. Best effort, in call order; nothing is sent once stopped.
        """
        with self._lock:
            loop, nc = self._loop, self._nc
            if loop is None or nc is None or self._stopping:
                return False

        def send() -> None:
            if nc.is_closed:
                return
            task = loop.create_task(nc.publish(subject, body, headers=headers))
            task.add_done_callback(_log_unsent)

        if threading.current_thread() is self._thread:
            send()
            return True
        try:
            loop.call_soon_threadsafe(send)
        except RuntimeError:  # its loop has just ended
            return False
        return True

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` began: the process is ending (e.g. a paused debugger goes on)."""
        return self._stopping

    def in_place(self, subject: str) -> concurrent.futures.Future:
        """A future (any thread) done once the broker holds our subscription to ``subject``.

        Until then a beat on ``subject`` reaches nobody here, so whoever is about
        to make the sender busy (a call that will make it import torch) waits for
        this first: the beat that announces the import must not be missed.
        """
        placed: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if subject in self._placed:
                placed.set_result(None)
            else:
                self._placing.setdefault(subject, []).append(placed)
        return placed

    def _unplaced(self) -> set[str]:
        """Subscribed on the thread, not yet confirmed by the broker."""
        with self._lock:
            return set(self._nc_subs) - self._placed

    def _now_placed(self, subjects_: set[str]) -> None:
        with self._lock:
            subjects_ &= set(self._heard)  # not dropped meanwhile
            self._placed |= subjects_
            done = [f for s in subjects_ for f in self._placing.pop(s, [])]
        for placed in done:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # given up on
                placed.set_result(None)

    async def _forget(self, subject: str) -> None:
        with self._lock:
            self._heard.pop(subject, None)
            self._placed.discard(subject)
            self._placing.pop(subject, None)  # whoever waits gives up at its own bound
        self._sync_soon()

    def _sync_soon(self) -> None:
        with self._lock:
            loop = self._loop
        if loop is None or loop.is_closed():
            return  # not running yet (it subscribes once connected) or over
        try:
            loop.call_soon_threadsafe(self._start_sync)
        except RuntimeError:  # its loop has just ended
            pass

    def _start_sync(self) -> None:
        """On the thread."""
        task = asyncio.get_running_loop().create_task(self._sync_heard())
        task.add_done_callback(self._sync_done)

    def _sync_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("heartbeat subscriptions of %s not updated: %r", self.uid, task.exception())

    async def _sync_heard(self) -> None:
        """On the thread: subscribe to what is asked for and not yet heard, drop the rest."""
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        async with self._sync_lock:  # one at a time: none may subscribe a subject twice
            with self._lock:
                wanted = set(self._heard)
            for subject in [s for s in self._nc_subs if s not in wanted]:
                with contextlib.suppress(Exception):
                    await self._nc_subs.pop(subject).unsubscribe()
            for subject in wanted - set(self._nc_subs):
                # The intake, as on the main connection: with a job key, a beat without
                # a valid tag (a forger's "dead") is dropped before anyone sees it.
                self._nc_subs[subject] = await subscribe_ordered(
                    nc, subject, self._deliverer(subject)
                )
            unplaced = self._unplaced()
            if unplaced:
                # The broker has handled our SUBs once it answers a PING sent after them.
                await nc.flush(timeout=PLACE_WAIT)
                self._now_placed(unplaced)

    def _deliverer(self, subject: str) -> Callable[[Any], None]:
        def deliver(msg: Any) -> None:
            handler = self._heard.get(subject)
            if handler is not None:
                handler(msg)

        return deliver

    async def _disconnected(self) -> None:
        self._tell_connection(False)

    async def _reconnected(self) -> None:
        self._tell_connection(True)

    def _tell_connection(self, up: bool) -> None:
        for listener in list(self.connection_listeners):
            try:
                listener(up)
            except Exception:
                log.exception("heartbeat connection listener failed")

    async def stop(self) -> None:
        """Stop beating and wait (bounded) for the thread to end."""
        heavy_imports.remove_listener(self.beat_now)
        if self.clock is not None:
            self.clock.stop()
        with self._lock:
            self._stopping = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop has already ended
                pass
        thread, self._thread = self._thread, None
        deadline = time.monotonic() + 5.0
        # Polled rather than joined in an executor: this also runs at interpreter exit.
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)


def _log_unsent(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("side-channel message not sent: %r", task.exception())


class HeardSubject:
    """What :meth:`Heartbeater.listen` returns: ``await unsubscribe()`` stops hearing it."""

    def __init__(self, heartbeater: Heartbeater, subject: str) -> None:
        self._heartbeater = heartbeater
        self.subject = subject

    def in_place(self) -> concurrent.futures.Future:
        """Done once the broker holds this subscription (:meth:`Heartbeater.in_place`)."""
        return self._heartbeater.in_place(self.subject)

    async def unsubscribe(self) -> None:
        await self._heartbeater._forget(self.subject)
