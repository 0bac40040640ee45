"""A process's telemetry buffer: spans and metric points, published in batches.

Telemetry is decided once per process, when its runtime starts
(``MONARCH_TELEMETRY``). Off, :data:`ON` stays False and the hooks on the
message path (``monarch.actors.calls``) cost one check of it: nothing else is
done per message. On, each hook appends one tuple to a deque (any thread may;
an actor's finished call appends its record as it is, and the flush makes its
deliver and handle spans), and a thread of the process's own
(:mod:`monarch.telemetry.flusher`) packs the deques into msgpack messages every
``MONARCH_TELEMETRY_INTERVAL`` seconds, or sooner once
``MONARCH_TELEMETRY_BATCH`` records wait, and publishes them to
``mon.<ns>.tel.<proc-uid>``, which the ``monarch-<ns>-telemetry`` stream keeps
(:mod:`monarch.telemetry.stream`). The event loop never packs or publishes a span.

The publishing itself is handed in (the actor layer gives the flusher's),
so this module knows nothing of actors and needs only the broker's names.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgpack

from monarch.broker.vocabulary import headers as hdr

log = logging.getLogger(__name__)

ON = False
"""Whether this process records telemetry. The per-message hooks check only this."""

SPAN_FIELDS = (
    "span", "trace_id", "proc", "actor_id", "mesh", "rank", "endpoint", "start", "end", "ok",
    "caller",
)  # fmt: skip
"""The fields of a span record, in the order :meth:`Recorder.span` takes them."""

CALL_FIELDS = (
    "actor_id", "mesh", "mesh_uid", "rank", "endpoint", "caller", "delivered", "started",
    "ended", "ok", "trace",
)  # fmt: skip
"""The fields of a finished call's record (the actor layer's ``CallRecord``), as
:meth:`Recorder.call` takes it and a batch's ``calls`` carry it: each is the
deliver and handle spans of one call, made by the reader
(:func:`monarch.telemetry.stream.decode_batch`), so the process pays for one record."""

LOG_FIELDS = ("time", "actor_id", "level", "logger", "message", "pathname", "lineno")
"""The fields of a log record (:mod:`monarch.telemetry.log_events`), as :meth:`Recorder.log`
takes it and a batch's ``logs`` carry it (the batch's ``proc`` is each record's proc)."""

