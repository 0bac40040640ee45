"""Asking a job's procs what they are doing, every interval, over one NATS connection.

Each round reads the registry (hosts and procs), then publishes one empty
request on ``mon.<ns>.ctl.ps`` and one on ``mon.<ns>.ctl.stats`` with reply
inboxes that stay subscribed, and collects answers until every registered
proc has given both or the round's window (most of an interval) is over. A
proc that does not answer in time is ``silent`` in that round; answers that
come later belong to no round and are dropped. Host agents are ``up`` while
their heartbeats are heard (:class:`HeartbeatSeen`, open as long as the
poller). A broker that cannot be reached makes a round with no answers and
``connected=False``; nats-py keeps reconnecting meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from nats.aio.client import Client

from monarch.broker.connections.registry import HeartbeatSeen, list_hosts, list_procs
from monarch.broker.vocabulary.subjects import ps_subject, stats_subject
from monarch.cli.watch.model import Poll, WatchModel


class Poller:
    """Feeds a :class:`WatchModel` from the broker (use ``async with``, then :meth:`poll`)."""

    def __init__(self, nc: Client, model: WatchModel) -> None:
        self.nc = nc
        self.model = model
        self.ns = model.namespace
        self._ps: dict[str, dict[str, Any]] = {}
        self._stats: dict[str, dict[str, Any]] = {}
        self._subs: list[Any] = []
        self._seen: HeartbeatSeen | None = None
        self._round = 0

    async def __aenter__(self) -> Poller:
        self._ps_inbox, self._stats_inbox = self.nc.new_inbox(), self.nc.new_inbox()
        self._subs = [
            await self.nc.subscribe(self._ps_inbox, cb=self._answer(self._ps)),
            await self.nc.subscribe(self._stats_inbox, cb=self._answer(self._stats)),
        ]
        self._seen = await HeartbeatSeen(self.nc, self.ns).__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            if self._seen is not None:
                await self._seen.__aexit__(None, None, None)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @staticmethod
    def _answer(into: dict[str, dict[str, Any]]) -> Any:
        async def on(msg: Any) -> None:
            try:
                doc = json.loads(msg.data)
                into[doc["uid"]] = doc
            except (ValueError, KeyError, TypeError):
                pass  # not an answer we understand: another version, or noise

        return on

    async def _registry(self) -> tuple[list, list]:
        # One after the other, not asyncio.gather: a gather whose parts are cancelled at
        # exit (q) while its caller is cancelled too leaves an exception nobody reads,
        # which asyncio prints as a traceback over the closing screen.
        return await list_hosts(self.nc, self.ns), await list_procs(self.nc, self.ns)

    async def poll(self, window: float | None = None) -> Poll:
        """One round (at most ``window`` s, default 0.7 of the interval); the model took it."""
        window = window if window is not None else max(0.3, 0.7 * self.model.interval)
        deadline = time.monotonic() + window
        if not self.nc.is_connected:
            poll = Poll(time=time.time(), connected=False)
            self.model.ingest(poll)
            return poll
        try:
            hosts, procs = await asyncio.wait_for(self._registry(), window)
        except Exception:  # the broker went away mid-round, or the registry is not there yet
            hosts, procs = [], []
        self._ps.clear()
        self._stats.clear()
        with contextlib.suppress(Exception):
            await self.nc.publish(ps_subject(self.ns), b"", reply=self._ps_inbox)
            await self.nc.publish(stats_subject(self.ns), b"", reply=self._stats_inbox)
        want = {p["uid"] for p in procs if p.get("uid")}
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            have = set(self._ps) & set(self._stats)
            if have and want <= have:
                break
        window_heard = max(1.0, 2 * self.model.interval)
        host_rows = [
            {
                **h.__dict__,
                "state": "up" if self._seen and self._seen.alive(h.uid, window_heard) else "silent",
            }
            for h in hosts
        ]
        poll = Poll(
            time=time.time(),
            connected=self.nc.is_connected,
            hosts=host_rows,
            registered=procs,
            ps=dict(self._ps),
            stats=dict(self._stats),
        )
        self.model.ingest(poll)
        return poll

    async def run(self, on_poll: Any = None) -> None:
        """Poll every interval until cancelled; ``on_poll()`` after each round."""
        while True:
            started = time.monotonic()
            await self.poll()
            if on_poll is not None:
                on_poll()
            await asyncio.sleep(max(0.0, self.model.interval - (time.monotonic() - started)))
