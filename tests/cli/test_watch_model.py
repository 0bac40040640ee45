"""The watch model: rates, latencies, CPU, states, silence, the end of a job, bounded history.

Fed with documents of the shape procs answer on ``mon.<ns>.ctl.stats`` and
``mon.<ns>.ctl.ps``; the end-to-end tests (test_top, test_dashboard) feed it
from a real job.
"""

from __future__ import annotations

from monarch.actors.calls.activity import BUCKETS, bucket_of
from monarch.cli.watch.model import Poll, WatchModel, aggregate


def hist_of(*durations: tuple[float, int]) -> list[int]:
    h = [0] * BUCKETS
    for seconds, n in durations:
        h[bucket_of(seconds)] += n
    return h


def actor(
    rank: int,
    state: str = "serving",
    calls: int = 0,
    hist=None,
    mesh: str = "workers",
    in_flight=(),
    failure=None,
    errors: int = 0,
) -> dict:
    return {
        "actor_id": f"{mesh}-m1[{rank}]",
        "mesh": mesh,
        "mesh_uid": f"{mesh}-uid",
        "rank": rank,
        "class": "Worker",
        "sizes": {"gpus": 2},
        "state": state,
        "failure": failure,
        "endpoints": {
            "ping": {
                "calls": calls,
                "errors": errors,
                "in_flight": len(in_flight),
                "hist": hist or [0] * BUCKETS,
            }
        },
        "in_flight": list(in_flight),
    }


def stats(
    uid: str, t: float, actors: list, cpu: float = 0.0, stall: float = 0.0, failures=()
) -> dict:
    return {
        "uid": uid,
        "pid": 100,
        "hostname": "box",
        "host_uid": None,
        "rank": 0,
        "root": "client",
        "time": t,
        "cpu_seconds": cpu,
        "rss_bytes": 200 * 2**20,
        "threads": 7,
        "loop_stall": stall,
        "stall_threshold": 1.0,
        "actors": actors,
        "recent_failures": list(failures),
    }


def poll(t: float, *docs: dict, connected: bool = True, registered=None) -> Poll:
    reg = registered if registered is not None else [{"uid": d["uid"]} for d in docs]
    return Poll(time=t, connected=connected, registered=reg, stats={d["uid"]: d for d in docs})


def test_rates_latencies_and_cpu_come_from_the_difference_of_two_answers():
    m = WatchModel("ns")
    m.ingest(
        poll(10.0, stats("p0", 1000.0, [actor(0, calls=100, hist=hist_of((0.001, 100)))], cpu=1.0))
    )
    first = m.view()
    assert first["endpoints"][0]["rate"] is None  # one answer: no rate yet
    later = hist_of((0.001, 100), (0.001, 150), (0.1, 50))
    m.ingest(poll(11.0, stats("p0", 1002.0, [actor(0, calls=300, hist=later)], cpu=2.0)))
    view = m.view()
    (ep,) = view["endpoints"]
    assert ep["mesh"] == "workers" and ep["endpoint"] == "ping"
    assert ep["rate"] == 100.0  # 200 calls in the proc's 2 seconds
    assert 0.0005 <= ep["p50"] <= 0.0011  # 150 of the interval's 200 calls took ~1 ms
    assert 0.05 <= ep["p99"] <= 0.14  # the slowest quarter took ~100 ms
    assert ep["p50_all"] <= 0.0011 and ep["calls"] == 300
    (host,) = view["hosts"]
    assert host["kind"] == "machine" and host["name"] == "box"
    assert host["procs"][0]["cpu_pct"] == 50.0
    assert view["status"] == "live" and view["totals"]["rate"] == 100.0


def test_endpoints_of_several_actors_add_up_per_mesh():
    m = WatchModel("ns")
    m.ingest(
        poll(1.0, stats("p0", 1.0, [actor(0, calls=0)]), stats("p1", 1.0, [actor(1, calls=0)]))
    )
    m.ingest(
        poll(
            2.0,
            stats("p0", 2.0, [actor(0, calls=10, hist=hist_of((0.01, 10)))]),
            stats("p1", 2.0, [actor(1, calls=30, hist=hist_of((0.01, 30)))]),
        )
    )
    (ep,) = m.view()["endpoints"]
    assert ep["rate"] == 40.0 and ep["actors"] == 2 and ep["calls"] == 40
    only_rank1 = [r for r in m.view()["actor_endpoints"] if r["rank"] == 1]
    assert aggregate(only_rank1)[0]["rate"] == 30.0


