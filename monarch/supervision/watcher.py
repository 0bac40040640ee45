"""Watching other processes' heartbeats: each watched uid is alive, stalled, or dead.

A :class:`Watcher` subscribes (through a
:class:`~monarch.supervision.heartbeat.Heartbeater`'s thread, so a flooded
main connection does not delay them) to the heartbeats of the processes it
cares about and calls back when one is silent for
``MONARCH_HEARTBEAT_TIMEOUT`` or announces its own end (a ``dead`` heartbeat,
published by whoever reaped the process, :func:`announce_dead`). A heartbeat
that says its sender's loop has not turned for longer than the timeout makes a
*stalled* process, not a dead one; see :mod:`monarch.supervision.heartbeat`
for why silence is called only once the hearing thread has read past the
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client

from monarch.broker.vocabulary import subjects
from monarch.supervision.heartbeat import KIND, QUIET, STALL, Heartbeater

log = logging.getLogger(__name__)

# Timeouts the thread that hears heartbeats may go without reading before a
# watcher calls silences anyway (that thread itself stuck, not merely starved).
DEAF_LIMIT = 10


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
