"""What each actor is doing, as its process answers ``mon.<ns>.ctl.stats``: counts, errors,
calls in flight, latency histograms and the actor's state, asked by a plain nats-py client
of real procs (and of the client, which hosts ``this_proc()`` actors)."""

from __future__ import annotations

import pytest

from monarch.actor import ActorError, this_proc
from monarch.actors.calls.activity import (
    BUCKET_BOUNDS_US,
    BUCKETS,
    bucket_of,
    call_listeners,
    call_record,
    percentile,
)
from monarch.core.process_runtime import runtime
from tests.actors.activity_actors import Busy, Hog, SlowStart
from tests.actors.stats_requests import wait_for_actor
from tests.helpers import proc_mesh_fixture

procs = proc_mesh_fixture({"gpus": 1})


def test_histogram_buckets_are_log2_microseconds():
    assert len(BUCKET_BOUNDS_US) == BUCKETS == 32
    assert bucket_of(0.0) == 0  # under 1 us
    assert bucket_of(1e-6) == 1  # 1 us: under 2 us
    assert bucket_of(3e-6) == 2
    assert bucket_of(0.001) == 10  # 1000 us < 1024 us
    assert bucket_of(1e9) == 31  # overflow
    hist = [0] * 32
    hist[bucket_of(0.001)] = 99
    hist[bucket_of(0.5)] = 1
    assert 512e-6 <= percentile(hist, 0.5) <= 1024e-6
    assert 0.262 <= percentile(hist, 1.0) <= 0.525
    assert percentile([0] * 32, 0.9) == 0.0
    with pytest.raises(ValueError, match="0..1"):
        percentile(hist, 99)


def test_counts_errors_and_histograms_of_finished_calls(procs):
    mesh = procs.spawn("act_counts", Busy)
    one = mesh.slice(gpus=0)
    assert [one.work.call_one(i).get(timeout=30) for i in range(20)] == list(range(20))
    for _ in range(3):
        with pytest.raises(ActorError, match="boom on purpose"):
            one.boom.call_one().get(timeout=30)

    proc, actor = wait_for_actor(
        runtime().nats_url, "act_counts",
        until=lambda p, a: a["endpoints"].get("boom", {}).get("calls") == 3,
    )  # fmt: skip
    work, boom = actor["endpoints"]["work"], actor["endpoints"]["boom"]
    assert (work["calls"], work["errors"], work["in_flight"]) == (20, 0, 0)
    assert (boom["calls"], boom["errors"]) == (3, 3)
    assert sum(work["hist"]) == 20 and len(work["hist"]) == 32
    assert sum(boom["hist"]) == 3
    assert actor["state"] == "serving" and actor["failure"] is None
    assert actor["class"] == "Busy" and actor["sizes"] == {"gpus": 1}
    assert actor["in_flight"] == []
    assert proc["uid"] != runtime().proc_uid and proc["root"] == runtime().proc_uid
    assert proc["pid"] > 0 and proc["rss_bytes"] > 0 and proc["threads"] >= 2
    assert proc["cpu_seconds"] > 0 and proc["stall_threshold"] > 0
    mesh.stop().get(timeout=30)


def test_a_call_in_flight_names_its_caller_thread_and_age(procs):
    one = procs.spawn("act_flight", Busy).slice(gpus=0)
    napping = one.nap.call_one(4.0)
    _, actor = wait_for_actor(
        runtime().nats_url, "act_flight", until=lambda p, a: bool(a["in_flight"])
    )
    (call,) = actor["in_flight"]
    assert call["endpoint"] == "nap"
    assert call["caller"] == runtime().proc_uid
    assert "act_flight" in call["thread"]  # the actor's own thread
    assert 0 <= call["seconds"] < 60 and call["started_at"] > 0
    assert actor["endpoints"]["nap"]["in_flight"] == 1
    assert napping.get(timeout=30) == "rested"
    _, actor = wait_for_actor(
        runtime().nats_url, "act_flight", until=lambda p, a: not a["in_flight"]
    )
    assert actor["endpoints"]["nap"]["calls"] == 1


