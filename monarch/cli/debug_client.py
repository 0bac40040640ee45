"""``monarch debug``'s side of the wire: find paused sessions, send them lines, wait (bounded).

Runs the broker connection on an event loop thread of its own, so the prompt
(:mod:`monarch.cli.debug`) can be a plain blocking ``input()`` on the main
thread, where Ctrl-C and Ctrl-D behave as in any terminal program. Every
call returns within its bound: an answer, or a state saying why there is none.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any

from nats.aio.client import Client

from monarch.actors.debugging import protocol as p
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects

# Answer states beyond the protocol's, made here when no answer came.
PROC_GONE = "proc-gone"  # the session's process stopped beating, or was announced dead
NO_ANSWER = "no-answer"  # alive, but no answer in time (it runs: a long `next`, a held GIL)


class DebugClient:
    """A connection to the broker, on its own loop thread, for a blocking caller."""

    def __init__(
        self, namespace: str, *, window: float, timeout: float, heartbeat_timeout: float
    ) -> None:
        self.namespace = namespace
        self.window = window  # seconds to collect answers to a list request
        self.timeout = timeout  # seconds a session has to answer a line
        self.heartbeat_timeout = heartbeat_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="monarch-debug-nats", daemon=True
        )
        self._thread.start()
        self._nc: Client | None = None

    def _run(self, coro: Coroutine[Any, Any, Any], bound: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(bound)

    def connect(self, url: str, timeout: float = 10.0) -> None:
        """Raises ConnectionError (with the broker's address) if it cannot be reached."""
        # Imported here: `monarch --help` must not pay for the broker client.
        from monarch.hosts.connect import connect

        self._nc = self._run(connect(url, "monarch-debug", timeout=timeout), timeout + 5)

    def close(self) -> None:
        if self._nc is not None:
            try:
                self._run(self._nc.close(), 5)
            except Exception:  # noqa: BLE001  (leaving anyway)
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # -- asking ---------------------------------------------------------------

    def sessions(self) -> list[dict[str, Any]]:
        """Every paused (or stepping) session in the namespace, by actor mesh and rank."""
        return self._run(self._sessions(), self.window + 10)

    def send(self, info: dict[str, Any], op: str, line: str = "") -> dict[str, Any]:
        """Send ``line`` (or an attach) to the session ``info``; its answer (``state`` says)."""
        return self._run(self._send(info, op, line), self.timeout + 10)

    def send_many(self, infos: list[dict[str, Any]], lines: list[str]) -> list[dict[str, Any]]:
        """Send ``lines``, one after another, to each session at once; each one's last answer."""
        return self._run(self._send_many(infos, lines), len(lines) * self.timeout + 10)

    async def _sessions(self) -> list[dict[str, Any]]:
        nc = self._nc
        assert nc is not None
        found: list[dict[str, Any]] = []
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            await nc.publish(p.list_subject(self.namespace), b"", reply=inbox)
            deadline = time.monotonic() + self.window
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except (asyncio.TimeoutError, TimeoutError):
                    break
                except Exception:  # noqa: BLE001  (nats-py's own timeout error)
                    break
                found += [s for s in p.decode(msg.data).get("sessions", []) if isinstance(s, dict)]
        finally:
            await sub.unsubscribe()
        return sorted(
            found, key=lambda s: (str(s.get("mesh")), s.get("rank", 0), str(s.get("actor")))
        )

    async def _send_many(
        self, infos: list[dict[str, Any]], lines: list[str]
    ) -> list[dict[str, Any]]:
        async def one(info: dict[str, Any]) -> dict[str, Any]:
            answer: dict[str, Any] = {}
            outs = []
            for line in lines:
                answer = await self._send(info, p.LINE, line)
                outs.append(answer.get("out") or "")
                if answer.get("state") != p.PROMPT:
                    break
            return {**answer, "out": "".join(outs)}

        return list(await asyncio.gather(*(one(i) for i in infos)))

    async def _send(self, info: dict[str, Any], op: str, line: str) -> dict[str, Any]:
        nc = self._nc
        assert nc is not None
        proc = str(info.get("proc"))
        beats = _Beats()
        hb = await nc.subscribe(subjects.heartbeat(self.namespace, proc), cb=beats.heard)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            subject = p.input_subject(self.namespace, proc, str(info.get("session")))
            await nc.publish(subject, p.encode({"op": op, "line": line}), reply=inbox)
            started = time.monotonic()
            deadline = started + self.timeout
            while (now := time.monotonic()) < deadline:
                if beats.dead or now - max(beats.last, started) > self.heartbeat_timeout:
                    return {"state": PROC_GONE, "out": ""}
                try:
                    msg = await sub.next_msg(timeout=min(0.25, deadline - now))
                except Exception:  # noqa: BLE001  (nats-py's timeout: look at the beats again)
                    continue
                answer = p.decode(msg.data)
                if answer.get("state"):
                    return answer
            return {"state": NO_ANSWER, "out": ""}
        finally:
            for s in (sub, hb):
                try:
                    await s.unsubscribe()
                except Exception:  # noqa: BLE001  (the connection is closing)
                    pass


class _Beats:
    """The heartbeats of one process heard while waiting for its answer."""

    def __init__(self) -> None:
        self.last = 0.0
        self.dead = False

    async def heard(self, msg: Any) -> None:
        if (msg.headers or {}).get(hdr.KIND) == "dead":
            self.dead = True
        else:
            self.last = time.monotonic()
