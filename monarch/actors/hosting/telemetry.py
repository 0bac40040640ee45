"""Turning telemetry on in a process: the recorder, its stream, its exporter, its hooks.

Called once per process when its runtime has connected (the client and every
proc). With ``MONARCH_TELEMETRY`` unset this does nothing at all, and the
hooks on the message path stay a check of one boolean
(:data:`monarch.telemetry.recorder.ON`). On, it makes the process's
:class:`~monarch.telemetry.recorder.Recorder` and its
:class:`~monarch.telemetry.flusher.Flusher` (a thread with a broker
connection of its own, which packs and publishes every
``MONARCH_TELEMETRY_INTERVAL`` and at close, never on the event loop), and
hangs the recorder on the finished-call records of the actors of this
process: each is published as it is (readers make its deliver and handle
spans), and the per-endpoint metrics are counted from them at each flush. The client also creates
the bounded stream and, with an OTLP endpoint configured, exports the job's
telemetry (:mod:`monarch.telemetry.otlp`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import Any

from monarch.actors.calls.activity import FLOW_MARKER, call_listeners, call_record
from monarch.actors.calls.context import actor_context
from monarch.broker.connections.connect import connect
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime
from monarch.telemetry import recorder as tel
from monarch.telemetry.flusher import Flusher
from monarch.telemetry.log_events import set_actor_id_source
from monarch.telemetry.meter import collect_all, get_meter, key_of
from monarch.telemetry.otlp import OtlpExporter, otlp_endpoint
from monarch.telemetry.stream import decode_batch, ensure_stream

log = logging.getLogger(__name__)

_meter = get_meter("monarch")
_calls = _meter.create_counter("monarch.endpoint.calls", description="calls handled")
_errors = _meter.create_counter("monarch.endpoint.errors", description="calls that raised")
_duration = _meter.create_histogram(
    "monarch.endpoint.duration", unit="ms", description="time in the endpoint"
)

_keys: dict[tuple[str, str], tuple] = {}  # (mesh, endpoint) -> the counters' attribute key


def without_flow_markers(records: list[tuple]) -> list[tuple]:
    """Finished calls to publish: not the runtime's own flow markers."""
    return [r for r in records if r[4] != FLOW_MARKER]


def recorded_calls(raw: list[tuple]) -> list[tuple]:
    """The recorder's filter: the actors' raw records (``activity.RAW_CALL_FIELDS``, what
    their threads appended) as records in ``CALL_FIELDS`` order, flow markers left out;
    on the flusher's thread, once per flush."""
    return [call_record(r) for r in without_flow_markers(raw)]


def count_calls(records: list[tuple]) -> None:
    """The per-endpoint calls, errors and durations of a flush's finished calls."""
    _count([(r[1], r[4], r[7], r[8], r[9]) for r in records])


def count_endpoints(spans: list[tuple]) -> None:
    """The per-endpoint calls, errors and durations of a flush's handle spans."""
    _count([(s[4], s[6], s[7], s[8], s[9]) for s in spans if s[0] == "handle"])


def _count(calls: list[tuple]) -> None:
    per: dict[tuple[str, str], list] = {}
    for mesh, endpoint, start, end, ok in calls:
        acc = per.get((mesh, endpoint))
        if acc is None:
            acc = per[(mesh, endpoint)] = [0, []]
        if not ok:
            acc[0] += 1
        acc[1].append((end - start) * 1000.0)
    for (mesh, endpoint), (errors, durations) in per.items():
        key = _keys.get((mesh, endpoint))
        if key is None:
            key = _keys[(mesh, endpoint)] = key_of({"mesh": mesh, "endpoint": endpoint})
        _calls.add_keyed(len(durations), key)
        if errors:
            _errors.add_keyed(errors, key)
        _duration.record_many(durations, key)


