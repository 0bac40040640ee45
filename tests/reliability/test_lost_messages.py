"""What finds lost messages, driven by hand on one broker (the node-death tests lose them for real).

A foreign nats-py client plays the other side: it asks a proc about replies
(``probe``), or numbers its messages to an actor with a hole in them, the way
a sender whose broker node died would have.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nats
import pytest

from monarch.actor import MessageLostError, this_host
from monarch.actors.messaging import lost_replies
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.lost_sends import SENT
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.vocabulary import subjects
from monarch.core.process_runtime import runtime
from tests.reliability.node_actors import Counter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def counters(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("counter", Counter)
    mesh.count.call().get(timeout=60)
    yield mesh
    procs.stop().get(timeout=60)


def _subject_of_rank(mesh, rank: int) -> str:
    st = mesh._state
    return subjects.actor("default", st.name, st.uid, [str(c) for c in st.base.coords(rank)])


async def _next(queue: asyncio.Queue, timeout: float = 10.0):
    return await asyncio.wait_for(queue.get(), timeout)


def test_a_proc_answers_probes_and_sends_a_kept_reply_again(nats_url, counters):
    st = counters._state
    actor_subject = _subject_of_rank(counters, 0)
    ctl = subjects.ctl_proc("default", st.proc_uids[0])

    async def scenario():
        nc = await nats.connect(nats_url)
        replies: asyncio.Queue = asyncio.Queue()
        answers: asyncio.Queue = asyncio.Queue()
        inbox, slow_inbox, answer_inbox = (nc.new_inbox() for _ in range(3))
        for subject, queue in ((inbox, replies), (slow_inbox, replies), (answer_inbox, answers)):
            await nc.subscribe(subject, cb=queue.put)
        call = {m.KIND: "call", m.ENDPOINT: "ping", m.FROM: "client"}
        await nc.publish(actor_subject, dumps(((7,), {}, None)), reply=inbox, headers=call)
        first = await _next(replies)
        slow = {**call, m.ENDPOINT: "slow"}
        await nc.publish(actor_subject, dumps(((1.5,), {}, None)), reply=slow_inbox, headers=slow)
        asked = [[inbox, 0], [slow_inbox, 0], [nc.new_inbox(), 0], [inbox, 1]]
        await nc.publish(ctl, dumps(asked), reply=answer_inbox, headers={m.KIND: "probe"})
        statuses = loads((await _next(answers)).data)
        again = await _next(replies)  # the kept reply, sent again
        slow_reply = await _next(replies)
        await nc.close()
        return first, statuses, again, slow_reply

    first, statuses, again, slow_reply = asyncio.run(scenario())
    assert loads(first.data) == 7 and first.headers[m.RANK] == "0"
    assert statuses == ["replied", "pending", "unknown", "unknown"]
    assert again.data == first.data and again.subject == first.subject
    assert loads(slow_reply.data) == 1.5


def test_a_hole_in_a_senders_numbering_is_reported_to_that_sender(nats_url, counters):
    ghost = f"ghost-{subjects.new_uid()}"
    subject = _subject_of_rank(counters, 1)

    async def scenario():
        nc = await nats.connect(nats_url)
        notices: asyncio.Queue = asyncio.Queue()
        await nc.subscribe(subjects.ctl_proc("default", ghost), cb=notices.put)
        send = {m.KIND: "send", m.ENDPOINT: "incr", m.FROM: ghost}
        body = dumps(((), {}, None))
        for n in (1, 3):  # number 2 "died with a broker node"
            await nc.publish(subject, body, headers={**send, m.SEQ: f"{n}@{ghost}"})
        by_send = await _next(notices)
        # Sends 4 and 5 are lost too; a sync marker says 5 went out.
        sync = {m.KIND: "sync", m.FROM: ghost, SENT: f"5@{ghost}"}
        await nc.publish(subject, b"", headers=sync)
        by_sync = await _next(notices)
        # Then 6 is lost and a call says "6 so far": it is refused, not run.
        inbox = nc.new_inbox()
        replies: asyncio.Queue = asyncio.Queue()
        await nc.subscribe(inbox, cb=replies.put)
        call = {m.KIND: "call", m.ENDPOINT: "ping", m.FROM: ghost, SENT: f"6@{ghost}"}
        await nc.publish(subject, dumps(((1,), {}, None)), reply=inbox, headers=call)
        refused = await _next(replies)
        await nc.close()
        return by_send, by_sync, refused

    by_send, by_sync, refused = asyncio.run(scenario())
    uid = counters._state.uid
    assert by_send.headers[m.KIND] == "lost" and loads(by_send.data) == [uid, 1, 1, subject]
    assert loads(by_sync.data) == [uid, 1, 2, subject]
    assert refused.headers[m.KIND] == "error"
    error = m.decode_error(refused.data, actor_id="", rank=1, endpoint="ping")
    assert isinstance(error.exception, MessageLostError)
    assert error.exception.counts == {1: 1}
    # It ran sends 1 and 3, not the refused call.
    assert list(counters.count.call().get(timeout=30).values()) == [0, 2]


def test_the_sender_learns_of_its_lost_messages_at_its_next_call(nats_url, counters):
    st = counters._state
    notice = dumps([st.uid, 1, 3, _subject_of_rank(counters, 1)])
    rt = runtime()
    rt.call_soon(rt.publish, subjects.ctl_proc("default", rt.proc_uid), notice, {m.KIND: "lost"})
    deadline = time.monotonic() + 10
    while not st.lost and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(MessageLostError, match="3 message") as caught:
        counters.ping.call(1).get(timeout=30)
    assert caught.value.counts == {1: 3} and caught.value.mesh == "counter"
    assert list(counters.ping.call(2).get(timeout=30).values()) == [2, 2]  # reported once


def test_a_call_that_never_reaches_one_rank_fails_instead_of_waiting(nats_url, counters):
    """Rank 1 no longer hears whole-mesh messages: a whole-mesh call reaches rank 0 only,
    exactly as if its copy for rank 1 had died with a broker node. The caller's probe
    finds out and the call raises, well before its own timeout."""
    counters.slice(gpus=1).deafen.call_one().get(timeout=30)
    with pytest.raises(
        MessageLostError, match="rank\\(s\\) 1: their procs never received it"
    ) as caught:
        counters.ping.call(5).get(timeout=60)
    assert caught.value.counts == {1: 1}
    assert (caught.value.ran, caught.value.not_run) == ([0], [1])
    assert actor_process(runtime()).prober.lost >= 1


def test_a_call_lost_on_some_ranks_says_where_it_ran_and_where_not(nats_url):
    """Ranks 1 and 2 of three stop hearing whole-mesh messages: a whole-mesh call runs
    on rank 0 only. Its error must name both lost ranks, and say that rank 0 ran it (a
    repeat runs twice there), not "safe to call again"."""
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        mesh = procs.spawn("counter", Counter)
        for rank in (1, 2):
            mesh.slice(gpus=rank).deafen.call_one().get(timeout=60)
        with pytest.raises(MessageLostError) as caught:
            mesh.ping.call(5).get(timeout=60)
        e = caught.value
        assert (e.ran, e.not_run, e.unknown) == ([0], [1, 2], []), str(e)
        assert e.counts == {1: 1, 2: 1}
        assert "rank(s) 1, 2" in str(e) and "ran (or is running) on rank(s) 0" in str(e)
        assert "safe to call again" not in str(e)
        handled = [mesh.slice(gpus=r).count.call_one().get(timeout=60) for r in range(3)]
        assert handled == [1, 0, 0]
    finally:
        procs.stop().get(timeout=60)


def test_a_call_refused_by_one_rank_says_the_others_may_have_run_it(nats_url, counters):
    """Rank 1 misses one broadcast (it vanishes before the actor sees it): it refuses the
    next whole-mesh call, which rank 0 runs. The error must not read as "nothing ran"."""
    counters.slice(gpus=1).drop_whole_mesh_messages.call_one(1).get(timeout=30)
    counters.incr.broadcast()
    with pytest.raises(MessageLostError, match="this call was not run there") as caught:
        counters.ping.call(3).get(timeout=60)
    e = caught.value
    assert e.not_run == [1] and e.ran + e.unknown == [0], str(e)
    assert "calling the whole mesh again may run it twice" in str(e)
    handled = [counters.slice(gpus=r).count.call_one().get(timeout=30) for r in range(2)]
    assert handled == [2, 0]  # rank 0 ran the broadcast and the call; rank 1 neither


SILENT_RANK = """
    import json, os, signal
    from monarch.actor import MessageLostError, this_host
    from tests.reliability.node_actors import Counter
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    mesh = procs.spawn("counter", Counter)
    mesh.slice(gpus=1).deafen.call_one().get(timeout=60)
    pid = mesh.slice(gpus=2).pid.call_one().get(timeout=60)
    os.kill(pid, signal.SIGSTOP)  # its proc answers no probe (nor the call)
    try:
        mesh.ping.call(4).get(timeout=60)
        outcome = "no error"
    except MessageLostError as e:
        outcome = {"ran": e.ran, "not_run": e.not_run, "unknown": e.unknown, "text": str(e)}
    os.kill(pid, signal.SIGCONT)
    procs.stop().get(timeout=60)
    print(json.dumps(outcome))
