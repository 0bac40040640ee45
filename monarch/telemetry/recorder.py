"""A process's telemetry buffer: spans and metric points, published in batches.

Telemetry is decided once per process, when its runtime starts
(``MONARCH_TELEMETRY``). Off, :data:`ON` stays False and the hooks on the
message path (``monarch.actors.calls``) cost one check of it: nothing else is
done per message. On, each hook appends one tuple to a deque (any thread may),
and the runtime's loop turns the deque into JSON lines every
``MONARCH_TELEMETRY_INTERVAL`` seconds, or sooner once
``MONARCH_TELEMETRY_BATCH`` spans wait, and publishes them to
``mon.<ns>.tel.<proc-uid>``, which the ``monarch-<ns>-telemetry`` stream keeps
(:mod:`monarch.telemetry.stream`).

The publishing itself is handed in (the actor layer gives the runtime's
publish), so this module knows nothing of actors and needs only the broker's
names.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from monarch.broker import headers as hdr

log = logging.getLogger(__name__)

ON = False
"""Whether this process records telemetry. The per-message hooks check only this."""

SPAN_FIELDS = (
    "span", "trace_id", "proc", "actor_id", "mesh", "rank", "endpoint", "start", "end", "ok",
    "caller",
)  # fmt: skip
"""The fields of a span record, in the order :meth:`Recorder.span` takes them."""

_MAX_PAYLOAD = 256 * 1024  # one batch message stays well under any broker's max_payload

_recorder: Recorder | None = None


class Recorder:
    """The buffer of one process. Made by :func:`start`; found with :func:`recorder`."""

    def __init__(
        self,
        proc: str,
        publish: Callable[[bytes, dict[str, str]], None],
        wake: Callable[[], None],
        batch: int,
        keep_values: bool = False,
    ) -> None:
        self.proc = proc
        self._publish = publish  # (payload, headers), called on the loop
        self._wake = wake  # asks the loop to flush soon; any thread
        self._batch = batch
        self._waking = False
        # Histogram points carry their raw values (capped) for an OTLP exporter to replay.
        self.keep_values = keep_values
        self._items: collections.deque[tuple] = collections.deque()
        self._prefix = secrets.token_hex(8)  # trace ids: 32 hex digits, as OpenTelemetry's
        self._ids = itertools.count(1)
        self.collectors: list[Callable[[float], list[dict[str, Any]]]] = []
        self.published = 0  # records published so far

    def new_trace(self) -> str:
        """A fresh trace id (the ``Mon-Trace`` header of one call)."""
        return f"{self._prefix}{next(self._ids):016x}"

    def span(
        self,
        name: str,
        trace: str | None,
        start: float,
        end: float,
        actor_id: str | None,
        mesh: str | None,
        rank: int | None,
        endpoint: str | None,
        ok: bool = True,
        caller: str | None = None,
    ) -> None:
        """Record one finished span (``start``/``end``: ``time.time()`` seconds). Any thread."""
        items = self._items
        items.append((name, trace, self.proc, actor_id, mesh, rank, endpoint, start, end, ok,
                      caller))  # fmt: skip
        if len(items) >= self._batch and not self._waking:
            self._waking = True
            self._wake()

    def flush(self) -> int:
        """Publish what waits (spans, then the metric points of this interval). Loop only."""
        self._waking = False
        now = time.time()
        lines: list[bytes] = []
        items = self._items
        for _ in range(len(items)):
            rec = dict(zip(SPAN_FIELDS, items.popleft()))
            rec["type"] = "span"
            lines.append(json.dumps(rec, separators=(",", ":")).encode())
        for collect in list(self.collectors):
            try:
                points = collect(now)
            except Exception:
                log.exception("a telemetry collector failed")
                continue
            for point in points:
                point["type"] = "metric"
                point["proc"] = self.proc
                lines.append(json.dumps(point, separators=(",", ":"), default=str).encode())
        if lines:
            self._send(lines)
        return len(lines)

    def _send(self, lines: list[bytes]) -> None:
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) + 1 > _MAX_PAYLOAD:
                self._publish_chunk(chunk)
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        if chunk:
            self._publish_chunk(chunk)

    def _publish_chunk(self, chunk: list[bytes]) -> None:
        headers = {hdr.KIND: "telemetry", hdr.FROM: self.proc, hdr.COUNT: str(len(chunk))}
        try:
            self._publish(b"\n".join(chunk), headers)
            self.published += len(chunk)
        except Exception as e:  # telemetry never fails the job
            log.warning("could not publish %d telemetry record(s): %r", len(chunk), e)


def start(rec: Recorder) -> Recorder:
    """Make ``rec`` this process's recorder and turn the hooks on."""
    global _recorder, ON
    _recorder = rec
    ON = True
    return rec


def stop() -> None:
    """Turn the hooks off (a runtime that closes, a forked child)."""
    global _recorder, ON
    ON = False
    _recorder = None


def current_recorder() -> Recorder | None:
    """This process's recorder, or None while telemetry is off."""
    return _recorder


def span(
    name: str,
    trace: str | None,
    start: float,
    end: float,
    actor_id: str | None,
    mesh: str | None,
    rank: int | None,
    endpoint: str | None,
    ok: bool = True,
    caller: str | None = None,
) -> None:
    """Record a span in this process's recorder, if telemetry is (still) on."""
    rec = _recorder
    if rec is not None:
        rec.span(name, trace, start, end, actor_id, mesh, rank, endpoint, ok, caller)


def new_trace() -> str | None:
    rec = _recorder
    return rec.new_trace() if rec is not None else None


# A forked child has our recorder, not our loop: it starts its own, if any.
import os  # noqa: E402

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=stop)
