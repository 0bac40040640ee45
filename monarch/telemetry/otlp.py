"""Export a job's telemetry to OpenTelemetry (OTLP/HTTP), from the client.

When an OTLP endpoint is configured (``MONARCH_OTLP_ENDPOINT``, or the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT``) and telemetry is on, the client
listens to every process's batches (``mon.<ns>.tel.>``) and hands them to the
official OpenTelemetry SDK: spans through a ``BatchSpanProcessor`` and the
OTLP/HTTP span exporter, metric points into a ``MeterProvider`` whose periodic
reader exports them. One exporter per job, in the client: procs need neither
the SDK nor a route to the collector. The SDK is the ``otel`` extra
(``pip install monarch-nats[otel]``).

Spans keep their trace: a call's ``Mon-Trace`` id (32 hex digits) is the
OpenTelemetry trace id of its send, deliver, handle and reply spans, so a
tracing UI shows one call across its processes. Metric points are deltas;
counters are replayed with ``add``, histograms with the raw values their
points carry (up to 2,048 per point and interval).

The SDK's work happens on a thread of its own, never on the runtime's loop.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


def otlp_endpoint(configured: str | None) -> str | None:
    """The endpoint to export to: ``configured`` (MONARCH_OTLP_ENDPOINT) or the standard one."""
    return configured or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


class OtlpExporter:
    """Turns telemetry records into OpenTelemetry spans and metric points, off the loop."""

    def __init__(self, endpoint: str, interval: float = 1.0, service: str = "monarch") -> None:
        try:  # the optional extra: imported only when an endpoint is configured
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as e:
            raise RuntimeError(
                f"an OTLP endpoint is configured ({endpoint}) but the OpenTelemetry SDK is not "
                "installed: pip install 'monarch-nats[otel]'"
            ) from e
        from opentelemetry import trace

        self._trace = trace
        base = endpoint.rstrip("/")
        resource = Resource.create({"service.name": service})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=5))
        )
        self.tracer = self.tracer_provider.get_tracer("monarch")
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=5),
            export_interval_millis=max(100.0, interval * 1000.0),
        )
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        self._instruments: dict[tuple[str, str, str], Any] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="monarch-otlp-export", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------

    def take(self, records: list[dict[str, Any]]) -> None:
        """Queue records (one decoded batch) for export."""
        self._queue.put(records)

    def close(self, timeout: float = 10.0) -> None:
        """Export what is queued, flush both providers and stop (bounded by ``timeout``)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        for provider in (self.tracer_provider, self.meter_provider):
            try:
                provider.force_flush(int(timeout * 1000))
                provider.shutdown()
            except Exception as e:
                log.warning("OpenTelemetry export did not finish: %r", e)

    # -- the export thread -----------------------------------------------------

    def _run(self) -> None:
        while True:
            records = self._queue.get()
            if records is _STOP:
                return
            for rec in records:
                try:
                    if rec.get("type") == "span":
                        self._span(rec)
                    elif rec.get("type") == "metric":
                        self._metric(rec)
                    elif rec.get("type") == "log":
                        self._log(rec)
                except Exception:
                    log.exception("could not export a telemetry record to OTLP")

    def _span(self, rec: dict[str, Any]) -> None:
        trace = self._trace
        tid = rec.get("trace_id")
        ctx = None
        if tid:
            # The call as the (remote, unrecorded) parent: every span of it shares its trace id.
            parent = trace.SpanContext(
                trace_id=int(tid, 16),
                span_id=int(tid[-16:], 16) or 1,
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
            ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        attributes = {
            f"monarch.{k}": rec[k]
            for k in ("proc", "actor_id", "mesh", "rank", "endpoint", "caller")
            if rec.get(k) is not None
        }
        name = f"{rec.get('span')} {rec.get('endpoint') or ''}".strip()
        span = self.tracer.start_span(
            name, context=ctx, start_time=int(rec["start"] * 1e9), attributes=attributes
        )
        if rec.get("ok") is False:
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end(end_time=int(rec["end"] * 1e9))

    def _log(self, rec: dict[str, Any]) -> None:
        """A log record: a zero-length span named ``log <logger>`` holding one span event
        (the message, at the record's time, with level, logger and source as attributes)."""
        when = int(rec["time"] * 1e9)
        attributes = {
            f"monarch.{k}": rec[k] for k in ("proc", "actor_id") if rec.get(k) is not None
        }
        span = self.tracer.start_span(
            f"log {rec.get('logger') or ''}".strip(), start_time=when, attributes=attributes
        )
        event = {
            "log.severity": rec.get("level") or "",
            "log.logger": rec.get("logger") or "",
            "code.filepath": rec.get("pathname") or "",
            "code.lineno": int(rec.get("lineno") or 0),
        }
        span.add_event(str(rec.get("message")), attributes=event, timestamp=when)
        span.end(end_time=when)

    def _metric(self, rec: dict[str, Any]) -> None:
        kind, name, scope = rec.get("kind"), rec.get("name"), rec.get("scope") or "monarch"
        key = (scope, name, kind)
        inst = self._instruments.get(key)
        if inst is None:
            meter = self.meter_provider.get_meter(scope)
            unit = rec.get("unit") or ""
            if kind == "counter":
                inst = meter.create_counter(name, unit=unit)
            elif kind == "up_down_counter":
                inst = meter.create_up_down_counter(name, unit=unit)
            elif kind == "histogram":
                inst = meter.create_histogram(name, unit=unit)
            else:
                return
            self._instruments[key] = inst
        labels = dict(rec.get("labels") or {})
        labels["monarch.proc"] = rec.get("proc") or ""
        if kind == "histogram":
            for value in rec.get("values") or ():
                inst.record(value, labels)
        else:
            inst.add(rec.get("value") or 0, labels)