CHUNK = 500
"""Spans per batch message. The flusher lets the GIL go between chunks: packing one
takes about 0.2 ms, the longest a busy loop thread waits for the flusher's thread."""

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
        self._publish = publish  # (payload, headers), called by flush()
        self._wake = wake  # asks for a flush soon; any thread
        self._batch = batch
        self._waking = False
        # Histogram points carry their raw values (capped) for an OTLP exporter to replay.
        self.keep_values = keep_values
        self._items: collections.deque[tuple] = collections.deque()
        # Records of finished calls: the actor's thread appends one tuple it already has,
        # nothing more; call_filter makes them CALL_FIELDS records at the flush, which are
        # published as they are (the reader makes the spans).
        self._calls: collections.deque[tuple] = collections.deque()
        # Log records (LOG_FIELDS) a TracingForwarder handed in; off the message path.
        self._logs: collections.deque[tuple] = collections.deque()
        # At each flush, on the flusher's thread: the appended records -> CALL_FIELDS records.
        self.call_filter: Callable[[list[tuple]], list[tuple]] | None = None
        # Given each flush's call records, as span_listeners are given its spans.
        self.call_listeners: list[Callable[[list[tuple]], None]] = []
        self._prefix = secrets.token_hex(8)  # trace ids: 32 hex digits, as OpenTelemetry's
        self._ids = itertools.count(1)
        self.collectors: list[Callable[[float], list[dict[str, Any]]]] = []
        # Given each flush's spans (tuples in SPAN_FIELDS order) before the collectors run:
        # per-endpoint counters are counted here, once per flush, not on each call.
        self.span_listeners: list[Callable[[list[tuple]], None]] = []
        self.published = 0  # records published so far

    def set_output(
        self, publish: Callable[[bytes, dict[str, str]], None], wake: Callable[[], None]
    ) -> None:
        """Where flushes go, and who is asked for one (:class:`~monarch.telemetry.flusher.Flusher`)."""
        self._publish = publish
        self._wake = wake

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

    def call(self, record: tuple) -> None:
        """Record one finished call (in :data:`CALL_FIELDS` order, or as ``call_filter``
        takes it). Any thread."""
        calls = self._calls
        calls.append(record)
        if len(calls) >= self._batch and not self._waking:
            self._waking = True
            self._wake()

    def log(self, record: tuple) -> None:
        """Record one log record (a tuple in :data:`LOG_FIELDS` order). Any thread."""
        logs = self._logs
        logs.append(record)
        if len(logs) >= self._batch and not self._waking:
            self._waking = True
            self._wake()

    def flush(self) -> int:
        """Publish what waits (spans, then the metric points of this interval); one thread at a time.

        A batch is one msgpack map: ``span_fields`` (:data:`SPAN_FIELDS`), ``spans``
        (one array per span, in that order), ``call_fields`` (:data:`CALL_FIELDS`),
        ``calls`` (one array per finished call) and ``metrics`` (one map per point).
        Records go :data:`CHUNK` to a message, and the GIL is let go between chunks.
        Returns how many records (spans, calls, points) were published.
        """
        self._waking = False
        items, calls = self._items, self._calls
        spans = [items.popleft() for _ in range(len(items))]
        raw = [calls.popleft() for _ in range(len(calls))]
        if raw and self.call_filter is not None:
            raw = self.call_filter(raw)
        for records, listeners, is_calls in ((spans, self.span_listeners, False),
                                             (raw, self.call_listeners, True)):  # fmt: skip
            for i in range(0, len(records), CHUNK):
                chunk = records[i : i + CHUNK]
                for listener in list(listeners):
                    try:
                        listener(chunk)
                    except Exception:
                        log.exception("a telemetry listener failed")
                self._publish_batch([], chunk, []) if is_calls else self._publish_batch(
                    chunk, [], []
                )
                time.sleep(0)  # a loop thread waiting for the GIL takes it now
        points: list[dict[str, Any]] = []
        now = time.time()
        for collect in list(self.collectors):
            try:
                points.extend(collect(now))
            except Exception:
                log.exception("a telemetry collector failed")
        for i in range(0, len(points), CHUNK):
            self._publish_batch([], [], points[i : i + CHUNK])
        logs = [self._logs.popleft() for _ in range(len(self._logs))]
        for i in range(0, len(logs), CHUNK):
            self._publish_batch([], [], [], logs[i : i + CHUNK])
        return len(spans) + len(raw) + len(points) + len(logs)

    def _publish_batch(
        self,
        spans: list[tuple],
        calls: list[tuple],
        points: list[dict[str, Any]],
        logs: list[tuple] | None = None,
    ) -> None:
        for point in points:
            point["proc"] = self.proc
        count = len(spans) + len(calls) + len(points) + len(logs or ())
        body = {"proc": self.proc, "span_fields": SPAN_FIELDS, "spans": spans,
                "call_fields": CALL_FIELDS, "calls": calls, "metrics": points}  # fmt: skip
        if logs:  # only batches of logs carry them: readers of older batches see none
            body["log_fields"], body["logs"] = LOG_FIELDS, logs
        headers = {hdr.KIND: "telemetry", hdr.FROM: self.proc, hdr.COUNT: str(count)}
        try:
            self._publish(msgpack.packb(body, default=str), headers)
            self.published += count
        except Exception as e:  # telemetry never fails the job
            log.warning("could not publish %d telemetry record(s): %r", count, e)


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


def span(name: str, *args: Any, **kwargs: Any) -> None:
    """:meth:`Recorder.span` on this process's recorder, if telemetry is (still) on."""
    rec = _recorder
    if rec is not None:
        rec.span(name, *args, **kwargs)


def new_trace() -> str | None:
    rec = _recorder
    return rec.new_trace() if rec is not None else None


# A forked child has our recorder, not our loop: it starts its own, if any.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=stop)