def test_a_proc_whose_loop_is_blocked_still_answers(procs):
    one = procs.spawn("act_hog", Hog).slice(gpus=0)
    one.work.call_one(1).get(timeout=30)
    hogging = one.hog_loop.call_one(5.0)  # time.sleep in an async endpoint: the loop stops
    # Every answer heard while hog_loop is in flight was sent with the loop blocked.
    proc, actor = wait_for_actor(
        runtime().nats_url, "act_hog",
        until=lambda p, a: bool(a["in_flight"]) and p["loop_stall"] > 0,
    )  # fmt: skip
    assert actor["in_flight"][0]["endpoint"] == "hog_loop"
    assert hogging.get(timeout=30) == "done"


def test_states_starting_serving_failed_and_stopped(procs, root_faults):
    url = runtime().nats_url
    slow = procs.spawn("act_slow", SlowStart, 4.0)
    wait_for_actor(url, "act_slow", until=lambda p, a: a["state"] == "starting")
    assert slow.ping.call_one().get(timeout=60) == "pong"
    wait_for_actor(url, "act_slow", until=lambda p, a: a["state"] == "serving")
    slow.stop().get(timeout=30)
    _, actor = wait_for_actor(url, "act_slow", until=lambda p, a: a["state"] != "serving")
    assert actor["state"] == "stopped"  # still listed for a while after it is gone

    failing = procs.spawn("act_fail", Busy).slice(gpus=0)
    failing.abort.call_one("the disk is full").get(timeout=30)
    root_faults.wait(1)
    proc, actor = wait_for_actor(url, "act_fail", until=lambda p, a: a["state"] == "failed")
    assert "the disk is full" in actor["failure"]
    assert any(
        f["actor_id"] == actor["actor_id"] and "the disk is full" in f["reason"]
        for f in proc["recent_failures"]
    )


def test_the_client_answers_for_its_this_proc_actors(nats_url):
    local = this_proc().spawn("act_local", Busy)
    assert local.work.call_one(7).get(timeout=30) == 7
    proc, actor = wait_for_actor(nats_url, "act_local", until=lambda p, a: "work" in a["endpoints"])
    assert proc["uid"] == runtime().proc_uid
    assert actor["endpoints"]["work"]["calls"] == 1
    local.stop().get(timeout=30)


def test_call_listeners_get_one_record_per_finished_call(nats_url):
    records = []
    call_listeners.append(records.append)
    try:
        local = this_proc().spawn("act_listened", Busy)
        assert local.work.call_one(3).get(timeout=30) == 3
        with pytest.raises(ActorError):
            local.boom.call_one().get(timeout=30)
    finally:
        call_listeners.remove(records.append)
    mine = [call_record(r) for r in records if r[1] == "act_listened"]
    assert [(r.endpoint, r.ok) for r in mine] == [("work", True), ("boom", False)]
    for r in mine:
        assert r.caller == runtime().proc_uid and r.rank == 0
        assert 0 < r.t_delivered <= r.t_started <= r.t_ended
    local.stop().get(timeout=30)


def test_an_answer_too_big_for_one_message_leaves_actors_out():
    import json

    from monarch.actors.hosting.stats import fitted

    doc = {"uid": "p", "actors": [{"actor_id": f"a{i}", "pad": "x" * 1000} for i in range(100)]}
    body = fitted(doc, 20_000)
    assert len(body) <= 20_000
    answer = json.loads(body)
    assert answer["actors_left_out"] == 100 - len(answer["actors"]) > 0
    assert json.loads(fitted(doc, 10**7)) == doc  # fits: unchanged


def test_a_request_naming_a_proc_is_answered_by_that_proc_only(procs, nats_url):
    import json

    from tests.actors.stats_requests import stats_answers

    procs.spawn("act_named", Busy).work.call(1).get(timeout=30)
    everyone = stats_answers(nats_url, window=1.0)
    assert len(everyone) >= 2  # the client and the fixture's proc at least
    uid = runtime().proc_uid
    only = stats_answers(nats_url, window=1.0, body=json.dumps({"uid": uid}).encode())
    assert [a["uid"] for a in only] == [uid]
