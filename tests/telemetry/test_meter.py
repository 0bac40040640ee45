"""The meter, the recorder's batches and the SQL tables, in this process (no broker needed)."""

from __future__ import annotations

import pickle
import sqlite3

import cloudpickle
import pytest

from monarch.actor import get_meter
from monarch.telemetry import recorder, sql
from monarch.telemetry.meter import collect_all
from monarch.telemetry.stream import decode_batch


@pytest.fixture
def rec():
    published: list[bytes] = []
    r = recorder.Recorder("proc-1", lambda body, headers: published.append(body), lambda: None, 10)
    r.collectors.append(collect_all)
    r.published_bodies = published
    recorder.start(r)
    yield r
    recorder.stop()


def test_instruments_are_made_once_and_travel_by_name():
    meter = get_meter("tests.meter")
    assert get_meter("tests.meter") is meter
    counter = meter.create_counter("c1")
    assert meter.create_counter("c1") is counter
    assert pickle.loads(cloudpickle.dumps(counter)) is counter
    hist = meter.create_histogram("h1", explicit_bucket_boundaries_advisory=[1, 10])
    assert pickle.loads(cloudpickle.dumps(hist)).bounds == (1, 10)
    with pytest.raises(ValueError, match="only goes up"):
        counter.add(-1)
    with pytest.raises(NotImplementedError, match="create_gauge"):
        meter.create_gauge("g")


def test_off_records_nothing():
    assert not recorder.ON
    counter = get_meter("tests.meter").create_counter("off.count")
    counter.add(5)
    assert [p for p in collect_all(0.0) if p["name"] == "off.count"] == []


def test_a_flush_publishes_spans_and_points_that_load_into_sql(rec):
    meter = get_meter("tests.meter")
    meter.create_counter("on.count").add(2, {"op": "a"})
    meter.create_counter("on.count").add(3, {"op": "a"})
    meter.create_histogram("on.size").record(7.0)
    meter.create_up_down_counter("on.depth").add(-2)
    recorder.span("handle", "t1", 1.0, 1.5, "m.u[0]", "m", 0, "step", True, "client-1")
    assert rec.flush() > 3
    records = [r for body in rec.published_bodies for r in decode_batch(body)]
    db = sql.load(records)
    _, rows = sql.query(db, "SELECT span, actor_id, rank, endpoint, duration_ms, ok FROM spans")
    assert rows == [("handle", "m.u[0]", 0, "step", 500.0, 1)]
    _, rows = sql.query(
        db,
        "SELECT name, kind, labels, value, count, proc FROM metrics "
        "WHERE scope = 'tests.meter' ORDER BY name",
    )
    assert rows == [
        ("on.count", "counter", '{"op": "a"}', 5, None, "proc-1"),
        ("on.depth", "up_down_counter", "{}", -2, None, "proc-1"),
        ("on.size", "histogram", "{}", 7.0, 1, "proc-1"),
    ]
    assert rec.flush() == 0  # deltas: the next interval starts empty
    with pytest.raises(sqlite3.OperationalError, match="no such column"):
        sql.query(db, "SELECT nope FROM spans")


def test_the_runtimes_endpoint_counters_come_from_handle_spans(rec):
    from monarch.actors.hosting.telemetry import count_endpoints

    rec.span_listeners.append(count_endpoints)
    recorder.span("handle", None, 1.0, 1.002, "m.u[0]", "mm", 0, "step", True, None)
    recorder.span("handle", None, 1.0, 1.004, "m.u[1]", "mm", 1, "step", False, None)
    recorder.span("send", None, 1.0, 1.001, None, "mm", None, "step", True, None)
    rec.flush()
    records = [r for body in rec.published_bodies for r in decode_batch(body)]
    got = {
        r["name"]: r for r in records if r["type"] == "metric" and r["labels"].get("mesh") == "mm"
    }
    assert got["monarch.endpoint.calls"]["value"] == 2
    assert got["monarch.endpoint.errors"]["value"] == 1
    assert got["monarch.endpoint.duration"]["count"] == 2
    assert got["monarch.endpoint.duration"]["max"] == pytest.approx(4.0)


def test_a_body_that_is_not_a_batch_gives_no_records():
    assert decode_batch(b"not msgpack at all") == []
    assert decode_batch(b"") == []
