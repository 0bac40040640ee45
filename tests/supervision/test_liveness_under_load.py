"""Liveness does not depend on what a proc's event loop is busy with.

Each scenario runs as a client script of its own, so that it can have its own
MONARCH_HEARTBEAT_TIMEOUT (the session's client keeps the default), against
the session's broker, while CPU load that the test makes itself (busy-loop
processes, bounded in time and killed at the end) competes for the machine.
A script that ends with status 0 and prints its result had no proc declared
dead: an unhandled failure runs the default fault hook, which ends the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from monarch.broker.connections.connect import connect
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.vocabulary import subjects
from monarch.settings import settings
from monarch.supervision import watcher as watcher_module
from monarch.supervision.heartbeat import QUIET, STALL, Heartbeater
from monarch.supervision.watcher import Watcher
from tests import helpers
from tests.helpers import run_in_own_loop

ROOT = Path(__file__).resolve().parents[2]

# Each test loads the machine on purpose, or times heartbeats on it: nothing beside it.
pytestmark = pytest.mark.alone


@contextlib.contextmanager
def cpu_load(processes: int | None = None, seconds: float = 60.0):
    """``processes`` busy loops (default: one more than there are cores, at most 8),
    each ending by itself after ``seconds``; killed on exit."""
    if processes is None:
        processes = min(8, (os.cpu_count() or 2) + 1)
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n pass"
    hogs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=10)


run_client = helpers.run_client


def test_tensor_argument_to_init_of_a_4_proc_mesh_under_load_kills_no_proc(tmp_path, nats_url):
    """The issue's case: four fresh procs decode a tensor at once on a loaded machine.

    Forked before their zygote had time to import torch, each imports it while
    decoding its ``__init__`` argument: seconds of CPU on its event loop, which
    used to silence its heartbeats past the (default, 3 s) timeout.
    """
    body = """
        import torch
        from monarch.actor import Actor, endpoint, this_host

        class Holder(Actor):
            def __init__(self, t):
                self.t = t

            @endpoint
            def total(self) -> float:
                return float(self.t.sum()) + 1.0

        procs = this_host().spawn_procs(per_host={"gpus": 4})
        holders = procs.spawn("holder", Holder, torch.zeros(10))
        print(sorted(holders.total.call().get(timeout=120).values()), flush=True)
        procs.stop().get(timeout=60)
    """
    with cpu_load():
        rc, out, err = run_client(tmp_path, body, MONARCH_HEARTBEAT_TIMEOUT="3")
    assert rc == 0, f"the job died:\n{out}\n{err}"
    assert out.strip() == "[1.0, 1.0, 1.0, 1.0]"
    assert "Unhandled monarch failure" not in err


# Stands in for torch: importing it holds the GIL for HOLD seconds in one C call (a
# regular expression that backtracks), the way loading torch's C++ libraries does.
_GIL_HOLDING_TORCH = """
import math, os, re, time

HOLD = float(os.environ["FAKE_TORCH_HOLD"])


def _match(n):
    start = time.perf_counter()
    re.match(r"(a+)+$", "a" * n + "b")  # 2**n steps, all inside the C matcher
    return time.perf_counter() - start


n = 14
while _match(n) < 0.02:
    n += 1
n += max(0, math.ceil(math.log2(HOLD / _match(n))))
HELD = 0.0
while HELD < 0.9 * HOLD:  # a busy machine can make the estimate fall short: hold longer
    HELD = _match(n)
    n += 1
"""


# A client whose two procs import torch (the stand-in) at their first call.
_IMPORTERS = """
    from monarch.actor import Actor, endpoint, this_host

    class Importer(Actor):
        @endpoint
        async def load(self) -> bool:
            import torch  # on the proc's event loop, as unpickling a tensor does

            return torch.HELD > 2.0  # longer than MONARCH_HEARTBEAT_TIMEOUT

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    importers = procs.spawn("importer", Importer)
    print(sorted(importers.load.call().get(timeout=120).values()), flush=True)
    procs.stop().get(timeout=60)
