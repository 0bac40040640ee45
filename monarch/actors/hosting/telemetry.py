"""Turning telemetry on in a process: the recorder, its stream, its exporter, its hooks.

Called once per process when its runtime has connected (the client and every
proc). With ``MONARCH_TELEMETRY`` unset this does nothing at all, and the
hooks on the message path stay a check of one boolean
(:data:`monarch.telemetry.recorder.ON`). On, it makes the process's
:class:`~monarch.telemetry.recorder.Recorder` (publishing through the
runtime), flushes it every ``MONARCH_TELEMETRY_INTERVAL`` and at close, and
hangs the deliver and handle spans and the per-endpoint metrics on the
finished-call records of the actors of this process. The client also creates
the bounded stream and, with an OTLP endpoint configured, exports the job's
telemetry (:mod:`monarch.telemetry.otlp`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from monarch.actors.calls.activity import FLOW_MARKER, CallRecord, call_listeners
from monarch.broker import subjects
from monarch.core.runtime import Runtime
from monarch.telemetry import recorder as tel
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


def on_finished_call(record: CallRecord) -> None:
    """A finished call of an actor of this process: its deliver and handle spans, and
    through them the endpoint's counters (a listener of :data:`~monarch.actors.calls.activity.call_listeners`)."""
    if not tel.ON or record.endpoint == FLOW_MARKER:  # not the runtime's own flow markers
        return
    trace = record.trace or None
    actor_id, mesh, rank, endpoint = record.actor_id, record.mesh, record.rank, record.endpoint
    caller = record.caller or None
    if record.t_delivered:  # 0.0: not known
        # t_delivered is time.time(), t_started the book's monotonic clock made wall time:
        # the two may disagree by a few microseconds, never a negative wait.
        delivered = min(record.t_delivered, record.t_started)
        tel.span("deliver", trace, delivered, record.t_started, actor_id, mesh, rank,
                 endpoint, True, caller)  # fmt: skip
    tel.span("handle", trace, record.t_started, record.t_ended, actor_id, mesh, rank, endpoint,
             record.ok, caller)  # fmt: skip
    # (the endpoint's counters are counted from the handle spans, at each flush)


def count_endpoints(spans: list[tuple]) -> None:
    """The per-endpoint calls, errors and durations of a flush's handle spans."""
    per: dict[tuple[str, str], list] = {}
    for span in spans:
        if span[0] != "handle":
            continue
        mesh, endpoint, start, end, ok = span[4], span[6], span[7], span[8], span[9]
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

    def publish(payload: bytes, headers: dict[str, str]) -> None:
        rt.publish(subject, payload, headers)

    def wake() -> None:  # from any thread; the flush itself runs on the loop
        rt.loop.call_soon_threadsafe(rec.flush)

    keep_values = otlp_endpoint(cfg.otlp_endpoint) is not None
    rec = tel.Recorder(rt.proc_uid, publish, wake, cfg.telemetry_batch, keep_values)
    rec.span_listeners.append(count_endpoints)
    rec.collectors.append(collect_all)
    if client:
        assert rt.nc is not None
        await ensure_stream(rt.nc, rt.namespace, cfg.telemetry_max_bytes, cfg.telemetry_max_age)
    exporter = await _start_export(rt, endpoint, cfg.telemetry_interval) if endpoint else None
    tel.start(rec)
    _listen_to_calls()
    rt.every(cfg.telemetry_interval, rec.flush, "publishing telemetry")

    async def close() -> None:
        rec.flush()
        tel.stop()
        _paused.clear()
        if on_finished_call in call_listeners:
            call_listeners.remove(on_finished_call)
        if exporter is not None:
            await exporter()

    rt.on_close(close)


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
        _listen_to_calls()
    else:
        _paused["rec"] = rec
        tel.ON = False
        if on_finished_call in call_listeners:
            call_listeners.remove(on_finished_call)
    return True


_paused: dict[str, tel.Recorder] = {}


def _listen_to_calls() -> None:
    """Hang :func:`on_finished_call` on the actors' finished-call records, once."""
    if on_finished_call not in call_listeners:
        call_listeners.append(on_finished_call)


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