"""


def test_a_rank_whose_proc_does_not_answer_is_reported_unknown(tmp_path):
    """Rank 1 never receives the call, rank 2's proc is frozen (SIGSTOP; heartbeats
    allowed a long silence, so it is not declared dead): the call still ends, within
    the probe's answer timeout, saying rank 0 ran it, rank 1 did not, rank 2 unknown."""
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(SILENT_RANK))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(PYTHONPATH=str(ROOT), MONARCH_HEARTBEAT_TIMEOUT="60")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome != "no error"
    assert (outcome["ran"], outcome["not_run"], outcome["unknown"]) == ([0], [1], [2]), outcome
    assert "Whether it ran on rank(s) 2 is unknown" in outcome["text"]


def test_a_lost_call_is_called_safe_to_repeat_only_when_it_ran_nowhere():
    class State:  # what the error names: the mesh and its actor class
        name, class_name = "trainer", "Trainer"

    nowhere = lost_replies.lost_call_error(State, "step", [], [0, 1], [])
    assert "safe to call again" in str(nowhere) and nowhere.counts == {0: 1, 1: 1}
    partly = lost_replies.lost_call_error(State, "step", [0], [1], [2])
    assert "safe to call again" not in str(partly)
    assert (partly.ran, partly.not_run, partly.unknown) == ([0], [1], [2])
    assert "Whether it ran on rank(s) 2 is unknown" in str(partly)