def test_states_failures_and_stalls_are_reported():
    call = {"endpoint": "sleep", "seconds": 42.0, "caller": "client", "stalled": True}
    doc = stats(
        "p0",
        5.0,
        [
            actor(0, state="stalled", mesh="sleepy", in_flight=[call]),
            actor(1, state="failed", mesh="doomed", failure="RuntimeError: boom"),
        ],
        stall=3.0,
        failures=[{"actor_id": "doomed-m1[1]", "reason": "RuntimeError: boom", "time": 4.0}],
    )
    doc["stalls"] = [
        {"actor_id": "sleepy-m1[0]", "endpoint": "sleep", "time": 2.0, "finished_after": None},
        {"actor_id": "sleepy-m1[1]", "endpoint": "sleep", "time": 1.0, "finished_after": 2.5},
    ]
    m = WatchModel("ns")
    m.ingest(poll(5.0, doc))
    view = m.view()
    states = {
        a["mesh"]: a["state"] for m_ in view["hosts"][0]["procs"][0]["meshes"] for a in m_["actors"]
    }
    assert states == {"sleepy": "stalled", "doomed": "failed"}
    assert [f["reason"] for f in view["failures"]] == ["RuntimeError: boom"]
    whats = {(s["what"], s["endpoint"]) for s in view["stalls"]}
    assert whats == {("call", "sleep"), ("loop", None)}
    assert view["hosts"][0]["procs"][0]["state"] == "stalled"  # its loop: 3 s > 1 s
    assert view["totals"]["failed"] == 1 and view["totals"]["stalled"] == 1
    (past,) = view["past_stalls"]  # the one still running is a live stall, not a past one
    assert (past["actor_id"], past["finished_after"]) == ("sleepy-m1[1]", 2.5)


def test_a_proc_that_stops_answering_is_silent_and_then_the_job_ended():
    m = WatchModel("ns", ended_after=3.0)
    assert m.view()["status"] == "waiting"
    a = stats("a", 1.0, [actor(0, mesh="left")])
    b = stats("b", 1.0, [actor(1, mesh="right", state="failed", failure="x")])
    m.ingest(poll(1.0, a, b))
    m.ingest(poll(2.0, a, registered=[{"uid": "a"}, {"uid": "b"}]))
    view = m.view()
    procs = {p["uid"]: p["state"] for h in view["hosts"] for p in h["procs"]}
    assert procs == {"a": "up", "b": "silent"}
    actors = {
        a_["mesh"]: a_["state"]
        for h in view["hosts"]
        for p in h["procs"]
        for m_ in p["meshes"]
        for a_ in m_["actors"]
    }
    assert actors == {"left": "serving", "right": "failed"}  # a failure stays a failure
    assert view["status"] == "live" and view["totals"]["silent"] == 1
    m.ingest(poll(3.0, registered=[]))
    assert m.view()["status"] == "live"  # one round without answers is not yet the end
    m.ingest(poll(5.5, connected=False, registered=[]))
    view = m.view()
    assert view["status"] == "ended"
    assert "job ended" in view["message"] and "broker went away" in view["message"]


def test_history_is_bounded_in_time():
    m = WatchModel("ns", history_seconds=5.0)
    for i in range(20):
        m.ingest(
            poll(
                float(i),
                stats(
                    "p0",
                    float(i),
                    [actor(0, calls=10 * i, hist=hist_of((0.001, 10 * i)))],
                    cpu=0.1 * i,
                ),
            )
        )
    hist = m.history()
    (series,) = hist["endpoints"]
    assert series["mesh"] == "workers" and series["endpoint"] == "ping"
    assert series["t"][0] >= 14.0 and series["t"][-1] == 19.0
    assert series["rate"][-1] == 10.0
    (proc,) = hist["procs"]
    assert proc["t"][0] >= 14.0 and abs(proc["cpu_pct"][-1] - 10.0) < 1e-6


def test_procs_of_a_host_agent_hang_under_it_and_restarted_counters_are_not_negative():
    m = WatchModel("ns")
    doc = stats("p0", 1.0, [actor(0, calls=50)])
    doc["host_uid"] = "h1"
    p = poll(1.0, doc)
    p.hosts = [{"uid": "h1", "name": "node-a", "state": "up"}]
    m.ingest(p)
    doc2 = {**doc, "time": 2.0, "actors": [actor(0, calls=5)]}  # a new actor, same id
    p2 = poll(2.0, doc2)
    p2.hosts = p.hosts
    m.ingest(p2)
    view = m.view()
    (host,) = view["hosts"]
    assert (host["kind"], host["name"], host["procs"][0]["uid"]) == ("agent", "node-a", "p0")
    assert view["endpoints"][0]["rate"] is None


def test_endpoints_of_actors_that_went_away_are_forgotten():
    m = WatchModel("ns")
    m.ingest(poll(1.0, stats("p0", 1.0, [actor(0, calls=1), actor(1, mesh="old", calls=1)])))
    assert {r["mesh"] for r in m.view()["endpoints"]} == {"workers", "old"}
    m.ingest(poll(2.0, stats("p0", 2.0, [actor(0, calls=2)])))
    assert {r["mesh"] for r in m.view()["endpoints"]} == {"workers"}
    assert len(m.procs["p0"].endpoints) == 1