async def start_telemetry(rt: Runtime, *, client: bool) -> None:
    """Record and publish this process's telemetry, if ``MONARCH_TELEMETRY`` is on."""
    cfg = rt.settings
    if not cfg.telemetry:
        return
    endpoint = otlp_endpoint(cfg.otlp_endpoint) if client else None
    subject = subjects.telemetry(rt.namespace, rt.proc_uid)
    keep_values = otlp_endpoint(cfg.otlp_endpoint) is not None  # every process: the client exports
    rec = tel.Recorder(rt.proc_uid, _unset, _unset, cfg.telemetry_batch, keep_values)
    rec.call_filter = recorded_calls
    rec.call_listeners.append(count_calls)
    rec.span_listeners.append(count_endpoints)
    rec.collectors.append(collect_all)
    # Off the loop, on a connection of its own: the replies on the main one never queue
    # behind a flush (monarch.telemetry.flusher).
    own_connection = functools.partial(
        connect, rt.nats_url, cfg, name=f"monarch-{rt.proc_uid}-telemetry"
    )
    flusher = Flusher(rec, subject, cfg.telemetry_interval, own_connection)
    _flusher[:] = [flusher]
    if client:
        assert rt.nc is not None
        await ensure_stream(rt.nc, rt.namespace, cfg.telemetry_max_bytes, cfg.telemetry_max_age)
    exporter = await _start_export(rt, endpoint, cfg.telemetry_interval) if endpoint else None
    flusher.start()
    tel.start(rec)
    _listen_to_calls(rec)

    async def close() -> None:
        # The last flush (everything recorded until now; still on, so histograms keep
        # their values for the exporter), confirmed by the broker before the main
        # connection closes and the process reports its end.
        try:
            await asyncio.get_running_loop().run_in_executor(None, flusher.stop)
        except RuntimeError:  # closed at interpreter exit: no executor any more
            flusher.stop()
        tel.stop()
        _paused.clear()
        _flusher.clear()
        _stop_listening()
        if exporter is not None:
            await exporter()

    rt.on_close(close)


def _running_actor_id() -> str | None:
    """The id of the actor whose code runs now (a TracingForwarder's ``actor_id``)."""
    ctx = actor_context()
    return str(ctx.actor_instance.actor_id) if ctx is not None else None


set_actor_id_source(_running_actor_id)


def _unset(*_: Any) -> None:  # the recorder's output until the flusher sets its own
    pass


def set_recording(on: bool) -> bool:
    """Pause (False) or resume (True) this process's recording, where telemetry was started.

    Paused, the hooks are as with telemetry off (the boolean is False and no one
    listens to finished calls); what was recorded is still published. Returns
    whether telemetry runs here at all. ``benchmarks/bench_telemetry.py`` uses it to
    compare both ways on the same procs, round after round.
    """
    rec = tel.current_recorder() or _paused.get("rec")
    if rec is None:
        return False
    if on:
        tel.start(rec)
        _listen_to_calls(rec)
    else:
        _paused["rec"] = rec
        tel.ON = False
        _stop_listening()
    return True


_paused: dict[str, tel.Recorder] = {}
_flusher: list[Flusher] = []  # this process's, while telemetry runs


def flusher_cpu() -> float:
    """CPU seconds this process's telemetry thread has used (0.0 without one): benchmarks."""
    return _flusher[0].cpu_s if _flusher else 0.0


_listening: list[Any] = []  # the recorder's call() hung on call_listeners, while it is


def _listen_to_calls(rec: tel.Recorder) -> None:
    """Hang the recorder's :meth:`~monarch.telemetry.recorder.Recorder.call` on the actors'
    finished-call records (one bound method: the actor's thread pays one call and an append
    of the raw tuple it made; :func:`recorded_calls` converts them at the flush)."""
    if not _listening:
        _listening.append(rec.call)
        call_listeners.append(_listening[0])


def _stop_listening() -> None:
    while _listening:
        listener = _listening.pop()
        if listener in call_listeners:
            call_listeners.remove(listener)


def _forget_after_fork() -> None:
    """A forked child has our listener, not our flusher: nothing may pile up for it."""
    _paused.clear()
    _stop_listening()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


async def _start_export(rt: Runtime, endpoint: str, interval: float) -> Any:
    """Export every process's batches (heard on ``mon.<ns>.tel.>``); returns the closer."""
    try:
        exporter = OtlpExporter(endpoint, interval)
    except RuntimeError as e:
        log.warning("%s; telemetry is not exported", e)
        return None
    assert rt.nc is not None

    async def on_batch(msg: Any) -> None:
        exporter.take(decode_batch(msg.data))

    sub = await rt.nc.subscribe(subjects.telemetry_wildcard(rt.namespace), cb=on_batch)

    async def close() -> None:
        # Procs have stopped by now (their closers run first) and sent their last
        # batches: a round trip to the broker, then the subscription's backlog.
        try:
            await rt.nc.flush(timeout=2)
            deadline = time.monotonic() + 2
            while sub.pending_msgs and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            await sub.unsubscribe()
        except Exception as e:
            log.debug("telemetry export subscription did not close cleanly: %r", e)
        await asyncio.get_running_loop().run_in_executor(None, exporter.close)

    return close