"""


def _stand_in(tmp_path: Path) -> Path:
    """A folder for the front of PYTHONPATH whose ``torch`` is the GIL-holding stand-in."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(_GIL_HOLDING_TORCH)
    return fake


def _run_beside_stand_in(tmp_path: Path, body: str, fake: Path, hold: str) -> tuple[str, str]:
    """Run ``body`` with ``fake`` first on PYTHONPATH, a 1 s heartbeat timeout and the
    stand-in holding the GIL ``hold`` seconds. Checks that the job lived and that no
    heartbeat was missed; returns its stdout (stripped) and stderr."""
    rc, out, err = run_client(
        tmp_path,
        body,
        PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]),
        MONARCH_HEARTBEAT_TIMEOUT="1",
        FAKE_TORCH_HOLD=hold,
    )
    assert rc == 0, f"the job died:\n{out}\n{err}"
    assert "heartbeat" not in err
    return out.strip(), err


def test_importing_torch_that_holds_the_gil_past_the_timeout_kills_no_proc(tmp_path, nats_url):
    """grpo_yield's case: procs import torch on their loop while the machine is busy;
    torch's C++ start-up holds the GIL, so no heartbeat can leave for longer than the
    timeout. Announced beforehand, that silence is allowed: the job lives on."""
    out, _ = _run_beside_stand_in(tmp_path, _IMPORTERS, _stand_in(tmp_path), hold="3")
    assert out == "[True, True]"


def test_an_import_announced_while_the_owner_subscribes_late_kills_no_proc(tmp_path, nats_url):
    """The race behind the case above's rare failure on a loaded machine: the owner's
    thread that hears heartbeats subscribes to the new procs' beats late (held 0.5 s
    here, as a CPU-starved thread is), the first call makes each proc import torch at
    once, and the one beat that announces it would reach nobody; the silence after it
    was taken for a death. The mesh is ready only once those subscriptions are in
    place (Watcher.listening), so the announcement is heard."""
    fake = _late_hearing(tmp_path, ".procs-")  # the owner, about to hear its procs
    out, _ = _run_beside_stand_in(tmp_path, _IMPORTERS, fake, hold="2.5")
    assert out == "[True, True]"


def _late_hearing(tmp_path: Path, marker: str) -> Path:
    """A folder for the front of PYTHONPATH: the GIL-holding stand-in for torch, and a
    sitecustomize (so every process of the job loads it) that holds a thread that
    hears heartbeats 0.5 s, as a CPU-starved one is, before it subscribes to
    heartbeat subjects containing ``marker`` (once per subject)."""
    fake = _stand_in(tmp_path)
    site = f"""
        import time
        from monarch.supervision import heartbeat

        subscribe = heartbeat.Heartbeater._sync_heard
        held = set()

        async def late_subscribe(self):
            with self._lock:
                new = {{s for s in set(self._heard) - set(self._nc_subs) if {marker!r} in s}}
            if self._nc is not None and new - held:  # when it really subscribes
                held.update(new)
                time.sleep(0.5)
            await subscribe(self)

        heartbeat.Heartbeater._sync_heard = late_subscribe
    """
    (fake / "sitecustomize.py").write_text(textwrap.dedent(site))
    return fake


def test_an_owner_importing_torch_once_its_procs_are_ready_loses_none(tmp_path, nats_url):
    """The other direction: each proc's thread that hears its owner's heartbeats
    subscribes late (held 0.5 s, by a sitecustomize every process of the job loads),
    and the owner imports torch as soon as its procs are ready. A proc says ready only
    once its subscription is in place, so it hears the announcement and does not take
    the silence that follows for its owner's death (it would exit: "owner gone")."""
    fake = _late_hearing(tmp_path, ".client-")  # a proc, about to hear its owner
    body = """
        from monarch.actor import Actor, endpoint, this_host

        class Pinger(Actor):
            @endpoint
            def ping(self) -> str:
                return "pong"

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        pingers = procs.spawn("pinger", Pinger)
        procs.initialized.get(timeout=60)
        import torch  # the owner's GIL held 2.5 s, announced first (a stand-in: not a tensor
        # library, so spawn before it)

        print(sorted(pingers.ping.call().get(timeout=60).values()), torch.HELD > 2.0, flush=True)
        procs.stop().get(timeout=60)
    """
    out, err = _run_beside_stand_in(tmp_path, body, fake, hold="2.5")
    assert out == "['pong', 'pong'] True"
    assert "owner" not in err


