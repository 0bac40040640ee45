"""Chaos: procs SIGKILLed under traffic are respawned by their owners, and nothing is lost.

Four ``ChaosOwner`` actors (one proc mesh of 4) each own a child proc with two
``ChaosWorker`` actors: 8 workers on 4 procs. Client threads keep calls
(``call_one`` through an owner to one worker), gathers (``call`` on all four
owners, each calling both its workers) and broadcasts running while the test
SIGKILLs a randomly chosen worker proc 20 times, one at a time, waiting for
its owner's ``__supervise__`` to put a fresh proc in its place before the
next kill. Then it checks that

* every kill reached its owner (two ``proc_died`` failures per kill, one for
  each mesh on the proc, and one respawn per kill, on the owner whose proc
  was killed), and nothing reached the root;
* no call hung: every call is bounded and either succeeded or raised a
  supervision error (directly, or as ``ActorError`` from the owner);
* no process outlived its role: each killed pid is gone, and after the stop
  every pid the test saw is gone and nothing new is left running;
* every acknowledged id was handled exactly once, and no id twice.

Randomness (which proc, when, which worker) comes from seeded generators.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import signal
import threading
import time
from functools import partial
from pathlib import Path

from monarch.actor import ActorError, SupervisionError, this_host
from tests.helpers import descendants, pid_alive, wait_until
from tests.reliability.chaos_actors import WORKERS_PER_PROC, ChaosOwner

SEED = int(os.environ.get("MONARCH_CHAOS_SEED", "20240609"))
OWNERS = 4
KILLS = 20
CALL_TIMEOUT = 30.0  # any call slower than this counts as hung
INNER_TIMEOUT = 20.0  # an owner's own calls to its workers


class Traffic:
    """Client threads sending calls, gathers and broadcasts until stopped."""

    def __init__(self, owners, seed: int) -> None:
        self.owners = owners
        self.seed = seed
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: list[str] = []  # ids whose call returned successfully
        self.failed: list[str] = []  # ids whose call raised an allowed error
        self.sent_broadcast: list[str] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.hung: list[str] = []
        self.unexpected: list[str] = []
        self.calls = collections.Counter()  # (kind, outcome) -> n
        self.threads = [
            threading.Thread(target=self._calls, args=(i,), name=f"chaos-call-{i}")
            for i in range(2)
        ]
        self.threads.append(threading.Thread(target=self._gathers, name="chaos-gather"))
        self.threads.append(threading.Thread(target=self._broadcasts, name="chaos-bcast"))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> list[str]:
        """Stop and join; returns the names of threads that did not end (hung)."""
        self.stop.set()
        deadline = time.monotonic() + CALL_TIMEOUT + 10
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _outcome(self, kind: str, ids: list[str], send, *args) -> None:
        try:
            send(*args).get(timeout=CALL_TIMEOUT)
        except TimeoutError:
            with self.lock:
                self.hung.extend(ids)
                self.calls[kind, "hung"] += 1
            return
        except Exception as e:
            allowed = _allowed(e)
            with self.lock:
                self.failed.extend(ids)
                self.errors[_describe(e)] += 1
                self.calls[kind, "failed"] += 1
                if not allowed:
                    self.unexpected.append(f"{kind} {ids[0]}: {e!r}")
            return
        with self.lock:
            self.ok.extend(ids)
            self.calls[kind, "ok"] += 1

    def _calls(self, thread: int) -> None:
        rng = random.Random(self.seed * 100 + thread)
        for n in itertools.count():
            if self.stop.is_set():
                return
            rank, worker = rng.randrange(OWNERS), rng.randrange(WORKERS_PER_PROC)
            msg_id = f"c{thread}-{n}"
            owner = self.owners.slice(gpus=rank)
            self._outcome("call", [msg_id], owner.call.call_one, msg_id, worker)

    def _gathers(self) -> None:
        for n in itertools.count():
            if self.stop.is_set():
                return
            base = f"g-{n}"
            ids = [f"{base}.r{r}.w{w}" for r in range(OWNERS) for w in range(WORKERS_PER_PROC)]
            self._outcome("gather", ids, self.owners.call_all.call, base)

    def _broadcasts(self) -> None:
        rng = random.Random(self.seed * 100 + 99)
        for n in itertools.count():
            if self.stop.is_set():
                return
            base = f"b-{n}"
            try:
                self.owners.note.broadcast(base)  # owners never die: this must not fail
            except Exception as e:
                with self.lock:
                    self.unexpected.append(f"broadcast {base}: {e!r}")
                return
            with self.lock:
                self.sent_broadcast.extend(
                    f"{base}.r{r}.w{w}" for r in range(OWNERS) for w in range(WORKERS_PER_PROC)
                )
            time.sleep(rng.uniform(0.002, 0.01))


def _allowed(e: BaseException) -> bool:
    """A supervision error, at the client or raised by the owner's call to its worker."""
    if isinstance(e, SupervisionError):
        return True
    return isinstance(e, ActorError) and isinstance(e.exception, SupervisionError)


def _describe(e: BaseException) -> str:
    if isinstance(e, ActorError):
        return f"ActorError({type(e.exception).__name__})"
    return type(e).__name__


