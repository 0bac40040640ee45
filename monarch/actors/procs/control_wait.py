"""Waiting for procs to answer a control request that runs user code (a spawn, a bootstrap).

Why not a plain timeout: an actor's ``__init__`` may be slow for good
reasons (``import torch`` in 64 procs on 2 cores took 62 s), and Monarch
waits for it: spawning returns at once and calls queue behind ``__init__``.
Failing such a spawn after a fixed time would fail healthy jobs. So
``MONARCH_SPAWN_TIMEOUT`` bounds *silence* only: a proc that, since the
request was sent, has neither answered nor been heard from (a heartbeat) for
that long fails the wait with an error naming the mesh, the silent ranks, the
elapsed time and the setting. A proc that has been heard from is alive and
busy; its liveness from then on is the heartbeat watcher's call: a proc
declared dead, or whose process exits, fails the wait at once with that
reason (:meth:`ControlWait.proc_lost`, called by its proc mesh).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from nats.aio.msg import Msg

from monarch.actors.errors import SpawnError
from monarch.actors.messaging import messages as m
from monarch.core.runtime import Runtime

SETTING = "MONARCH_SPAWN_TIMEOUT"


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class ControlWait:
    """One control request to each of ``uids`` (rank = index); their replies, in rank order.

    ``what`` names the work in errors ("spawning actor mesh 'trainer'").
    ``last_heard(uid)``: when a heartbeat of ``uid`` was last heard (monotonic),
    or None; ``unread_since(t)``: whether the thread that hears heartbeats may
    not have read since ``t`` (a silence is not called while our own hearing
    lags: a CPU-starved client). ``fail_fast``: an ``error`` reply ends the wait at once (the other
    ranks may run a slow ``__init__`` for minutes); the caller reads it from the
    replies, where ranks not yet answered are None. ``error``: the exception
    type raised for silence or a lost proc.
    """

    def __init__(
        self,
        rt: Runtime,
        what: str,
        uids: Sequence[str],
        last_heard: Callable[[str], float | None],
        *,
        unread_since: Callable[[float], bool] | None = None,
        fail_fast: bool = False,
        error: type[Exception] = SpawnError,
    ) -> None:
        self.rt = rt
        self.what = what
        self.uids = list(uids)
        self._last_heard = last_heard
        self._unread_since = unread_since
        self._fail_fast = fail_fast
        self._error = error
        self.replies: list[Msg | None] = [None] * len(self.uids)
        self._count = 0
        self._done: asyncio.Future = rt.loop.create_future()

    def proc_lost(self, uid: str, why: BaseException | str) -> None:
        """On the loop: ``uid``'s proc is gone; if it has not answered, the wait fails now."""
        for rank, u in enumerate(self.uids):
            if u == uid and self.replies[rank] is None:
                err = self._error(f"{self.what} failed on rank {rank}: {why}")
                if isinstance(why, BaseException):
                    err.__cause__ = why
                self.abort(err)
                return

    def abort(self, exc: BaseException) -> None:
        """On the loop: end the wait with ``exc`` (the mesh is being stopped, say)."""
        if not self._done.done():
            self._done.set_exception(exc)
            self._done.exception()  # retrieved: run() raises it, if still waiting

    def _take(self, msg: Msg) -> None:
        try:
            rank = int((msg.headers or {}).get(m.RANK, "-1"))
        except ValueError:
            return
        if not 0 <= rank < len(self.replies) or self.replies[rank] is not None:
            return
        self.replies[rank] = msg
        self._count += 1
        failed = self._fail_fast and (msg.headers or {}).get(m.KIND) == "error"
        if (failed or self._count == len(self.replies)) and not self._done.done():
            self._done.set_result(None)

    async def run(
        self, targets: Sequence[str], body: bytes, headers: dict[str, str], timeout: float
    ) -> list[Msg | None]:
        """Send ``body`` to each of ``targets`` (one per uid) and wait as described above."""
        port_id, reply = self.rt.open_port(self._take)
        try:
            sent = time.monotonic()
            for rank, target in enumerate(targets):
                self.rt.publish(target, body, {**headers, m.RANK: str(rank)}, reply)
            if not targets:
                return []
            done, _ = await asyncio.wait([self._done], timeout=timeout)
            while not done:
                silent = [r for r in self._pending() if not self._heard_since(r, sent)]
                if not silent:
                    await self._done  # all alive and busy: their heartbeats bound the rest
                    break
                if self._unread_since is None or not self._unread_since(sent + timeout):
                    raise self._silence(silent, time.monotonic() - sent, timeout)
                # our hearing thread has not read since the deadline: look again soon
                done, _ = await asyncio.wait([self._done], timeout=min(0.2, timeout))
            self._done.result()
            return self.replies
        finally:
            self.rt.close_port(port_id)

    def _pending(self) -> list[int]:
        return [r for r, reply in enumerate(self.replies) if reply is None]

    def _heard_since(self, rank: int, sent: float) -> bool:
        uid = self.uids[rank]
        if uid == self.rt.proc_uid:
            return True  # this process: alive, running the request on another thread
        heard = self._last_heard(uid)
        return heard is not None and heard >= sent

    def _silence(self, silent: list[int], elapsed: float, timeout: float) -> Exception:
        up = [r for r in range(len(self.uids)) if r not in silent]
        n = len(self.uids)
        procs = ", ".join(self.uids[r] for r in silent)
        text = (
            f"{self.what} ({n} rank{'s' if n != 1 else ''}): {_ranks(silent)} showed no sign "
            f"of life (no heartbeat, no answer) within {SETTING}={timeout:g}s "
            f"(elapsed {elapsed:.1f} s; proc{'s' if len(silent) != 1 else ''} {procs})"
        )
        if up:
            text += f"; {_ranks(up)} {'is' if len(up) == 1 else 'are'} up"
        return self._error(text)