def test_procs_spawned_on_from_a_received_proc_mesh_are_heard_from_the_start(
    tmp_path, nats_url
):
    """An actor that received a proc mesh (a reference, owned by the client) spawns
    importers on it, and their first call makes each proc import torch; the actor's
    process watches those procs too, and its hearing thread subscribes late. The
    received mesh is ready only once that subscription is in place, so the actor's
    process hears the announcement and its calls do not fail ("proc ... is gone")."""
    fake = _late_hearing(tmp_path, ".procs-")
    body = """
        from monarch.actor import Actor, endpoint, this_host

        class Importer(Actor):
            @endpoint
            async def load(self) -> bool:
                import torch  # on the proc's event loop, at once

                return torch.HELD > 2.0

        class Spawner(Actor):
            @endpoint
            def load_on(self, procs) -> list:
                importers = procs.spawn("importer", Importer)
                return sorted(importers.load.call().get(timeout=120).values())

        spawner = this_host().spawn_procs(per_host={"gpus": 1}).spawn("spawner", Spawner)
        workers = this_host().spawn_procs(per_host={"gpus": 2})
        workers.initialized.get(timeout=60)
        print(spawner.load_on.call_one(workers).get(timeout=120), flush=True)
    """
    out, _ = _run_beside_stand_in(tmp_path, body, fake, hold="2.5")
    assert out == "[True, True]"


def test_blocked_event_loop_is_reported_as_stalled_not_dead(tmp_path, nats_url):
    """An async endpoint that blocks its proc's loop for 2.5 timeouts: the call
    completes, the proc lives on (and did not declare its owner dead either),
    and the owner's watcher reported a stalled loop for that proc."""
    body = """
        import json
        import time
        from monarch.actor import Actor, context, endpoint, this_host
        from monarch.core.process_runtime import runtime
        from monarch.actors.hosting.supervisor import supervisor_of

        class Blocker(Actor):
            @endpoint
            async def block(self, seconds: float) -> str:
                time.sleep(seconds)  # blocks the proc's event loop, on purpose
                return "done"

            @endpoint
            async def where(self) -> str:
                return context().actor_instance.proc_uid

        watcher = supervisor_of(runtime()).watcher
        stalls = []
        watcher.stall_listeners.append(lambda uid, seconds: stalls.append([uid, seconds]))
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        blocker = procs.spawn("blocker", Blocker)
        uid = blocker.where.call_one().get(timeout=60)
        result = blocker.block.call_one(2.5 * watcher.timeout).get(timeout=60)
        deadline = time.monotonic() + 10
        while uid in watcher.stalls and time.monotonic() < deadline:
            time.sleep(0.05)
        after = blocker.where.call_one().get(timeout=60)  # alive and serving
        print(json.dumps({
            "uid": uid, "result": result, "after": after, "stalls": stalls,
            "still_stalled": uid in watcher.stalls, "dead": watcher.is_dead(uid),
            "timeout": watcher.timeout,
        }), flush=True)
        procs.stop().get(timeout=60)
    """
    with cpu_load(2):
        rc, out, err = run_client(tmp_path, body, MONARCH_HEARTBEAT_TIMEOUT="1")
    assert rc == 0, f"the job died:\n{out}\n{err}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["timeout"] == 1.0
    assert report["result"] == "done" and report["after"] == report["uid"]
    assert not report["dead"]
    assert [uid for uid, _ in report["stalls"]] == [report["uid"]]
    assert report["stalls"][0][1] > report["timeout"]
    assert not report["still_stalled"]  # it turns again, and the watcher noticed


