"""OTLP export: a job with telemetry on and an OTLP endpoint reaches a real OTLP/HTTP receiver.

The receiver is a small HTTP server on loopback that takes ``POST /v1/traces``
and ``POST /v1/metrics`` and decodes them with the OpenTelemetry protobufs,
as a collector would.
"""

from __future__ import annotations

import gzip
import http.server
import threading

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.telemetry.jobs import new_namespace, run_job


class Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list = []
        self.metrics: list = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            req = ExportTraceServiceRequest.FromString(body)
            with self.server.lock:
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        self.server.spans.extend(ss.spans)
            reply = ExportTraceServiceResponse().SerializeToString()
        elif self.path == "/v1/metrics":
            req = ExportMetricsServiceRequest.FromString(body)
            with self.server.lock:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        self.server.metrics.extend((sm.scope.name, m) for m in sm.metrics)
            reply = ExportMetricsServiceResponse().SerializeToString()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def test_spans_and_metrics_reach_an_otlp_receiver(nats_url, receiver):
    run_job(
        nats_url,
        new_namespace(),
        MONARCH_TELEMETRY="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
    )
    spans = list(receiver.spans)
    names = {s.name for s in spans}
    for name in ("send ping", "deliver ping", "handle ping", "reply ping", "handle tick"):
        assert name in names, sorted(names)
    handles = [s for s in spans if s.name == "handle ping"]
    assert len(handles) == 3
    for span in handles:
        attrs = _attrs(span)
        assert attrs["monarch.endpoint"] == "ping" and attrs["monarch.rank"] == 1
        assert attrs["monarch.actor_id"].startswith("telmesh.")
        assert attrs["monarch.actor_id"].endswith("[1]")
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
        # the call's spans share its trace id, across the client and the proc
        same_trace = {s.name for s in spans if s.trace_id == span.trace_id}
        assert same_trace == {"send ping", "deliver ping", "handle ping", "reply ping"}
    boom = next(s for s in spans if s.name == "handle boom")
    assert boom.status.code == 2  # STATUS_CODE_ERROR

    sums: dict[tuple[str, str], float] = {}
    for scope, metric in receiver.metrics:
        if metric.HasField("sum"):
            points = metric.sum.data_points
            total = sum(p.as_int if p.HasField("as_int") else p.as_double for p in points)
        elif metric.HasField("histogram"):
            total = sum(p.count for p in metric.histogram.data_points)
        else:
            continue
        sums[(scope, metric.name)] = total  # cumulative: the last export holds the total
    # ping, tick, ticks_seen, work, boom, and the merged sum's four ranks of `one`
    assert sums[("monarch", "monarch.endpoint.calls")] == 3 + 4 + 2 + 2 + 1 + 4
    assert sums[("monarch", "monarch.endpoint.errors")] == 1
    assert sums[("monarch", "monarch.endpoint.duration")] == 16  # values recorded
    assert sums[("tests.telemetry", "items.done")] == 4
    assert sums[("tests.telemetry", "item.size")] == 2
