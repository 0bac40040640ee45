"""Heartbeats out, and watching other processes' heartbeats in.

Every proc (and the client, and host agents) publishes a small message to
``mon.<ns>.hb.<uid>`` every ``MONARCH_HEARTBEAT_INTERVAL`` seconds; the
heartbeat stream keeps the latest per subject. A :class:`Watcher` subscribes to
the heartbeats of the processes it cares about and calls back when one is
silent for ``MONARCH_HEARTBEAT_TIMEOUT`` or announces its own end (a ``dead``
heartbeat, published by whoever reaped the process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client

from monarch.broker import subjects

log = logging.getLogger(__name__)

KIND = "Mon-Kind"


class Heartbeater:
    """Publishes this process's heartbeat until stopped."""

    def __init__(self, nc: Client, namespace: str, uid: str, interval: float) -> None:
        self.nc = nc
        self.subject = subjects.heartbeat(namespace, uid)
        self.interval = interval
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        n = 0
        while True:
            n += 1
            try:
                await self.nc.publish(
                    self.subject,
                    str(time.time()).encode(),
                    headers={KIND: "alive", "Mon-Seq": str(n)},
                )
            except Exception as e:
                log.debug("heartbeat not sent: %r", e)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def announce_dead(nc: Client, namespace: str, uid: str, reason: str) -> None:
    """Tell every watcher of ``uid`` at once that it is gone (it cannot say so itself)."""
    await nc.publish(subjects.heartbeat(namespace, uid), reason.encode(), headers={KIND: "dead"})


class Watcher:
    """Calls ``on_dead(uid, reason)`` once for each watched uid that dies or goes silent.

    A uid that has not beaten yet gets ``grace`` seconds from when watching
    started (a proc that is still starting is not dead).
    """

    def __init__(
        self,
        nc: Client,
        namespace: str,
        timeout: float,
        subscribe: Callable[[str, Callable[[Any], None]], Any],
        grace: float | None = None,
    ) -> None:
        self.nc = nc
        self.namespace = namespace
        self.timeout = timeout
        self.grace = max(grace if grace is not None else timeout, timeout)
        self._subscribe = subscribe
        self._last: dict[str, float] = {}
        self._callbacks: dict[str, list[Callable[[str, str], None]]] = {}
        self._subs: dict[str, Any] = {}
        self._dead: set[str] = set()
        self._task: asyncio.Task | None = None
        self._paused = False

    async def watch(self, uid: str, on_dead: Callable[[str, str], None]) -> None:
        if uid in self._dead:
            on_dead(uid, "it was already declared dead")
            return
        self._callbacks.setdefault(uid, []).append(on_dead)
        if uid in self._subs:
            return
        self._last[uid] = time.monotonic() + (self.grace - self.timeout)
        subject = subjects.heartbeat(self.namespace, uid)
        self._subs[uid] = await self._subscribe(
            subject, lambda msg, uid=uid: self._on_beat(uid, msg)
        )
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._check())

    def _on_beat(self, uid: str, msg: Any) -> None:
        if (msg.headers or {}).get(KIND) == "dead":
            self._declare(uid, msg.data.decode(errors="replace") or "its process exited")
            return
        self._last[uid] = time.monotonic()

    async def _check(self) -> None:
        period = min(0.1, self.timeout / 4)
        while True:
            await asyncio.sleep(period)
            if self._paused:
                continue
            now = time.monotonic()
            for uid, last in list(self._last.items()):
                if now - last > self.timeout:
                    self._declare(uid, f"no heartbeat for {self.timeout:.1f} s")

    def _declare(self, uid: str, reason: str) -> None:
        if uid in self._dead:
            return
        self._dead.add(uid)
        self._last.pop(uid, None)
        for cb in self._callbacks.pop(uid, []):
            try:
                cb(uid, reason)
            except Exception:
                log.exception("liveness callback for %s failed", uid)
        sub = self._subs.pop(uid, None)
        if sub is not None:
            asyncio.get_running_loop().create_task(sub.unsubscribe())

    def pause(self) -> None:
        """Our own broker connection is down: silence says nothing about the others."""
        self._paused = True

    def resume(self) -> None:
        """Back on the broker: everyone gets a fresh timeout from now."""
        now = time.monotonic()
        for uid in self._last:
            self._last[uid] = now
        self._paused = False

    def is_dead(self, uid: str) -> bool:
        return uid in self._dead

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for sub in self._subs.values():
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        self._subs.clear()
