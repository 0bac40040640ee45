"""The owner half of moving a proc's output to its owner: printing what its procs forward.

The proc half is :mod:`monarch.actors.hosting.log_forwarding`.

A :class:`LogCollector` per proc mesh subscribes to its procs'
log subjects before they start, and prints each line to the client's
``sys.stdout`` (stdout lines) or ``sys.stderr`` (stderr lines and log records)
prefixed with the actor and rank (``[trainers[2]] loss 0.5``), or with the proc
uid for lines from outside actors. :class:`LogMode` is what
``ProcMesh.logging_option`` sets. A new proc mesh streams to the client,
prints each line as it arrives, and shows records of level INFO and up: in
Monarch 0.7 procs write to the terminal they inherited (log forwarding is off
by default), so their lines show at once, in step with the client's own;
streaming them here does the same for procs on other machines too, and in a
notebook, whose cells do not show what is written to file descriptor 1.
With a window (``aggregate_window_sec``), identical lines (same text and
stream) seen within it print once when it closes, as ``[4 similar log lines]
loss 0.5``; a line seen once prints as usual, with its prefix. Unlike
Monarch, which groups lines by edit distance, only identical lines are folded.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.hosting.log_forwarding import STREAM
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.rpc import request_all
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogMode:
    """What ``ProcMesh.logging_option`` sets; the defaults are the mode a new proc mesh starts in.

    ``stream_to_client``: print the procs' output at the client (else each
    proc keeps it on its own stdout/stderr: for procs on this machine, the
    terminal the client started in). ``aggregate_window_sec``: fold identical
    lines seen within this many seconds into one; ``None`` prints each line as
    it arrives. ``level``: log records below it are not shown (prints are
    never filtered).
    """

    stream_to_client: bool = True
    aggregate_window_sec: float | None = None
    level: int = logging.INFO

    def __post_init__(self) -> None:
        if not isinstance(self.stream_to_client, bool):
            raise TypeError(f"stream_to_client must be a bool, got {self.stream_to_client!r}")
        w = self.aggregate_window_sec
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0):
            raise ValueError(f"aggregate_window_sec must be a positive number or None, got {w!r}")
        if w is not None and not self.stream_to_client:  # Monarch's error, in its words
            raise RuntimeError(
                "cannot set aggregate window without streaming to client "
                f"(aggregate_window_sec={w!r} needs stream_to_client=True)"
            )
        lv = self.level
        if isinstance(lv, bool) or not isinstance(lv, int) or not 0 <= lv <= 255:
            raise ValueError(f"invalid logging level {lv!r}: use an int from 0 to 255")


class LogCollector:
    """Prints the output of one proc mesh's procs at its owner; lives on the runtime's loop."""

    def __init__(self, rt: Runtime, mesh_name: str) -> None:
        self.rt = rt
        self.mesh_name = mesh_name
        self.mode = LogMode()
        self._proc_uids: list[str] = []
        self._subs: list[Any] = []
        self._groups: dict[tuple[str, str], list] = {}  # (stream, text) -> [count, first line]
        self._window: asyncio.TimerHandle | None = None
        self._stopped = False
        self._tasks: set[asyncio.Task] = set()

    async def start(self, proc_uids: list[str]) -> None:
        """Subscribe to the procs' log subjects; call before they start, so no line is missed."""
        self._proc_uids = list(proc_uids)
        for uid in proc_uids:
            subject = subjects.log(self.rt.namespace, uid)
            self._subs.append(await self.rt.subscribe_mesh(subject, self._on_message))
        await self._round_trip()  # the server has our subscriptions before any proc publishes

    async def stop(self) -> None:
        """Take in what the procs sent before they exited, unsubscribe, print what is pending."""
        if self._stopped:
            return
        await self._round_trip()  # lines a proc published before exiting are now handled
        self._stopped = True
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass
        self._subs.clear()
        self.flush()

    async def _round_trip(self) -> None:
        nc = self.rt.nc
        if self._subs and nc is not None and nc.is_connected:
            try:
                await nc.flush(timeout=2)
            except Exception as e:
                log.debug("log collector of %r: flush failed: %r", self.mesh_name, e)

    def set_mode(self, mode: LogMode, ready: asyncio.Future) -> None:
        """Apply ``mode`` here at once and, once the procs are up, there; any thread.

        Blocks until every proc has applied it (bounded by the spawn and stop
        timeouts), except on the runtime's own loop, where it is scheduled.
        """
        coro = self._set_mode(mode, ready)
        if self.rt.on_loop_thread():
            task = self.rt.loop.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        cfg = self.rt.settings
        self.rt.run_coro(coro).result(cfg.spawn_timeout + cfg.stop_timeout + 5)

    async def _set_mode(self, mode: LogMode, ready: asyncio.Future) -> None:
        self.flush()  # what was gathered under the old mode
        self.mode = mode
        try:
            await asyncio.shield(ready)
        except Exception:
            return  # the procs never came up: nothing to tell them
        if self._stopped:
            return
        body = dumps({"stream_to_client": mode.stream_to_client, "level": mode.level})
        ns = self.rt.namespace
        requests = [
            (subjects.ctl_proc(ns, uid), body, {m.KIND: "log_mode"}) for uid in self._proc_uids
        ]
        try:
            await request_all(self.rt, requests, self.rt.settings.stop_timeout)
        except Exception as e:
            log.warning("logging_option: not every proc of %r applied it: %s", self.mesh_name, e)

    def _on_message(self, msg: Msg) -> None:
        if self._stopped or not self.mode.stream_to_client:
            return
        headers = msg.headers or {}
        try:
            body = loads(msg.data)
            stream = headers.get(STREAM, "stdout")
            lines = list(body["lines"])
        except Exception as e:
            log.debug("undecodable log message on %s: %r", msg.subject, e)
            return
        level = body.get("level")
        if stream == "log" and level is not None and level < self.mode.level:
            return
        if body.get("actor"):
            prefix = f"[{body['actor']}[{body.get('rank')}]] "
        else:
            prefix = f"[{body.get('proc') or headers.get(m.FROM, '?')}] "
        window = self.mode.aggregate_window_sec
        if window is None:
            _print(stream, [prefix + line for line in lines])
            return
        for line in lines:
            group = self._groups.get((stream, line))
            if group is None:
                self._groups[(stream, line)] = [1, prefix + line]
            else:
                group[0] += 1
        if self._window is None:
            self._window = self.rt.loop.call_later(window, self.flush)

    def flush(self) -> None:
        """Close the current aggregation window: print its lines (loop only)."""
        if self._window is not None:
            self._window.cancel()
            self._window = None
        groups, self._groups = self._groups, {}
        by_stream: dict[str, list[str]] = {}
        for (stream, text), (count, first) in groups.items():
            line = first if count == 1 else f"[{count} similar log lines] {text}"
            by_stream.setdefault(stream, []).append(line)
        for stream, lines in by_stream.items():
            _print(stream, lines)


def _print(stream: str, lines: list[str]) -> None:
    """Write at the client: stdout lines to stdout; stderr lines and log records to stderr."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    try:
        out.write("".join(line + "\n" for line in lines))
        out.flush()
    except (OSError, ValueError):  # the client's stream is closed (interpreter exit)
        pass
