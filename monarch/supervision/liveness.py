"""Heartbeats out, and watching other processes' heartbeats in.

Every proc (and the client, and host agents) publishes a small message to
``mon.<ns>.hb.<uid>`` every ``MONARCH_HEARTBEAT_INTERVAL`` seconds; the
heartbeat stream keeps the latest per subject. A :class:`Watcher` subscribes to
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
not read for :data:`DEAF_LIMIT` timeouts holds nothing back). Each
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

log = logging.getLogger(__name__)

KIND = hdr.KIND
STALL = hdr.LOOP_STALL  # seconds the sender's event loop has not turned (0.000: it turns)
QUIET = hdr.QUIET  # seconds of silence to allow: the sender is importing torch
# Timeouts the thread that hears heartbeats may go without reading before a
# watcher calls silences anyway (that thread itself stuck, not merely starved).
DEAF_LIMIT = 10
# Seconds the thread that hears heartbeats waits for the broker to confirm new
# subscriptions (Heartbeater.in_place); if it does not, the next beat's turn asks again.
PLACE_WAIT = 1.0


class LoopClock:
    """When an event loop last turned, readable from any thread.

    A callback on the loop stamps the time every ``period`` seconds; a loop
    busy with something else (a blocking call, a long import) does not run it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float) -> None:
        self.loop = loop
        self.period = period
        self.last = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Start stamping (on the loop's thread)."""
        self._tick()

    def _tick(self) -> None:
        self.last = time.monotonic()
        self._handle = self.loop.call_later(self.period, self._tick)

    def stalled_for(self) -> float:
        """Seconds the loop is overdue: 0 while it turns at least every ``period``."""
        return max(0.0, time.monotonic() - self.last - self.period)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


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


async def announce_dead(nc: Client, namespace: str, uid: str, reason: str) -> None:
    """Tell every watcher of ``uid`` at once that it is gone (it cannot say so itself)."""
    await nc.publish(subjects.heartbeat(namespace, uid), reason.encode(), headers={KIND: "dead"})


def _seconds(headers: dict, name: str) -> float:
    """A heartbeat header's number of seconds (0 when absent or malformed)."""
    try:
        return float(headers.get(name) or 0.0)
    except ValueError:
        return 0.0


class Watcher:
    """Calls ``on_dead(uid, reason)`` once for each watched uid that dies or goes silent.

    A uid that has not beaten yet gets ``grace`` seconds from when watching
    started (a proc that is still starting is not dead). A uid whose
    heartbeats say its event loop has not turned for longer than ``timeout``
    is *stalled*, not dead: it is logged as a warning, kept in :attr:`stalls`
    (uid -> seconds, while it lasts) and each of :attr:`stall_listeners` is
    called once per stall with ``(uid, seconds)``, on this watcher's loop
    (logged at INFO instead when its heartbeats say it is importing torch). A
    uid whose last heartbeat carried ``Mon-Quiet`` may be silent that long.

    ``subscribe(subject, handler)`` may call ``handler`` on another thread
    (:meth:`Heartbeater.listen` does, on the heartbeat thread): the time a beat
    is heard is taken there, the rest is handled on the loop ``watch`` runs on.

    ``announcements`` (a subscribe on the main connection): where ``dead``
    heartbeats are taken from instead. A reaper announces a death after it
    reported the exit (with its code) on its main connection; heard on the
    same connection, the announcement comes after that report, never before
    it, so a proc that exited is reported as exited, not as gone silent.
    """

    def __init__(
        self,
        nc: Client,
        namespace: str,
        timeout: float,
        subscribe: Callable[[str, Callable[[Any], None]], Any],
        grace: float | None = None,
        announcements: Callable[[str, Callable[[Any], None]], Any] | None = None,
    ) -> None:
        self.nc = nc
        self.namespace = namespace
        self.timeout = timeout
        self.grace = max(grace if grace is not None else timeout, timeout)
        self._subscribe = subscribe
        self._announcements = announcements
        self._ann_subs: dict[str, Any] = {}
        self._last: dict[str, float] = {}
        self._callbacks: dict[str, list[Callable[[str, str], None]]] = {}
        self._subs: dict[str, Any] = {}
        self._dead: set[str] = set()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where callbacks run
        self._loop_thread: int | None = None
        self._paused: set[str] = set()  # why silence says nothing now (connections down)
        self.stalls: dict[str, float] = {}
        self.stall_listeners: list[Callable[[str, float], None]] = []
        # uid -> seconds of silence its last heartbeat asked for (a heavy import under way)
        self._quiet: dict[str, float] = {}
        self._explained: set[str] = set()  # stalled uids whose heartbeats said why
        self._hearing: Heartbeater | None = None  # whose thread hears the beats (follow())
        # uid -> when its last heartbeat was heard (monotonic): a sign of life for whoever
        # waits on it for something slow (a spawn whose __init__ runs, see last_heard)
        self._heard: dict[str, float] = {}

    async def watch(self, uid: str, on_dead: Callable[[str, str], None]) -> None:
        if uid in self._dead:
            on_dead(uid, "it was already declared dead")
            return
        self._callbacks.setdefault(uid, []).append(on_dead)
        if uid in self._subs:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        self._last[uid] = time.monotonic() + (self.grace - self.timeout)
        subject = subjects.heartbeat(self.namespace, uid)
        self._subs[uid] = await self._subscribe(
            subject, lambda msg, uid=uid: self._on_beat(uid, msg)
        )
        if self._announcements is not None:
            self._ann_subs[uid] = await self._announcements(
                subject, lambda msg, uid=uid: self._on_announcement(uid, msg)
            )
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._check())

    async def listening(self, uids: list[str]) -> None:
        """Wait (at most ``grace`` seconds) until the broker holds our subscriptions to
        the heartbeats of ``uids`` (watched already), and start their clocks from then.

        A beat sent before that reaches nobody here. That is harmless for an
        ordinary beat (the next one comes), but not for the one that announces a
        heavy import: the sender can beat no more until the import is over, and a
        watcher that missed the announcement takes that silence for a death. So
        whoever is about to send a watched process something that may start such
        an import (a proc mesh before it calls itself ready, a proc before it says
        ready to its owner) waits for this first.
        """
        waits = []
        for uid in uids:
            in_place = getattr(self._subs.get(uid), "in_place", None)
            if in_place is not None:
                waits.append(asyncio.wrap_future(in_place()))
        if waits:
            _, late = await asyncio.wait(waits, timeout=self.grace)
            for placed in late:  # the hearing connection is down or slow: go on without
                placed.cancel()
        start = time.monotonic() + (self.grace - self.timeout)
        for uid in uids:
            if uid in self._last and uid not in self._dead:
                self._last[uid] = max(self._last[uid], start)

    def _on_announcement(self, uid: str, msg: Any) -> None:
        """On the loop, from the main connection: only ``dead`` beats count here."""
        if (msg.headers or {}).get(KIND) == "dead":
            self._handle_beat(uid, msg, time.monotonic())

    def _on_beat(self, uid: str, msg: Any) -> None:
        heard_at = time.monotonic()
        if (msg.headers or {}).get(KIND) == "dead":
            if self._announcements is not None:
                return  # taken from the main connection, in order (_on_announcement)
        elif uid not in self._dead:
            self._heard[uid] = heard_at
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            # Heard on the heartbeat thread (Heartbeater.listen): note the time at
            # once, so a loop that is busy (a backlog of calls) does not take a late
            # reading for silence, and handle the rest on the loop.
            if uid in self._last and uid not in self._dead:
                self._last[uid] = heard_at
            try:
                self._loop.call_soon_threadsafe(self._handle_beat, uid, msg, heard_at)
            except RuntimeError:  # the loop has ended: the process is exiting
                pass
            return
        self._handle_beat(uid, msg, heard_at)

    def _handle_beat(self, uid: str, msg: Any, heard_at: float) -> None:
        if uid in self._dead:
            return
        headers = msg.headers or {}
        if headers.get(KIND) == "dead":
            self._declare(uid, msg.data.decode(errors="replace") or "its process exited")
            return
        self._last[uid] = max(self._last.get(uid, heard_at), heard_at)
        quiet = _seconds(headers, QUIET)
        if quiet > 0:
            self._quiet[uid] = quiet
        else:
            self._quiet.pop(uid, None)
        stall = _seconds(headers, STALL)
        if stall > self.timeout:
            self._stalled(uid, stall, importing=quiet > 0)
        elif uid in self.stalls:
            log.log(
                logging.INFO if uid in self._explained else logging.WARNING,
                "process %s: its event loop turns again (stalled for %.1f s or more)",
                uid,
                self.stalls.pop(uid),
            )
            self._explained.discard(uid)

    def _stalled(self, uid: str, seconds: float, importing: bool = False) -> None:
        first = uid not in self.stalls
        self.stalls[uid] = seconds
        if not first:
            return
        if importing:
            # Its own heartbeat says why (importing torch): expected, so no warning.
            self._explained.add(uid)
        log.log(
            logging.INFO if importing else logging.WARNING,
            "process %s: its event loop has not turned for %.1f s (more than "
            "MONARCH_HEARTBEAT_TIMEOUT=%g s), but its heartbeats still arrive: it is alive "
            "and busy, not dead. Messages to it wait until the loop turns again. Something "
            "blocks that loop: an async endpoint calling time.sleep or doing long CPU work "
            "(make it a plain `def` endpoint, or use asyncio.to_thread), or a slow import "
            "(torch, the first time a tensor arrives).",
            uid,
            seconds,
            self.timeout,
        )
        for cb in list(self.stall_listeners):
            try:
                cb(uid, seconds)
            except Exception:
                log.exception("stall listener for %s failed", uid)

    async def _check(self) -> None:
        # Sleeps until the earliest moment someone could be overdue, not on a fixed
        # tick: heartbeats keep moving that moment, so the loop wakes for this about
        # once per timeout instead of ten times a second (each wake-up of a loop
        # that is also carrying calls adds to their tail, NOTES 26). Never longer
        # than half a timeout (a uid may start being watched meanwhile).
        late_limit = min(0.1, self.timeout / 4)
        while True:
            now = time.monotonic()
            deadlines = [
                last + max(self.timeout, self._quiet.get(uid, 0.0))
                for uid, last in self._last.items()
            ]
            wait = min([self.timeout / 2] + [d - now for d in deadlines])
            wait = max(wait, late_limit / 2)
            await asyncio.sleep(wait)
            now, intended = time.monotonic(), now + wait
            # Our own loop may have been stalled: the heartbeats of that time wait unread
            # in our socket, so it is our silence, not theirs. Do not count it.
            late = now - intended
            if late > late_limit:
                for uid in self._last:
                    self._last[uid] += late
            if self._paused:
                continue
            for uid, last in list(self._last.items()):
                allowed = max(self.timeout, self._quiet.get(uid, 0.0))
                if now - last > allowed and not self._unread_since(last + allowed, now):
                    self._declare(uid, f"no heartbeat for {allowed:.1f} s")

    def _unread_since(self, deadline: float, now: float) -> bool:
        """Whether the thread that hears the beats may not have read since ``deadline``.

        Then the silence may be ours (that thread kept from running), not the
        sender's: ask it to read (:meth:`Heartbeater.probe`) and decide on a
        later check, once it has. A hearing thread that has not read for
        :data:`DEAF_LIMIT` timeouts no longer holds a verdict back.
        """
        hearing = self._hearing
        if hearing is None:
            return False
        heard_through = hearing.heard_through
        if heard_through >= deadline or now - heard_through > DEAF_LIMIT * self.timeout:
            return False
        hearing.probe()
        return True

    def _declare(self, uid: str, reason: str) -> None:
        if uid in self._dead:
            return
        self._dead.add(uid)
        self._last.pop(uid, None)
        self._heard.pop(uid, None)
        self.stalls.pop(uid, None)
        self._quiet.pop(uid, None)
        self._explained.discard(uid)
        for cb in self._callbacks.pop(uid, []):
            try:
                cb(uid, reason)
            except Exception:
                log.exception("liveness callback for %s failed", uid)
        for subs in (self._subs, self._ann_subs):
            sub = subs.pop(uid, None)
            if sub is not None:
                asyncio.get_running_loop().create_task(sub.unsubscribe())

    def pause(self, connection: str = "main") -> None:
        """Our own broker ``connection`` is down: silence says nothing about the others.

        Heartbeats come in on the heartbeat connection; the main one carries
        what is sent to the watched (both must be up for silence to mean death).
        """
        self._paused.add(connection)

    def resume(self, connection: str = "main") -> None:
        """``connection`` is back; once all are, everyone gets a fresh timeout from now."""
        self._paused.discard(connection)
        if self._paused:
            return
        now = time.monotonic()
        for uid in self._last:
            self._last[uid] = now

    def follow(self, heartbeater: Heartbeater, loop: asyncio.AbstractEventLoop) -> None:
        """Pause while ``heartbeater``'s connection (where we hear beats) is down, and
        call no silence its thread has not had the chance to hear.

        Its listeners run on the heartbeat thread; the change is made on ``loop``.
        """
        self._hearing = heartbeater

        def changed(up: bool) -> None:
            change = self.resume if up else self.pause
            with contextlib.suppress(RuntimeError):  # the loop has ended: we are exiting
                loop.call_soon_threadsafe(change, "heartbeat")

        heartbeater.connection_listeners.append(changed)

    def is_dead(self, uid: str) -> bool:
        return uid in self._dead

    def unread_since(self, when: float) -> bool:
        """Whether the thread that hears heartbeats may not have read its socket since
        ``when`` (monotonic): then a silence since ``when`` may be ours, not the sender's
        (see :meth:`_unread_since`; asks that thread to read)."""
        return self._unread_since(when, time.monotonic())

    def last_heard(self, uid: str) -> float | None:
        """When a heartbeat of ``uid`` was last heard (``time.monotonic()``); None if
        none has been since watching began, or once it is declared dead.

        A sign of life, not a verdict: a proc heard from while its actors'
        ``__init__`` runs is busy, not gone (the wait for a spawn reads this;
        silence later is still this watcher's to call).
        """
        return self._heard.get(uid)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sub in [*self._subs.values(), *self._ann_subs.values()]:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        self._subs.clear()
        self._ann_subs.clear()
