"""TracingForwarder: log records become the ``logs`` table of ``monarch query``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import msgpack

from monarch.telemetry import recorder as tel
from monarch.telemetry.log_events import TracingForwarder
from monarch.telemetry.sql import load, query
from monarch.telemetry.stream import decode_batch
from tests.telemetry.jobs import ROOT, _env, new_namespace
from tests.telemetry.jobs import query as monarch_query


def _run(nats_url: str, ns: str, tag: str, **env: str) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests.telemetry.log_actors import main; sys.exit(main())",
            tag,
        ],
        cwd=ROOT,
        env=_env(nats_url, ns, **env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"job failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])["actor_ids"]


def test_actor_logs_are_queryable_with_their_actor_id(nats_url):
    ns = new_namespace()
    ids = _run(nats_url, ns, "hello-logs", MONARCH_TELEMETRY="1")
    rows = monarch_query(
        nats_url,
        ns,
        "SELECT actor_id, level, logger, message, lineno, proc, time FROM logs "
        "WHERE message LIKE 'hello-logs%' ORDER BY message",
    )
    assert [r["message"] for r in rows] == [
        "hello-logs from rank 0",
        "hello-logs from rank 1",
        "hello-logs from the client",
    ]
    assert sorted(r["actor_id"] for r in rows[:2]) == ids
    assert rows[2]["actor_id"] is None  # the client's own code
    assert [r["level"] for r in rows] == ["WARNING", "WARNING", "INFO"]
    assert {r["logger"] for r in rows} == {"tests.telemetry.forwarded"}
    assert all(r["lineno"] > 0 and r["proc"] and r["time"] > 0 for r in rows)
    assert len({r["proc"] for r in rows}) == 3  # two procs and the client


def test_logs_table_is_empty_when_telemetry_was_off_in_the_job(nats_url):
    ns = new_namespace()
    _run(nats_url, ns, "quiet")
    done = subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", "query", "SELECT count(*) FROM logs"],
        cwd=ROOT,
        env=_env(nats_url, ns),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0  # no telemetry stream: a clear error, not rows
    assert "Traceback" not in done.stderr


def test_off_the_handler_does_nothing_and_never_raises():
    assert tel.current_recorder() is None
    log = logging.getLogger("tests.telemetry.offline")
    handler = TracingForwarder()
    log.addHandler(handler)
    log.propagate = False  # ours alone: pytest's own handler would format the bad record
    try:
        log.error("not recorded %s", "anywhere")
        log.error("a bad format %d", "x")  # getMessage fails only when recording
    finally:
        log.removeHandler(handler)


def test_a_recorded_log_round_trips_through_a_batch_and_sql():
    sent: list[bytes] = []
    rec = tel.Recorder("proc-x", lambda body, headers: sent.append(body), lambda: None, 100)
    tel.start(rec)
    log = logging.getLogger("tests.telemetry.roundtrip")
    log.addHandler(TracingForwarder())
    log.propagate = False
    try:
        log.warning("round %s", "trip")
        log.warning("broken %d", "x")  # reported by logging's handleError, not raised
        rec.flush()
    finally:
        tel.stop()
        log.handlers.clear()
    records = [r for body in sent for r in decode_batch(body)]
    logs = [r for r in records if r["type"] == "log"]
    assert [(r["message"], r["proc"], r["actor_id"]) for r in logs] == [
        ("round trip", "proc-x", None)
    ]
    _, rows = query(load(records), "SELECT level, logger, message FROM logs")
    assert rows == [("WARNING", "tests.telemetry.roundtrip", "round trip")]


def test_a_batch_without_logs_still_decodes():
    body = {"proc": "p", "span_fields": list(tel.SPAN_FIELDS), "spans": [],
            "call_fields": list(tel.CALL_FIELDS), "calls": [],
            "metrics": [{"name": "m", "value": 1.0}]}  # fmt: skip
    records = decode_batch(msgpack.packb(body))
    assert [r["type"] for r in records] == ["metric"]
    _, rows = query(load(records), "SELECT count(*) FROM logs")
    assert rows == [(0,)]


def test_log_records_reach_an_otlp_receiver_as_span_events(nats_url):
    import threading

    from tests.telemetry.test_otlp import Receiver

    receiver = Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        ids = _run(
            nats_url,
            new_namespace(),
            "otlp-logs",
            MONARCH_TELEMETRY="1",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        )
    finally:
        receiver.shutdown()
        receiver.server_close()
        thread.join(10)
    logs = [s for s in receiver.spans if s.name == "log tests.telemetry.forwarded"]
    messages = sorted(e.name for s in logs for e in s.events)
    assert messages == [
        "otlp-logs from rank 0",
        "otlp-logs from rank 1",
        "otlp-logs from the client",
    ]
    actors = sorted(
        kv.value.string_value for s in logs for kv in s.attributes if kv.key == "monarch.actor_id"
    )
    assert actors == ids
    for span in logs:
        assert span.start_time_unix_nano == span.end_time_unix_nano > 0
        (event,) = span.events
        keys = {kv.key for kv in event.attributes}
        assert {"log.severity", "log.logger", "code.filepath", "code.lineno"} <= keys