def _handled_ids(log_dir: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for f in log_dir.glob("*.ids"):
        counts.update(line for line in f.read_text().splitlines() if line)
    return counts


def _state(owners, rank: int) -> dict:
    return owners.slice(gpus=rank).state.call_one().get(timeout=CALL_TIMEOUT)


def _respawned(owners, rank: int, kills: int) -> bool:
    return _state(owners, rank)["respawns"] == kills


def test_killed_procs_are_respawned_by_their_owners_and_nothing_acknowledged_is_lost(
    nats_url, tmp_path, root_faults
):
    rng = random.Random(SEED)
    log_dir = tmp_path / "ids"
    log_dir.mkdir()
    before = descendants()
    started = time.monotonic()

    owner_procs = this_host().spawn_procs(per_host={"gpus": OWNERS})
    owners = owner_procs.spawn("chaos_owner", ChaosOwner, str(log_dir), INNER_TIMEOUT)
    states = [_state(owners, r) for r in range(OWNERS)]
    owner_pids = [s["owner_pid"] for s in states]
    traffic = Traffic(owners, SEED)
    kills_per_owner = collections.Counter()
    killed: list[int] = []
    stuck: list[str] = []
    try:
        traffic.start()
        for _ in range(KILLS):
            rank = rng.randrange(OWNERS)
            before_kill = _state(owners, rank)
            time.sleep(rng.uniform(0.05, 0.3))  # let traffic reach the proc first
            os.kill(before_kill["pid"], signal.SIGKILL)
            killed.append(before_kill["pid"])
            kills_per_owner[rank] += 1
            assert wait_until(lambda: not pid_alive(killed[-1]), timeout=10), (
                f"killed proc {killed[-1]} is still there"
            )
            assert wait_until(partial(_respawned, owners, rank, kills_per_owner[rank]), 30, 0.05), (
                f"owner {rank} did not respawn its proc after kill {len(killed)}"
            )
        time.sleep(0.3)  # some traffic on the last generation too
    finally:
        stuck = traffic.finish()
        try:
            final = [_state(owners, r) for r in range(OWNERS)]
        finally:
            owner_procs.stop().get(timeout=60)

    seen_pids = set(owner_pids) | {p for s in final for p in s["pids"]}
    leftovers = wait_until(lambda: not (descendants() - before), timeout=15)
    handled = _handled_ids(log_dir)

    supervised = [f for s in final for f in s["supervised"]]
    respawns = [s["respawns"] for s in final]
    ok, failed = traffic.ok, traffic.failed
    ok_counts = collections.Counter(handled[i] for i in ok)
    failed_counts = collections.Counter(handled[i] for i in failed)
    sent = set(ok) | set(failed) | set(traffic.hung) | set(traffic.sent_broadcast)
    broadcast_handled = sum(1 for i in traffic.sent_broadcast if handled[i])
    print(
        f"\nchaos (seed {SEED}, {time.monotonic() - started:.1f} s): kills {len(killed)} "
        f"(per owner {dict(sorted(kills_per_owner.items()))}), supervise calls "
        f"{len(supervised)}, respawns {sum(respawns)} {respawns}\n"
        f"  calls: {dict(sorted((f'{k}/{o}', n) for (k, o), n in traffic.calls.items()))}\n"
        f"  errors: {dict(traffic.errors)}\n"
        f"  ids: acknowledged {len(ok)} (handled once: {ok_counts[1]}), failed {len(failed)} "
        f"(handled 0x: {failed_counts[0]}, 1x: {failed_counts[1]}), broadcast "
        f"{len(traffic.sent_broadcast)} (handled {broadcast_handled}), "
        f"ids in worker files {sum(handled.values())} ({len(handled)} distinct)\n"
        f"  pids seen {len(seen_pids)}, files {len(list(log_dir.glob('*.ids')))}"
    )

    # Every failure reached its owner, and only its owner.
    assert len(killed) == KILLS
    assert sum(respawns) == KILLS
    assert respawns == [kills_per_owner[r] for r in range(OWNERS)]
    assert len(supervised) == WORKERS_PER_PROC * KILLS
    assert {reason for _, reason, _ in supervised} == {"proc_died"}
    assert root_faults.failures == []
    # No call hung, and every failure was a supervision error.
    assert not stuck, f"traffic threads still running: {stuck}"
    assert traffic.hung == []
    assert traffic.unexpected == []
    assert traffic.calls["call", "ok"] > 0 and traffic.calls["gather", "ok"] > 0
    # No process is left: killed ones went at once, the rest with the stop.
    assert not any(pid_alive(p) for p in killed)
    assert not [p for p in seen_pids if pid_alive(p)]
    assert leftovers, f"left running: {sorted(descendants() - before)}"
    # Exactly once for what was acknowledged; never twice; nothing unknown.
    assert set(ok_counts) == {1}, {i: handled[i] for i in ok if handled[i] != 1}
    assert max(handled.values()) == 1, [i for i, n in handled.items() if n > 1]
    assert set(handled) <= sent, sorted(set(handled) - sent)[:10]
