"""Spans of real calls between real processes, read back with ``monarch query``.

The job (``tel_actors.main``) makes, on a mesh of two procs: three
``call_one`` of ``ping`` on rank 1, two ``broadcast`` of ``tick``, one
``call`` of ``ticks_seen`` and of ``work``, and one ``call_one`` of ``boom``
(which raises); then a sum of ``one`` over a ``per_proc`` mesh of 2 x 2 by an
``Accumulator`` given a reducer (replies merged on their procs).
"""

from __future__ import annotations

import pytest

from tests.telemetry.jobs import new_namespace, query, run_job

SPANS = "SELECT * FROM spans ORDER BY start"


@pytest.fixture(scope="module")
def job(nats_url):
    ns = new_namespace()
    run_job(nats_url, ns, MONARCH_TELEMETRY="1")
    return nats_url, ns


def _traces(rows: list[dict], endpoint: str) -> dict[str, dict[str, list[dict]]]:
    traces: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        if row["endpoint"] == endpoint:
            traces.setdefault(row["trace_id"], {}).setdefault(row["span"], []).append(row)
    return traces


def test_call_one_has_send_deliver_handle_reply_in_order(job):
    rows = query(*job, SPANS)
    traces = _traces(rows, "ping")
    assert len(traces) == 3
    for spans in traces.values():
        assert sorted(spans) == ["deliver", "handle", "reply", "send"]
        assert all(len(v) == 1 for v in spans.values())
        send, deliver, handle, reply = (spans[k][0] for k in ("send", "deliver", "handle", "reply"))
        for span in (send, deliver, handle, reply):
            assert span["duration_ms"] >= 0
            assert span["rank"] == 1
            assert span["actor_id"].startswith("telmesh.") and span["actor_id"].endswith("[1]")
            assert span["ok"] == 1
        # caller's spans on the client, the actor's on the proc of rank 1, joined by the trace
        assert send["proc"] == reply["proc"] and send["proc"].startswith("client-")
        assert deliver["proc"] == handle["proc"] != send["proc"]
        assert handle["caller"] == send["proc"]
        assert send["start"] <= deliver["start"] <= deliver["end"] <= handle["start"]
        assert handle["start"] <= handle["end"] <= reply["end"]
        assert send["start"] <= reply["start"]


def test_broadcast_has_one_send_and_a_deliver_and_handle_per_rank(job):
    rows = query(*job, SPANS)
    traces = _traces(rows, "tick")
    assert len(traces) == 2
    for spans in traces.values():
        assert sorted(spans) == ["deliver", "handle", "send"]  # fire-and-forget: no reply
        (send,) = spans["send"]
        assert send["rank"] is None and send["actor_id"] is None and send["mesh"] == "telmesh"
        assert sorted(h["rank"] for h in spans["handle"]) == [0, 1]
        assert sorted(d["rank"] for d in spans["deliver"]) == [0, 1]
        for handle in spans["handle"]:
            assert handle["actor_id"].endswith(f"[{handle['rank']}]")
            assert handle["duration_ms"] >= 0 and handle["start"] >= send["start"]


def test_call_to_all_has_a_reply_per_rank(job):
    traces = _traces(query(*job, SPANS), "work")
    (spans,) = traces.values()
    assert sorted(r["rank"] for r in spans["reply"]) == [0, 1]
    assert sorted(r["rank"] for r in spans["handle"]) == [0, 1]
    for reply in spans["reply"]:
        handle = next(h for h in spans["handle"] if h["rank"] == reply["rank"])
        assert handle["end"] <= reply["end"]


def test_an_endpoint_that_raises_has_a_failed_handle_span(job):
    (handle,) = query(*job, "SELECT * FROM spans WHERE endpoint = 'boom' AND span = 'handle'")
    assert handle["ok"] == 0
    (reply,) = query(*job, "SELECT * FROM spans WHERE endpoint = 'boom' AND span = 'reply'")
    assert reply["ok"] == 0


def test_user_spans_of_span_and_traced(job):
    rows = query(*job, "SELECT * FROM spans WHERE span IN ('work.inner', '_prepare') ORDER BY rank")
    assert sorted((r["span"], r["rank"]) for r in rows) == [
        ("_prepare", 0), ("_prepare", 1), ("work.inner", 0), ("work.inner", 1)
    ]  # fmt: skip
    for row in rows:
        assert row["actor_id"].endswith(f"[{row['rank']}]") and row["mesh"] == "telmesh"
        assert row["duration_ms"] >= 0 and row["ok"] == 1 and row["endpoint"] is None
    inner = {r["rank"]: r for r in rows if r["span"] == "work.inner"}
    for r in rows:
        if r["span"] == "_prepare":  # inside the with block
            assert inner[r["rank"]]["start"] <= r["start"] <= r["end"] <= inner[r["rank"]]["end"]


def test_count_of_spans_per_endpoint(job):
    rows = query(*job, "SELECT endpoint, count(*) AS n FROM spans GROUP BY endpoint")
    # a call_one: send, deliver, handle, reply; a broadcast to 2: send + 2 deliver + 2 handle;
    # a call to 2: send + 2 x (deliver, handle, reply); user spans have no endpoint
    assert {r["endpoint"]: r["n"] for r in rows} == {
        "ping": 3 * 4,
        "tick": 2 * 5,
        "ticks_seen": 7,
        "work": 7,
        "boom": 4,
        "one": 1 + 4 * 3,  # merged replies still have a reply span per rank
        None: 4,
    }


def test_a_sum_merged_on_the_procs_has_a_reply_span_for_each_rank(job):
    traces = _traces(query(*job, SPANS), "one")
    assert len(traces) == 1
    (spans,) = traces.values()
    assert sorted(r["rank"] for r in spans["reply"]) == [0, 1, 2, 3]
    assert all(r["ok"] == 1 and r["mesh"] == "telsum" for r in spans["reply"])
    assert sorted(r["rank"] for r in spans["handle"]) == [0, 1, 2, 3]


def test_endpoint_counters_and_duration_histogram(job):
    rows = query(
        *job,
        "SELECT name, json_extract(labels, '$.endpoint') AS endpoint, sum(value) AS total, "
        "sum(count) AS n FROM metrics WHERE scope = 'monarch' GROUP BY name, endpoint",
    )
    got = {(r["name"], r["endpoint"]): r for r in rows}
    calls = {ep: got[("monarch.endpoint.calls", ep)]["total"] for ep in ("ping", "tick", "boom")}
    assert calls == {"ping": 3, "tick": 4, "boom": 1}
    assert got[("monarch.endpoint.errors", "boom")]["total"] == 1
    assert ("monarch.endpoint.errors", "ping") not in got
    duration = got[("monarch.endpoint.duration", "ping")]
    assert duration["n"] == 3 and duration["total"] > 0


def test_user_meter_points_are_queryable(job):
    rows = query(
        *job,
        "SELECT name, kind, labels, sum(value) AS total, sum(count) AS n, min(min) AS lo, "
        "max(max) AS hi FROM metrics WHERE scope = 'tests.telemetry' GROUP BY name, labels",
    )
    got = {r["name"]: r for r in rows}
    assert got["items.done"]["kind"] == "counter"
    assert got["items.done"]["total"] == 4  # add(2) on each of two actors
    assert got["items.done"]["labels"] == '{"kind": "test"}'
    size = got["item.size"]
    assert size["kind"] == "histogram" and size["n"] == 2 and size["total"] == 400
    assert size["lo"] == size["hi"] == 200
    assert got["queue.depth"]["kind"] == "up_down_counter" and got["queue.depth"]["total"] == 4
