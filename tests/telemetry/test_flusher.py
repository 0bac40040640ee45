"""The flusher: a process's telemetry packed and published from a thread of its own,
on a broker connection of its own, and nothing lost when the process ends."""

from __future__ import annotations

import asyncio
import threading

import nats

from monarch.actors.calls.activity import CallRecord
from monarch.actors.hosting.telemetry import count_calls, without_flow_markers
from monarch.telemetry import recorder
from monarch.telemetry.flusher import Flusher
from monarch.telemetry.meter import collect_all
from monarch.telemetry.stream import decode_batch
from tests.telemetry.jobs import new_namespace, query, run_job


def test_spans_leave_from_the_flushers_thread_in_chunks_and_the_rest_at_stop(nats_url):
    subject = f"mon.{new_namespace()}.tel.proc-x"
    flush_threads: list[str] = []
    rec = recorder.Recorder("proc-x", lambda *_: None, lambda: None, batch=600)
    rec.call_filter = without_flow_markers
    rec.call_listeners.append(count_calls)
    rec.call_listeners.append(lambda calls: flush_threads.append(threading.current_thread().name))
    rec.collectors.append(collect_all)
    rec.span_listeners.append(lambda spans: flush_threads.append(threading.current_thread().name))
    names: list[str] = []

    async def connect():
        names.append(threading.current_thread().name)
        return await nats.connect(nats_url, name="flusher-under-test")

    flusher = Flusher(rec, subject, interval=3600.0, connect=connect, name="tel-test")
    got: list[tuple[dict, list[dict]]] = []

    async def scenario() -> None:
        nc = await nats.connect(nats_url)
        try:

            async def on_batch(msg) -> None:
                got.append((msg.headers, decode_batch(msg.data)))

            await nc.subscribe(subject, cb=on_batch)
            await nc.flush()
            flusher.start()
            record = CallRecord(
                "m.u[1]", "m", "u", 1, "step", "client-1", 1.0, 1.5, 2.0, True, "t1"
            )
            flow = CallRecord("m.u[1]", "m", "u", 1, "_flow_marker", "", 1.0, 1.0, 1.0, True, "")
            # 700 finished calls from another thread: past the batch of 600, so the
            # flusher is woken long before its hour-long interval.
            worker = threading.Thread(target=lambda: [rec.call(record) for _ in range(700)])
            worker.start()
            worker.join()

            def spans_so_far() -> int:
                return sum(r["type"] == "span" for _, records in got for r in records)

            for _ in range(200):
                if spans_so_far() >= 1400:
                    break
                await asyncio.sleep(0.05)
            early = spans_so_far()
            rec.call(flow)  # the runtime's own marker: no span
            rec.span("send", "t2", 3.0, 4.0, None, "m", None, "step", True)
            await asyncio.get_running_loop().run_in_executor(None, flusher.stop)
            await nc.flush()
            await asyncio.sleep(0.2)
            assert early == 1400  # deliver and handle of each call, before the stop
        finally:
            await nc.close()

    recorder.start(rec)  # on: the endpoint counters count
    try:
        asyncio.run(scenario())
    finally:
        recorder.stop()
    spans = [r for _, records in got for r in records if r["type"] == "span"]
    assert len(spans) == 1401  # and the last send, published by stop()
    assert {s["span"] for s in spans} == {"deliver", "handle", "send"}
    handle = next(s for s in spans if s["span"] == "handle")
    assert (handle["proc"], handle["trace_id"], handle["caller"], handle["rank"]) == (
        "proc-x", "t1", "client-1", 1)  # fmt: skip
    assert handle["end"] - handle["start"] == 0.5
    assert max(int(headers["Mon-Count"]) for headers, _ in got) <= recorder.CHUNK
    assert set(flush_threads) == {"tel-test"}  # never the caller's thread
    assert names == ["tel-test"]  # its own connection, made once, on its thread
    assert not flusher._thread.is_alive()
    metrics = [r for _, records in got for r in records if r["type"] == "metric"]
    calls = [m for m in metrics if m["name"] == "monarch.endpoint.calls"]
    assert sum(m["value"] for m in calls if m["labels"].get("mesh") == "m") == 700


def test_a_call_record_is_published_in_the_fields_the_readers_expect():
    # The actor layer's CallRecord goes out as it is: its fields, in CALL_FIELDS' order.
    assert [f.removeprefix("t_") for f in CallRecord._fields] == list(recorder.CALL_FIELDS)


def test_a_job_that_ends_before_any_interval_still_publishes_everything(nats_url):
    # An hour between flushes and no early batches: only the last flush, at each
    # process's close, can have published these spans.
    ns = new_namespace()
    run_job(
        nats_url,
        ns,
        MONARCH_TELEMETRY="1",
        MONARCH_TELEMETRY_INTERVAL="3600",
        MONARCH_TELEMETRY_BATCH="1000000",
    )
    rows = query(nats_url, ns, "SELECT span, proc, trace_id FROM spans WHERE endpoint = 'ping'")
    by_trace: dict[str, list[str]] = {}
    for row in rows:
        by_trace.setdefault(row["trace_id"], []).append(row["span"])
    assert len(by_trace) == 3
    assert all(sorted(s) == ["deliver", "handle", "reply", "send"] for s in by_trace.values())
    assert len({r["proc"] for r in rows}) == 2  # the client's and the proc of rank 1
