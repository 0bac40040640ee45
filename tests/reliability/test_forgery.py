"""Forged messages from a foreign client on an open broker.

A raw nats-py client that can reach the broker publishes on a job's subjects:
replies to a call in flight, a second reply for a rank, a reply from the wrong
actor, a ``dead`` heartbeat for a healthy proc, a supervision event, a ``dead``
heartbeat of the client, and a few thousand mutated copies of real traffic.

* With a job key (``MONARCH_NATS_JOB_KEY``) every one of them is dropped where
  messages come in, and counted: the call returns the real answers, the procs
  live on, the fault hook does not run.
* Without one, a gather still takes one reply per rank from the actor it asked
  (a forger who copies the right ``Mon-From`` is not stopped: that needs the
  key), and the job warns once that the broker is open.

Jobs with their own environment run as client scripts in subprocesses; the
test process plays the foreign client.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import queue
import random
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest

from monarch.actor import Accumulator, Actor, current_rank, endpoint, this_host
from monarch.actors.calls.gather import Gather
from monarch.actors.errors import MalformedMessageError
from monarch.broker.bodies.codec import dumps
from monarch.broker.connections import auth
from monarch.broker.connections.server import EmbeddedBroker
from monarch.broker.vocabulary import subjects
from monarch.supervision.failure import MeshFailure

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0  # seconds; every wait is bounded by this
OPEN_WARNING = "admits clients without credentials"


def wait_for_release(paths: list[str]) -> int:
    """Wait (bounded) until the file named for this actor's rank exists; its rank."""
    rank = current_rank().rank
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(paths[rank]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return rank


class Holder(Actor):
    """Answers ``hold`` once the file named for its rank exists (so a call stays in flight)."""

    @endpoint
    def hold(self, paths: list[str]) -> list:
        return ["real", wait_for_release(paths)]

    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def state(self) -> dict:
        return {"pid": os.getpid(), "dropped": auth.dropped()}

    @endpoint
    def key(self) -> dict:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace")
        return {"key": os.environ.get(auth.KEY_ENV), "argv": argv}


# -- the foreign client ----------------------------------------------------------------


class Foreign:
    """A raw nats-py client on a thread of its own: no credentials, no job key."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.nc = self.run(nats.connect(url, max_reconnect_attempts=1))

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def sniff(self, subject: str) -> list:
        """Subscribe; returns the list that collects (subject, reply, headers, data)."""
        seen: list = []

        async def on(msg):
            seen.append((msg.subject, msg.reply, dict(msg.headers or {}), msg.data))

        async def sub():
            await self.nc.subscribe(subject, cb=on)
            await self.nc.flush()

        self.run(sub())
        return seen

    def publish_all(self, messages: list) -> None:
        """Publish (subject, reply, headers, data) tuples in order, then flush.

        After the flush the server has routed them, so anything a job sends
        from now on reaches each receiver after them.
        """

        async def go():
            for subject, reply, headers, data in messages:
                await self.nc.publish(subject, data, reply=reply, headers=headers)
            await self.nc.flush()

        self.run(go())

    def close(self) -> None:
        try:
            self.run(self.nc.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


def wait_for(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def reply_subject_of(seen: list, endpoint_name: str, after: str = "") -> tuple[str, dict]:
    """The reply subject (and headers) of the first sniffed call to ``endpoint_name``
    (``after``: of a later call than the one answered there)."""

    def find():
        for _, reply, headers, _ in list(seen):
            if headers.get("Mon-Endpoint") == endpoint_name and reply and reply != after:
                return reply, headers
        return None

    try:
        return wait_for(find, f"a call to {endpoint_name}")
    except AssertionError as e:
        sniffed = [(s, h.get("Mon-Kind"), h.get("Mon-Endpoint")) for s, _, h, _ in list(seen)]
        raise AssertionError(f"{e}; sniffed: {sniffed[:20]}") from None


def reply(rank: int, sender: str, value, **extra: str) -> tuple[dict, bytes]:
    headers = {"Mon-Kind": "reply", "Mon-Rank": str(rank), "Mon-From": sender, **extra}
    return headers, dumps(value)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- jobs in a process of their own ----------------------------------------------------

JOB = r"""
import json, sys
import monarch.actor
from monarch.actor import this_host
from monarch.actors.calls.gather import Gather
from monarch.core.process_runtime import runtime
from monarch.broker.connections import auth
from tests.reliability.test_forgery import Holder

faults = []
monarch.actor.unhandled_fault_hook = lambda failure: faults.append(repr(failure))


def say(what, **kw):
    print(json.dumps({"what": what, **kw}), flush=True)


def states():
    return list(mesh.state.call().get(60).values())


pm = this_host().spawn_procs(per_host={"gpus": 2})
mesh = pm.spawn("victim", Holder)
first = states()  # the mesh is up: its proc uids are known
rt, st = runtime(), mesh._state
say("ready", ns=rt.namespace, client=rt.proc_uid, procs=list(st.proc_uids), mesh=st.uid,
    actors=[st.actor_id(r) for r in range(2)], pids=[s["pid"] for s in first],
    signed=auth.auth_of(rt.nc) is not None)
pending = None
while True:
    line = sys.stdin.readline()
    if not line:
        break
    op = json.loads(line)["op"]
    if op == "call":
        pending = mesh.hold.call(json.loads(line)["paths"])
        say("call")
    elif op == "result":
        say("result", values=list(pending.get(60).values()))
    elif op == "traffic":  # real messages for the foreign client to copy
        for i in range(20):
            mesh.ping.call(i).get(60)
        for i in range(300):
            mesh.ping.broadcast(i)
        mesh.ping.call(-1).get(60)
        say("traffic")
    elif op == "check":
        # A round trip first: every message routed to us before it has been taken in.
        pings = list(mesh.ping.call(7).get(60).values())
        now = states()
        say("check", pings=pings, pids=[s["pid"] for s in now],
            procs_dropped=[s["dropped"] for s in now], client_dropped=auth.dropped(),
            gather_dropped=dict(Gather.dropped), faults=faults)
    elif op == "quit":
        break
pm.stop().get(60)
say("bye")
"""


class Job:
    """A client script with its own environment, driven one JSON line at a time."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        script = folder / "job.py"
        script.write_text(JOB)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        clean.update(PYTHONPATH=str(ROOT), **env)
        self.stderr_path = folder / "job.stderr"
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=clean,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info = self.expect("ready")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, what: str) -> dict:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"job said no {what!r} in {TIMEOUT} s:\n{self.stderr()}"
                ) from None
            if line is None:
                raise AssertionError(f"job ended before {what!r}:\n{self.stderr()}")
            if line.startswith("{"):
                answer = json.loads(line)
                if answer.get("what") == what:
                    return answer

    def ask(self, op: str, **args) -> dict:
        self.send(op, **args)
        return self.expect(op)

    def send(self, op: str, **args) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("quit")
                self.expect("bye")
                self.proc.wait(TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(TIMEOUT)
            self._stderr.close()


@pytest.fixture(scope="module")
def open_broker():
    """A broker of this module's own that admits anyone (no token, no accounts)."""
    broker = EmbeddedBroker().start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def keyed_job(open_broker, tmp_path_factory):
    """A job with a job key on the open broker, and a foreign client beside it."""
    job = Job(
        tmp_path_factory.mktemp("keyed"),
        {
            "MONARCH_NATS_URL": open_broker.url,
            "MONARCH_NATS_JOB_KEY": secrets.token_urlsafe(24),
        },
    )
    foreign = Foreign(open_broker.url)
    yield job, foreign
    foreign.close()
    job.close()


def dropped_delta(before: dict, after: dict) -> dict:
    """Per-process drop counts that grew: {"client": {...}, "proc0": {...}, ...}."""
    out = {}
    names = ["client"] + [f"proc{i}" for i in range(len(after["procs_dropped"]))]
    olds = [before["client_dropped"], *before["procs_dropped"]]
    news = [after["client_dropped"], *after["procs_dropped"]]
    for name, old, new in zip(names, olds, news):
        grown = {k: v - old.get(k, 0) for k, v in new.items() if v != old.get(k, 0)}
        if grown:
            out[name] = grown
    return out


# -- with a job key ---------------------------------------------------------------------


def test_with_a_job_key_forged_replies_are_dropped_and_the_call_gets_the_real_answers(
    keyed_job, tmp_path
):
    job, foreign = keyed_job
    info = job.info
    assert info["signed"]
    ns, uid, actors = info["ns"], info["mesh"], info["actors"]
    before = job.ask("check")
    seen = foreign.sniff(f"mon.{ns}.act.victim.{uid}.>")
    release = [str(tmp_path / "r0"), str(tmp_path / "r1")]
    job.ask("call", paths=release)
    call_reply, call_headers = reply_subject_of(seen, "hold")
    assert auth.TAG in call_headers  # the job signs; the forger sees the tag

    forged = [
        reply(0, actors[0], ["forged", 0]),  # the right rank and sender, no tag
        reply(1, actors[1], ["forged", 1], **{auth.TAG: "0" * 32}),  # a made-up tag
        reply(0, actors[0], ["forged", 0], **{auth.TAG: call_headers[auth.TAG]}),  # a real one
        reply(7, f"victim.{uid}[7]", ["forged", 7]),  # a rank nobody asked
    ]
    foreign.publish_all([(call_reply, "", h, body) for h, body in forged])
    for path in release:
        Path(path).touch()
    assert job.ask("result")["values"] == [["real", 0], ["real", 1]]

    after = job.ask("check")
    assert dropped_delta(before, after) == {"client": {"port": 4}}
    assert after["gather_dropped"] == before["gather_dropped"]  # refused before any gather


def test_with_a_job_key_fake_heartbeats_and_supervision_events_change_nothing(keyed_job):
    job, foreign = keyed_job
    info = job.info
    ns, client, procs, uid = info["ns"], info["client"], info["procs"], info["mesh"]
    before = job.ask("check")
    failure = MeshFailure("victim", uid, [0], "actor_failed", "forged failure", owner="client")
    foreign.publish_all(
        [
            # a healthy proc declared dead (without a key its owner kills it)
            (subjects.heartbeat(ns, procs[0]), "", {"Mon-Kind": "dead"}, b"forged"),
            # a failure of rank 0 reported to the client (without a key: the fault hook runs)
            (
                subjects.supervision(ns, client),
                "",
                {
                    "Mon-Kind": "failure",
                    "Mon-Mesh": "victim",
                    "Mon-Reason": "actor_failed",
                    "Mon-Owner": "client",
                    "Mon-From": procs[0],
                },
                dumps(failure.to_wire()),
            ),
            # the client declared dead (without a key every proc exits)
            (subjects.heartbeat(ns, client), "", {"Mon-Kind": "dead"}, b"forged"),
        ]
    )
    after = job.ask("check")
    assert after["pings"] == [7, 7]  # rank 0 is not marked dead, no proc exited
    assert after["pids"] == info["pids"] and all(alive(pid) for pid in info["pids"])
    assert after["faults"] == []
    # A watcher hears heartbeat subjects on two connections (beats on its heartbeat
    # connection, reapers' "dead" announcements on its main one): dropped on both.
    # Each connection drops on its own loop, maybe after "check" was answered: ask again.
    dropped = {"client": {"hb": 2, "sup": 1}, "proc0": {"hb": 2}, "proc1": {"hb": 2}}
    deadline = time.monotonic() + TIMEOUT
    while dropped_delta(before, after) != dropped and time.monotonic() < deadline:
        time.sleep(0.05)
        after = job.ask("check")
    assert dropped_delta(before, after) == dropped
    assert OPEN_WARNING not in job.stderr()  # the key silences the open-broker warning


def mutations(real: list, targets: dict, rng: random.Random, n: int) -> list:
    """``n`` messages made from real ones (copied tags, flipped bytes, new bodies, ...)."""
    out = []
    tags = [h[auth.TAG] for _, _, h, _ in real if auth.TAG in h]
    names = list(targets)

    def mon_key() -> str:
        return "Mon-" + rng.choice(["Kind", "Rank", "From", "Seq", "Endpoint", "Count", "X"])

    while len(out) < n:
        subject, reply_to, headers, body = rng.choice(real)
        headers, body = dict(headers), bytes(body)
        how = rng.randrange(12)
        if how == 0:  # one byte of the body flipped
            body = body or b"\x00"
            i = rng.randrange(len(body))
            body = body[:i] + bytes([body[i] ^ (1 << rng.randrange(8))]) + body[i + 1 :]
        elif how == 1:  # the real headers (and tag) with a new body
            body = rng.randbytes(rng.randrange(1, 200))
        elif how == 2:  # one Mon-* header changed
            keys = [k for k in headers if k.startswith("Mon-") and k != auth.TAG] or ["Mon-Kind"]
            headers[rng.choice(keys)] = rng.choice(["dead", "reply", "0", "1", "x", "call"])
        elif how == 3:  # one Mon-* header added
            headers[mon_key() + "-Extra"] = str(rng.randrange(100))
        elif how == 4:  # the tag removed
            headers.pop(auth.TAG, None)
        elif how == 5:  # a random tag, or a real one mangled
            tag = headers.get(auth.TAG) or secrets.token_hex(16)
            headers[auth.TAG] = rng.choice(
                [secrets.token_hex(16), tag[:-1], tag.upper(), tag + "0", "é" * 32, ""]
            )
        elif how == 6:  # the tag of another real message
            headers[auth.TAG] = rng.choice(tags)
        elif how == 7:  # the real message, sent somewhere else
            subject = rng.choice(names)
        elif how == 8:  # the real message with another reply subject
            reply_to = rng.choice(["_INBOX.forged", "", subject])
        elif how == 9:  # random headers and body
            headers = {mon_key(): secrets.token_hex(rng.randrange(1, 8))
                       for _ in range(rng.randrange(4))}  # fmt: skip
            body = rng.randbytes(rng.randrange(1, 100))
        elif how == 10:  # a batch of real messages, under a real tag
            inner = [[h, b] for _, _, h, b in rng.sample(real, min(3, len(real)))]
            headers = {"Mon-Kind": "batch", "Mon-Count": str(len(inner))}
            headers[auth.TAG] = rng.choice(tags)
            body = msgpack.packb(inner, use_bin_type=True)
        else:  # no headers at all
            headers, body = {}, rng.randbytes(rng.randrange(1, 100))
        if subject not in targets:
            subject = rng.choice(names)
        kind = subject.split(".")[2]
        if kind in ("hb", "sup"):
            reply_to = ""  # JetStream would answer a reply subject there (a message of its own)
        out.append((subject, reply_to, headers, body))
    return out


def test_with_a_job_key_thousands_of_mutated_messages_are_all_dropped(keyed_job):
    job, foreign = keyed_job
    info = job.info
    ns, client, procs, uid = info["ns"], info["client"], info["procs"], info["mesh"]
    real = foreign.sniff(f"mon.{ns}.>")
    job.ask("traffic")
    wait_for(lambda: any(h.get("Mon-Kind") == "alive" for _, _, h, _ in real), "a heartbeat")
    real = [m for m in list(real) if auth.TAG in m[2]]
    assert len(real) > 20
    # Every subject a forgery goes to, and which of the job's processes receive it
    # (once per subscription of theirs that matches).
    names = [f"proc{r}" for r in range(len(procs))]
    targets = {subjects.actor(ns, "victim", uid, ["_"]): names}
    for r, p in enumerate(procs):
        targets[subjects.actor(ns, "victim", uid, [str(r)])] = [names[r]]
        targets[subjects.heartbeat(ns, p)] = ["client"]  # the owner watches it
        targets[subjects.supervision(ns, p)] = [names[r]]
        targets[subjects.ctl_proc(ns, p)] = [names[r]]
        targets[subjects.log(ns, p)] = ["client"]  # the owner collects it
        targets[subjects.port(ns, p, 999_999)] = [names[r]]
    targets[subjects.heartbeat(ns, client)] = names  # every proc watches its owner
    targets[subjects.supervision(ns, client)] = ["client"]
    targets[subjects.ctl_proc(ns, client)] = ["client"]
    targets[subjects.port(ns, client, 999_999)] = ["client"]
    for subject, *_ in real:  # real subjects, e.g. the client's reply ports, as they were
        if subject.startswith(f"mon.{ns}.port.{client}."):
            targets[subject] = ["client"]

    # An exact copy of a real message would pass (the tag does not stop replays): none here.
    real_keys = {(s, r, json.dumps(h, sort_keys=True), d) for s, r, h, d in real}
    forged = [
        m
        for m in mutations(real, targets, random.Random(14), 3300)
        if (m[0], m[1], json.dumps(m[2], sort_keys=True), m[3]) not in real_keys
    ][:3000]
    before = job.ask("check")
    foreign.publish_all(forged)
    after = job.ask("check")

    expected: dict[str, dict[str, int]] = {}
    for subject, *_ in forged:
        for name in targets[subject]:
            kind = subject.split(".")[2]
            expected.setdefault(name, {}).setdefault(kind, 0)
            # heartbeat subjects: two subscriptions per watcher (its heartbeat connection
            # for beats, its main one for "dead" announcements)
            expected[name][kind] += 2 if kind == "hb" else 1
    deliveries = sum(sum(d.values()) for d in expected.values())
    # Heartbeat subjects are dropped on each process's heartbeat connection, on a loop of
    # its own, maybe after "check" was answered: ask again (a forgery that was accepted
    # stays missing from the counts, and the assert below still fails).
    deadline = time.monotonic() + TIMEOUT
    while dropped_delta(before, after) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        after = job.ask("check")
    dropped = dropped_delta(before, after)
    drops = sum(sum(d.values()) for d in dropped.values())
    print(
        f"\nforged messages tried: {len(forged)} ({deliveries} deliveries to the job's "
        f"subscriptions), dropped: {drops}, accepted: {deliveries - drops}"
    )
    assert len(forged) == 3000
    assert dropped == expected  # not one accepted, anywhere
    assert after["pings"] == [7, 7]
    assert after["pids"] == info["pids"] and all(alive(pid) for pid in info["pids"])
    assert after["faults"] == []


# -- without one --------------------------------------------------------------------------


def test_without_a_key_a_gather_takes_one_reply_per_rank_from_the_actor_it_asked(
    nats_url, tmp_path
):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    foreign = Foreign(nats_url)
    try:
        mesh = pm.spawn("gathered", Holder)
        assert list(mesh.ping.call(1).get(timeout=TIMEOUT).values()) == [1, 1]
        st = mesh._state
        ns = st.rt.namespace
        seen = foreign.sniff(f"mon.{ns}.act.gathered.{st.uid}.>")
        wide = foreign.sniff(f"mon.{ns}.>")  # only read to say more should `seen` stay empty
        release = [tmp_path / "r0", tmp_path / "r1"]
        before = dict(Gather.dropped)
        call = mesh.hold.call([str(p) for p in release])
        try:
            reply_to, _ = reply_subject_of(seen, "hold")
        except AssertionError as e:  # seen twice in CI (2026-12-07 the second), not here: say more
            rt, direct = st.rt, st.rt._direct_write
            at = [
                (u.hostname, u.port) if u else None
                for u in (c.connected_url for c in (rt.nc, foreign.nc))
            ]
            calls = [(s, h.get("Mon-Endpoint")) for s, _, h, _ in list(wide) if "hold" in str(h)]
            raise AssertionError(
                f"{e}; client at {at[0]} (fixture {nats_url}), connected {rt.nc.is_connected}, "
                f"stats {rt.nc.stats}, direct writes {direct.writes if direct else None}; "
                f"sniffer at {at[1]}, connected {foreign.nc.is_connected}, stats "
                f"{foreign.nc.stats}, {len(wide)} messages on mon.{ns}.>, calls to hold "
                f"among them: {calls[:4]}"
            ) from None
        replies = foreign.sniff(reply_to)
        release[0].touch()  # rank 0 answers; rank 1 still holds
        wait_for(lambda: any(h.get("Mon-Rank") == "0" for _, _, h, _ in replies), "rank 0")
        forged = [
            reply(0, st.actor_id(0), ["forged", 0]),  # a second answer for rank 0
            reply(1, "intruder", ["forged", 1]),  # rank 1's answer, from someone else
            reply(5, st.actor_id(5), ["forged", 5]),  # a rank that was not asked
            ({"Mon-Kind": "reply", "Mon-From": st.actor_id(1)}, dumps(["forged", -1])),  # none
        ]
        foreign.publish_all([(reply_to, "", h, body) for h, body in forged])
        release[1].touch()
        assert list(call.get(timeout=TIMEOUT).values()) == [["real", 0], ["real", 1]]
        grown = {
            k: v - before.get(k, 0) for k, v in Gather.dropped.items() if v != before.get(k, 0)
        }
        assert grown == {"duplicate": 1, "wrong_sender": 1, "unexpected_rank": 1, "no_rank": 1}
    finally:
        foreign.close()
        pm.stop().get(timeout=TIMEOUT)


class Holds(Actor):
    """Answers ``hold`` with its rank once the file named for its rank exists."""

    @endpoint
    def hold(self, paths: list[str]) -> int:
        return wait_for_release(paths)


def forge_four_replies_for_a_group(
    foreign: Foreign, pm: Any, tmp_path: Path, name: str, start: Any, value: Any
) -> tuple[Any, dict, dict, Any, list, str]:
    """A call (``start(mesh, paths)``) to 2 procs x 2 ``Holds``; once proc 0's group has
    answered, a foreign client answers under ``Mon-Ranks`` (each body ``value(n)`` for
    n ranks) for ranks of two procs, for a rank not asked, in a malformed Mon-Ranks,
    and again for proc 0's ranks; then proc 1's actors answer. Returns the call's
    result, what Gather dropped meanwhile by reason, the call's headers, the mesh,
    the sniffed calls and the reply subject."""
    mesh = pm.per_proc(workers=2).spawn(name, Holds)
    st = mesh._state
    release = [tmp_path / f"r{i}" for i in range(4)]
    seen = foreign.sniff(f"mon.{st.rt.namespace}.act.{name}.{st.uid}.>")
    before = dict(Gather.dropped)
    call = start(mesh, [str(p) for p in release])
    reply_to, headers = reply_subject_of(seen, "hold")
    replies = foreign.sniff(reply_to)
    release[0].touch()
    release[1].touch()  # proc 0's group answers; proc 1's still holds

    def answered(rank: int) -> bool:
        return any(str(rank) == h.get("Mon-Rank") or h.get("Mon-Ranks") == "0-1"
                   for _, _, h, _ in list(replies))  # fmt: skip

    wait_for(lambda: answered(0) and answered(1), "proc 0's answers")
    forged = [
        reply(1, st.actor_id(1), value(2), **{"Mon-Ranks": "1-2"}),  # two procs' ranks
        reply(2, st.actor_id(2), value(3), **{"Mon-Ranks": "2-4"}),  # rank 4 was not asked
        reply(2, st.actor_id(2), value(1), **{"Mon-Ranks": "2-x"}),  # malformed
        reply(0, st.actor_id(0), value(2), **{"Mon-Ranks": "0-1"}),  # answered already
    ]
    foreign.publish_all([(reply_to, "", h, body) for h, body in forged])
    release[2].touch()
    release[3].touch()
    result = call.get(timeout=TIMEOUT)
    grown = {k: v - before.get(k, 0) for k, v in Gather.dropped.items() if v != before.get(k, 0)}
    return result, grown, headers, mesh, seen, reply_to


def test_without_a_key_a_merged_reply_must_name_ranks_of_one_proc_that_are_still_due(
    nats_url, tmp_path
):
    # A reducing Accumulator: each forged merged reply is dropped; the fold is 0+1+2+3.
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    foreign = Foreign(nats_url)
    try:
        summed, grown, headers, *_ = forge_four_replies_for_a_group(
            foreign, pm, tmp_path, "merging",
            lambda mesh, paths: Accumulator(
                mesh.hold, 0, operator.add, reducer=operator.add
            ).accumulate(paths),
            lambda n: 1000,
        )  # fmt: skip
        assert headers.get("Mon-Reduce", "").startswith(("operator.add ", "_operator.add "))
        assert summed == 0 + 1 + 2 + 3
        assert grown == {"unexpected_rank": 3, "duplicate": 1}
    finally:
        foreign.close()
        pm.stop().get(timeout=TIMEOUT)


def test_without_a_key_a_gathered_reply_must_name_ranks_of_one_proc_still_due_with_a_value_each(
    nats_url, tmp_path
):
    # A plain call, whose replies a proc gathers into one list under Mon-Ranks: each
    # forged gathered reply is dropped and the call gets the real values; then a
    # gathered reply for due ranks with the wrong number of values fails the call,
    # naming them, rather than filling in values.
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    foreign = Foreign(nats_url)
    try:
        got, grown, _, mesh, seen, reply_to = forge_four_replies_for_a_group(
            foreign, pm, tmp_path, "gathering",
            lambda mesh, paths: mesh.hold.call(paths), lambda n: [1000] * n,
        )  # fmt: skip
        assert list(got.values()) == [0, 1, 2, 3]
        assert grown == {"unexpected_rank": 3, "duplicate": 1}

        later = [tmp_path / f"later{i}" for i in range(4)]
        call = mesh.hold.call([str(p) for p in later])
        reply_to, _ = reply_subject_of(seen, "hold", after=reply_to)
        st = mesh._state
        forged_count = reply(2, st.actor_id(2), [1000], **{"Mon-Ranks": "2-3"})
        foreign.publish_all([(reply_to, "", *forged_count)])
        with pytest.raises(MalformedMessageError, match=r"ranks 2-3 .* carries 1 values, not 2"):
            call.get(timeout=TIMEOUT)
        for p in later:
            p.touch()
    finally:
        foreign.close()
        pm.stop().get(timeout=TIMEOUT)


SMALL_JOB = """
import json, os
from monarch.actor import this_host
from monarch.core.process_runtime import runtime
from monarch.broker.connections import auth
from tests.reliability.test_forgery import Holder
pm = this_host().spawn_procs(per_host={"gpus": 2})
mesh = pm.spawn("w", Holder)
print(list(mesh.ping.call(3).get(60).values()), flush=True)
print(json.dumps({"key": os.environ.get(auth.KEY_ENV), "signed": auth.auth_of(runtime().nc) is not None,
                  "procs": list(mesh.key.call().get(60).values())}), flush=True)
pm.stop().get(60)
"""


def run_small_job(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = folder / "small.py"
    script.write_text(SMALL_JOB)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    clean.update(PYTHONPATH=str(ROOT), **env)
    result = subprocess.run(
        [sys.executable, str(script)], env=clean, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[3, 3]"
    return result


def test_monarch_auth_makes_a_key_that_the_procs_get_through_their_environment(
    open_broker, tmp_path
):
    result = run_small_job(tmp_path, {"MONARCH_NATS_URL": open_broker.url, "MONARCH_AUTH": "1"})
    job = json.loads(result.stdout.split("\n")[1])
    assert job["signed"] and len(job["key"]) >= 32
    assert [p["key"] for p in job["procs"]] == [job["key"]] * 2  # the calls worked with it
    assert not any(job["key"] in p["argv"] for p in job["procs"])
    assert OPEN_WARNING not in result.stderr
    assert "dropped" not in result.stderr  # no process of the job refused another's messages


def test_an_open_broker_is_warned_about_once_per_job_unless_allowed(open_broker, tmp_path):
    url = open_broker.url
    warned = run_small_job(tmp_path, {"MONARCH_NATS_URL": url})
    assert warned.stderr.count(OPEN_WARNING) == 1, warned.stderr  # client and 2 procs: once
    assert "MONARCH_OPEN_BROKER_OK=1" in warned.stderr
    allowed = run_small_job(tmp_path, {"MONARCH_NATS_URL": url, "MONARCH_OPEN_BROKER_OK": "1"})
    assert OPEN_WARNING not in allowed.stderr


def test_only_a_broker_without_credentials_counts_as_open(open_broker):
    token_broker = EmbeddedBroker(token="a-token-for-this-test").start()  # the client's kind

    async def requires_auth(url: str) -> bool:
        nc = await nats.connect(url, max_reconnect_attempts=1)
        try:
            return auth.requires_credentials(nc)
        finally:
            await nc.close()

    try:
        assert asyncio.run(requires_auth(token_broker.url)) is True
        assert asyncio.run(requires_auth(open_broker.url)) is False
    finally:
        token_broker.stop()


def test_a_keyed_connection_signs_and_still_hears_the_servers_no_responders(open_broker):
    from monarch.broker.connections.connect import connect
    from monarch.broker.natspy_internals.intake import subscribe_ordered
    from monarch.settings import Settings

    key = secrets.token_urlsafe(24)

    async def scenario():
        keyed = await connect(open_broker.url, Settings(nats_job_key=key), name="keyed")
        raw = await nats.connect(open_broker.url, max_reconnect_attempts=1)
        got: list = []
        inbox = "mon.solo.port.keyed-test.1"  # a namespace nobody else here listens on
        await subscribe_ordered(keyed, inbox, got.append)
        await keyed.flush()
        await raw.publish(inbox, b"forged", headers={"Mon-Kind": "reply"})  # dropped
        await keyed.publish(inbox, b"signed", headers={"Mon-Kind": "reply"})  # taken
        await keyed.publish("mon.solo.act.nobody.0._", b"x", reply=inbox)  # server: 503
        await keyed.flush()
        await raw.flush()
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 2 and time.monotonic() < deadline:  # the 503 is on its way back
            await asyncio.sleep(0.01)
        await raw.close()
        await keyed.close()
        return [((m.headers or {}).get("Status"), m.data) for m in got]

    before = auth.dropped().get("port", 0)
    assert asyncio.run(scenario()) == [(None, b"signed"), ("503", b"")]
    assert auth.dropped().get("port", 0) == before + 1


AGENT_CLIENT = """
import time
from monarch.actor import attach_to_workers
from tests.hosts.host_actors import Where

procs = attach_to_workers(workers=[AGENT_UID], timeout=30).spawn_procs(per_host={"gpus": 1})
where = procs.spawn("where", Where)
first = where.where.call_one().get(timeout=60)["pid"]
time.sleep(4 * 1.0)  # four heartbeat timeouts: the agent's and the proc's beats must count
again = where.where.call_one().get(timeout=60)["pid"]
print("same" if first == again else "changed", flush=True)
procs.stop().get(timeout=60)
"""


def test_with_a_job_key_a_host_agent_and_its_procs_are_believed(tmp_path):
    """An agent signs with the key from its operator's environment: its registry answers,
    the procs it starts and all their heartbeats are accepted (a silent host would be lost
    after one heartbeat timeout). A broker of its own: no other job's traffic to drop."""
    from tests.hosts.agents import start_agent

    broker = EmbeddedBroker().start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(
        MONARCH_NATS_URL=broker.url,
        MONARCH_NATS_JOB_KEY=secrets.token_urlsafe(24),
        MONARCH_HEARTBEAT_INTERVAL="0.2",
        MONARCH_HEARTBEAT_TIMEOUT="1.0",
    )
    agent = start_agent(f"keyed-{secrets.token_hex(3)}", env=env).wait_ready()
    try:
        script = tmp_path / "client.py"
        script.write_text(AGENT_CLIENT.replace("AGENT_UID", repr(agent.uid)))
        result = subprocess.run(
            [sys.executable, str(script)], env=dict(env, PYTHONPATH=str(ROOT)),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        agent.stop()
        broker.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["same"]
    assert "no Mon-Auth" not in result.stderr and "wrong tag" not in result.stderr