def test_watcher_reports_a_stall_once_and_still_declares_silence_dead(nats_url):
    """Heartbeats saying "my loop is stuck" keep a process alive (one stall report);
    once they stop, it is declared dead as before: a stall never hides a death."""

    async def scenario():
        nc = await connect(nats_url, settings(), name="test-stall-watcher")
        try:
            watcher = Watcher(nc, "default", 1.0, functools.partial(subscribe_ordered, nc))
            stalls: list = []
            deaths: list = []
            watcher.stall_listeners.append(lambda uid, seconds: stalls.append((uid, seconds)))
            uid = f"stuck-{secrets.token_hex(4)}"
            await watcher.watch(uid, lambda _, why: deaths.append(why))
            for i in range(20):  # 2 s (two timeouts) of "alive, loop stalled 2.0 s, 2.1 s, ..."
                headers = {"Mon-Kind": "alive", STALL: f"{2.0 + i / 10:.1f}"}
                await nc.publish(subjects.heartbeat("default", uid), b"", headers=headers)
                await asyncio.sleep(0.1)
            await nc.flush()
            await asyncio.sleep(0.05)
            assert deaths == [] and stalls == [(uid, 2.0)]
            assert watcher.stalls[uid] > 2.0  # kept up to date while it lasts
            for _ in range(200):  # silence now: bounded wait for the verdict
                if deaths:
                    break
                await asyncio.sleep(0.05)
            assert deaths and "no heartbeat" in deaths[0]
            assert uid not in watcher.stalls and watcher.is_dead(uid)
            await watcher.stop()
        finally:
            await nc.close()

    asyncio.run(scenario())


async def _watch_through_a_heartbeat_thread(  # type: ignore[no-untyped-def]
    nats_url: str, scenario, held_at_watch: float = 0.0, listen: bool = False
) -> list[str]:
    """Run ``scenario(hearing, beat, deaths)``: a watcher (timeout 1 s) that hears one
    uid's beats on a Heartbeater's thread, as every supervisor's does; ``beat(**headers)``
    publishes one of that uid's heartbeats. ``held_at_watch``: the thread is held that
    long as the watch begins; ``listen``: then ``Watcher.listening`` is awaited.
    Returns the reasons it was declared dead."""
    cfg = settings()
    nc = await connect(nats_url, cfg, name="test-hearing-watcher")
    sender = await connect(nats_url, cfg, name="test-hearing-sender")
    own = functools.partial(connect, nats_url, cfg, name="test-hearing-thread")
    hearing = Heartbeater("default", f"hearer-{secrets.token_hex(4)}", 0.2, own)
    watcher = Watcher(nc, "default", 1.0, hearing.listen)
    watcher.follow(hearing, asyncio.get_running_loop())
    hearing.start()
    deaths: list[str] = []
    uid = f"beating-{secrets.token_hex(4)}"

    async def beat(**headers: str) -> None:
        headers = {"Mon-Kind": "alive", **headers}
        await sender.publish(subjects.heartbeat("default", uid), b"", headers=headers)

    try:
        for _ in range(100):  # its connection up (bounded)
            if hearing._nc is not None:
                break
            await asyncio.sleep(0.05)
        if held_at_watch:
            hearing._loop.call_soon_threadsafe(time.sleep, held_at_watch)
        await watcher.watch(uid, lambda _, why: deaths.append(why))
        if listen:
            await watcher.listening([uid])
        await scenario(hearing, beat, deaths)
    finally:
        await watcher.stop()
        await hearing.stop()
        await sender.close()
        await nc.close()
    return deaths