def test_many_small_replies_are_bounded_by_the_ledgers_byte_cap(monkeypatch):
    """A kept reply counts its own overhead, not only its body: at S2's rate
    (~17,000 tiny replies a second) REPLY_TTL alone would keep ~600 MB a proc."""

    class Runtime:  # what the ledger asks of a runtime: who it is, and a publish
        proc_uid = "proc"
        published: list = []

        def publish(self, subject, body, headers):
            self.published.append(subject)

    cap = 1 << 20
    monkeypatch.setattr(lost_replies, "REPLY_CACHE_BYTES", cap)
    rt = Runtime()
    ledger = lost_replies.ReplyLedger(rt)
    n = 10_000
    for i in range(n):
        subject = f"mon.default.port.client.{i}"
        ledger.received(subject, 0)
        ledger.sent(subject, 0, b"\x01", {m.KIND: "reply"})
    assert ledger._bytes <= cap
    assert len(ledger._sent) == cap // (lost_replies.ENTRY_OVERHEAD + 1)  # not all 10,000
    newest = f"mon.default.port.client.{n - 1}"
    assert ledger.status(newest, 0) == "replied" and rt.published == [newest]


def test_a_reply_merged_on_its_proc_is_kept_under_each_rank_it_answers(monkeypatch):
    """A merged reply (monarch.actors.hosting.reduce) answers for several ranks: a probe
    about any of them finds it and sends it again; ranks it does not cover stay
    pending; its one body and entry are counted once, each rank's key on top, and
    evicting it takes all its ranks and brings the byte count back to zero."""

    class Runtime:
        proc_uid = "proc"
        published: list = []

        def publish(self, subject, body, headers):
            self.published.append((subject, headers.get(m.RANKS)))

    rt = Runtime()
    ledger = lost_replies.ReplyLedger(rt)
    subject = "mon.default.port.client.7"
    ledger.received(subject, [0, 1, 2, 3])  # a group's shared call: its ranks in one call
    ledger.sent(subject, [0, 1, 2], b"\x06", {m.KIND: "reply", m.RANKS: "0-2"})
    assert [ledger.status(subject, r) for r in range(5)] == [
        "replied", "replied", "replied", "pending", "unknown"
    ]  # fmt: skip
    assert rt.published == [(subject, "0-2")] * 3
    assert ledger._bytes == 1 + lost_replies.ENTRY_OVERHEAD + 3 * lost_replies.RANK_ENTRY_OVERHEAD
    ledger.connection_changed(False)  # a drop and a reconnect: sent again, once for its ranks
    ledger.connection_changed(True)
    assert rt.published == [(subject, "0-2")] * 4
    monkeypatch.setattr(lost_replies, "REPLY_CACHE_BYTES", 0)  # the next reply evicts all
    ledger.received("mon.default.port.client.8", 0)
    ledger.sent("mon.default.port.client.8", 0, b"", {m.KIND: "reply"})
    assert not ledger._sent and not ledger._order and ledger._bytes == 0


def test_a_big_reply_being_fetched_is_neither_probed_nor_fetched_twice(counters, monkeypatch):
    """A big reply is a reference the caller fetches; while that fetch runs the call
    is answered. Before, the prober took the rank for unanswered, the proc sent the
    reply again, and the second copy's fetch found the bytes already taken by the
    first (a reply is kept for one reader): the call failed with BufferDroppedError
    although its value had arrived (torchstore's resharding test, under load)."""
    from monarch.actors.calls import gather as gather_module

    real_fetch = gather_module.fetch_async

    async def slow_fetch(body, **kwargs):
        data = await real_fetch(body, **kwargs)  # the bytes are here, the replier told
        await asyncio.sleep(3 * lost_replies.PROBE_AFTER)  # a loaded caller, made long
        return data

    monkeypatch.setattr(gather_module, "fetch_async", slow_fetch)
    one = counters.slice(gpus=1)
    resent_before = one.replies_resent.call_one().get(timeout=30)
    big = b"x" * (600 * 1024)  # over the 256 KiB bulk threshold: sent as a reference
    assert one.ping.call_one(big).get(timeout=60) == big
    assert one.replies_resent.call_one().get(timeout=30) == resent_before