async def _beats_for(beat, seconds: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await beat()
        await asyncio.sleep(0.1)


async def _until_declared(deaths: list[str], seconds: float) -> None:
    end = time.monotonic() + seconds
    while not deaths and time.monotonic() < end:
        await asyncio.sleep(0.05)


def test_a_hearing_thread_kept_from_running_calls_no_silence_but_a_real_one(nats_url, monkeypatch):
    """The thread that hears heartbeats is held for 2.5 timeouts (as busy actor threads
    of a CPU-starved proc keep it from the GIL: a proc of the growth benchmark took
    its owner for dead so, NOTES 32) while the watched uid goes on beating: its beats
    wait in that thread's socket, and that silence is ours, not the uid's. Once the
    beats stop for real, the uid is declared dead as before. (Beating first for longer
    than DEAF_LIMIT timeouts: the thread must keep saying that it reads.)"""
    monkeypatch.setattr(watcher_module, "DEAF_LIMIT", 4)

    async def scenario(hearing, beat, deaths):  # type: ignore[no-untyped-def]
        await _beats_for(beat, 5.0)
        hearing._loop.call_soon_threadsafe(time.sleep, 2.5)  # the thread runs nothing
        await _beats_for(beat, 3.5)
        assert deaths == []  # not while it could not hear, nor after
        silent_from = time.monotonic()
        await _until_declared(deaths, 5.0)
        assert deaths and "no heartbeat" in deaths[0]
        assert time.monotonic() - silent_from < 2.5  # the timeout, and a probe's turns

    assert len(run_in_own_loop(_watch_through_a_heartbeat_thread(nats_url, scenario))) == 1


def test_a_hearing_thread_stuck_for_good_holds_no_verdict_back(nats_url, monkeypatch):
    """Past DEAF_LIMIT timeouts without the hearing thread reading, silence counts
    again: a stuck thread must not make the watcher blind to deaths."""
    monkeypatch.setattr(watcher_module, "DEAF_LIMIT", 2)

    async def scenario(hearing, beat, deaths):  # type: ignore[no-untyped-def]
        await _beats_for(beat, 0.5)
        hearing._loop.call_soon_threadsafe(time.sleep, 6.0)  # stuck, and no beats either
        held_from = time.monotonic()
        await _until_declared(deaths, 5.0)
        assert deaths and "no heartbeat" in deaths[0]
        assert time.monotonic() - held_from < 4.0  # while the thread is still held

    run_in_own_loop(_watch_through_a_heartbeat_thread(nats_url, scenario))


def test_a_watcher_that_listens_hears_the_one_beat_sent_before_a_long_silence(nats_url):
    """The hearing thread is held as the watch begins, so its subscription reaches the
    broker late. ``Watcher.listening`` returns only once the broker holds it: the beat
    sent right after (one announcing a heavy import, as a proc's first call may make it
    send) is heard, and the 2.5 timeouts of silence that follow are allowed."""

    async def scenario(hearing, beat, deaths):  # type: ignore[no-untyped-def]
        await beat(**{QUIET: "60"})
        await asyncio.sleep(2.5)
        assert deaths == []

    run_in_own_loop(
        _watch_through_a_heartbeat_thread(nats_url, scenario, held_at_watch=0.6, listen=True)
    )


def test_a_watcher_starts_its_clock_once_it_can_hear(nats_url):
    """A uid that never beats: silence is counted from when our subscription was in
    place, not from when the watch began (the hearing thread held 0.8 s then), and it
    is still declared dead after the timeout."""

    async def scenario(hearing, beat, deaths):  # type: ignore[no-untyped-def]
        listened = time.monotonic()
        await _until_declared(deaths, 5.0)
        assert deaths and "no heartbeat" in deaths[0]
        assert time.monotonic() - listened > 0.9  # the whole timeout after listening

    run_in_own_loop(
        _watch_through_a_heartbeat_thread(nats_url, scenario, held_at_watch=0.8, listen=True)
    )


def test_procs_forked_once_the_zygote_is_idle_have_torch_already(nats_url):
    """The zygote has torch imported (in its torch zygote) while nobody waits for a
    fork: later procs decode their first tensor without importing anything on
    their event loop."""
    import torch  # noqa: F401  (a test dependency: the zygote imports it when installed)

    from monarch.actor import this_host
    from monarch.actors.procs import zygote_client
    from tests.actors.actors_for_tests import Echo

    zygote = zygote_client._the_zygote
    assert zygote is not None and zygote.popen.poll() is None

    def zygote_has_torch() -> bool:
        if zygote.torch_zygote is None:
            return False
        with open(f"/proc/{zygote.torch_zygote}/maps") as f:
            return "libtorch" in f.read()

    if zygote.torch_zygote is None:
        # A zygote started before this client imported torch (this test run alone) starts
        # its torch zygote only once a spawn has wanted torch: this one, forked without it.
        this_host().spawn_procs(per_host={"gpus": 1}).stop().get(timeout=60)
    assert zygote.torch_ready.wait(timeout=60)  # its import is over (not only begun)
    assert zygote_has_torch()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert "torch" in procs.spawn("mods", Echo).modules.call_one().get(timeout=30)
    finally:
        procs.stop().get(timeout=60)


def test_a_flood_of_messages_to_a_proc_does_not_hide_its_owners_heartbeats(tmp_path, nats_url):
    """A client that broadcasts faster than its procs can read puts seconds of
    messages in each proc's socket. Heartbeats used to arrive on that same
    connection, behind the backlog, so a proc read its owner's beats too late,
    took the owner for dead and exited (code 3); the growth benchmark's
    fire-and-forget at 64 actors did that. They are heard on the heartbeat
    connection now: every message is handled and every proc lives."""
    body = """
        import time
        from monarch.actor import Actor, endpoint, this_host

        class Counter(Actor):
            def __init__(self):
                self.n = 0

            @endpoint
            def bump(self, i: int) -> None:
                self.n += 1

            @endpoint
            def count(self) -> int:
                return self.n

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        meshes = [procs.spawn(f"c{i}", Counter) for i in range(16)]
        for m in meshes:
            m.count.call().get(timeout=60)
        messages = 4000
        start = time.monotonic()
        for i in range(messages):
            for m in meshes:  # alternating subjects: no two in a row may share a batch
                m.bump.broadcast(i)
        counts = [sorted(m.count.call().get(timeout=120).values()) for m in meshes]
        took = time.monotonic() - start
        print(took, flush=True)
        assert counts == [[messages, messages]] * len(meshes), counts
        procs.stop().get(timeout=60)
    """
    rc, out, err = run_client(tmp_path, body, timeout=180, MONARCH_HEARTBEAT_TIMEOUT="1")
    assert rc == 0, f"the job died:\n{out}\n{err}"
    took = float(out.split()[-1])
    # The backlog must have outlasted the timeout, or the test shows nothing.
    assert took > 1.0, f"the messages were handled in {took:.2f} s: no backlog to hide beats"
    assert "is gone" not in err


def test_the_heartbeat_thread_publishes_while_the_event_loop_is_blocked(nats_url: str) -> None:
    """Heartbeater.publish is the process's side channel: it goes out while the loop that
    asked is blocked (what ``monarch stacks`` and ``monarch debug`` rely on)."""

    async def scenario() -> bytes:
        cfg = settings()
        nc = await connect(nats_url, cfg, name="test-side-channel-reader")
        own = functools.partial(connect, nats_url, cfg, name="test-side-channel")
        hb = Heartbeater("default", f"side-{secrets.token_hex(4)}", 0.2, own)
        got: asyncio.Queue = asyncio.Queue()
        subject = f"mon.default.test.side.{secrets.token_hex(4)}"
        sub = await nc.subscribe(subject, cb=got.put)
        hb.start()
        try:
            for _ in range(100):  # its connection up (bounded)
                if hb._nc is not None:
                    break
                await asyncio.sleep(0.05)
            assert hb.publish(subject, b"while blocked", {"Mon-Kind": "test"})
            time.sleep(0.5)  # this loop blocked: the message leaves from the other thread
            msg = await asyncio.wait_for(got.get(), 5)
            return msg.data
        finally:
            await sub.unsubscribe()
            await hb.stop()
            assert not hb.publish(subject, b"after stop")
            await nc.close()

    assert run_in_own_loop(scenario()) == b"while blocked"
