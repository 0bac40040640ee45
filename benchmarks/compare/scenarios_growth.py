"""Growth curves on the Monarch actor API: run with our package or the real Monarch.

    python benchmarks/compare/scenarios_growth.py [--procs 1,2,4] [--actors 4,8] [--quick]

One invocation is one run of two sweeps; ``benchmarks/bench_growth_compare.py``
starts it several times per framework (each in its own venv, like run.py) and
takes medians. Uses only the public ``monarch.actor`` API, so one script serves
both packages ("ours" or "monarch" in every result line):

* **procs**: for P in ``--procs``, a fresh ``spawn_procs(per_host={"gpus": P})``
  with one ``Echo`` actor per proc;
* **actors**: for N in ``--actors``, fresh 8 procs (``--actor-procs``) holding
  N actors: N/8 meshes of 8 (or one mesh on a slice of N procs when N < 8).
  A Monarch actor mesh has one actor per proc, so more actors per proc are
  more meshes.

Per point: ``spawn`` (procs sweep: spawn_procs + spawn + one gathered call
answered by every actor; actors sweep: spawning the N actors on procs already
up, until each mesh answered one gathered call), ``gather`` (median of
``--rounds`` rounds, each one ``call`` to every mesh and waiting for all N
replies), ``fire`` (seconds per 10,000 messages to the whole mesh: each message
is one ``broadcast`` per mesh, then one gathered call waits until all are
handled, per-sender ordering; above 32 actors fewer messages are sent, at
most 320,000 deliveries as at 32 procs, the time scaled up to 10,000), and memory: PSS (``/proc/<pid>/smaps_rollup``, so
pages shared with a zygote count once) of the procs themselves (the pids the
actors report) and of every process the run added (the client's descendants
and the procs, less what was there before: broker, zygote, Monarch's host
processes). Prints JSON lines (see _common.py).

``--layout per_proc`` (ours only): the N actors are one mesh,
``procs.per_proc(actors=N/P)``, so a broadcast is one call whose replies leave
each proc as one message (``ProcMesh.per_proc``; Monarch 0.7 has no such layout);
it adds ``reduce``: the sum of all N replies by an ``Accumulator`` given a reducer,
merged on each proc before it travels (``monarch.actors.hosting.reduce``).
``--layout per_proc_async``: the same with ``async def`` endpoints (``AsyncEcho``):
such actors run on their proc's loop, share one subscription per proc for what the
whole group hears, and read a broadcast's arguments once per proc
(``monarch.actors.hosting.group_fanout``); ``Echo``'s sync endpoints give each
actor a thread of its own.

``--varz URL[,URL]`` (ours only, where the driver started the broker with HTTP
monitoring: ``benchmarks/bench_scale.py``): the brokers' own counters
(``/varz``, summed over the nodes) before and after the timed gather rounds
and over an idle window, so the model of docs/scale.md is checked against what
the servers counted: messages and bytes in and out per broadcast-and-gather
round, subscriptions and connections, and messages per second while idle
(heartbeats).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import operator
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from _common import Reporter, percentile

import monarch.actor
from monarch.actor import Actor, endpoint, shutdown_context, this_host

REAL = importlib.util.find_spec("monarch._rust_bindings") is not None
FRAMEWORK = "monarch" if REAL else "ours"
TIMEOUT = 120.0  # seconds; a single wait longer than this fails the point
FIRE_FULL = 10_000  # messages to the whole mesh per point
FIRE_CAP_ACTORS = 32  # above this many actors, fewer messages (time scaled to FIRE_FULL)
SETTLE = 8.0  # seconds of idling after the runtime starts, before the first point
IDLE_WINDOW = 5.0  # seconds of idle broker traffic counted per point (--varz)
VARZ_FIELDS = ("in_msgs", "out_msgs", "in_bytes", "out_bytes")


class Echo(Actor):
    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncEcho(Actor):
    """``Echo`` with async endpoints (``--layout per_proc_async``)."""

    @endpoint
    async def ping(self, x):
        return x

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def ignore_fault(failure) -> None:
    """A proc that dies while a mesh is stopped must not end the run."""


# -- memory ------------------------------------------------------------------------


def pss_kb(pid: int) -> int:
    """Proportional set size of ``pid`` in KiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def parents() -> dict[int, int]:
    """pid -> parent pid of every process we can see."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def family(roots: set[int]) -> set[int]:
    """``roots`` and all their descendants (procs may be children of a zygote or host)."""
    ppid = parents()
    found = {r for r in roots if r in ppid}
    grew = True
    while grew:
        more = {p for p, pp in ppid.items() if pp in found} - found
        found |= more
        grew = bool(more)
    return found


def wait_gone(pids: set[int], timeout: float = 10.0) -> None:
    """Until stopped procs have exited, so the next point's memory is its own."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)


# -- the brokers' counters (--varz) -------------------------------------------------


def varz(urls: list[str]) -> dict:
    """/varz of every node, the counters summed; ``subscriptions``/``connections`` too."""
    total: dict = {}
    for url in urls:
        with urllib.request.urlopen(f"{url.rstrip('/')}/varz", timeout=10) as r:
            v = json.load(r)
        for k in (*VARZ_FIELDS, "subscriptions", "connections", "slow_consumers"):
            total[k] = total.get(k, 0) + int(v.get(k, 0))
    return total


def varz_figures(before: dict, after: dict, per: float, prefix: str) -> dict:
    return {f"{prefix}{k}": (after[k] - before[k]) / per for k in VARZ_FIELDS}


# -- measuring one point ------------------------------------------------------------


def measure(
    meshes: list, n_actors: int, rounds: int, fire: int, urls: list[str], reduce: bool = False
) -> dict:
    """gather and fire figures over ``meshes`` (all actors already answered once);
    ``reduce``: also the sum of one mesh's replies merged on the procs (:func:`reduce_rounds`)."""
    for i in range(min(rounds, 10)):  # warm-up
        for f in [m.ping.call(i) for m in meshes]:
            f.get(TIMEOUT)
    lat = []
    counted = varz(urls) if urls else None
    for i in range(rounds):
        t = time.perf_counter()
        for f in [m.ping.call(i) for m in meshes]:
            f.get(TIMEOUT)
        lat.append(time.perf_counter() - t)
    lat.sort()
    out = {"gather": percentile(lat, 0.5), "gather_p99": percentile(lat, 0.99)}
    if reduce:
        out.update(reduce_rounds(meshes[0], rounds))
    if counted is not None:
        # per round; idle traffic (heartbeats) of the rounds' seconds is in it too
        after = varz(urls)
        out.update(varz_figures(counted, after, rounds, "round_"))
        out["subscriptions"] = after["subscriptions"]
        out["connections"] = after["connections"]
        out["slow_consumers"] = after["slow_consumers"]
        out["round_seconds"] = sum(lat) / rounds
        time.sleep(1.0)  # the rounds' last replies and flushes pass
        idle = varz(urls)
        time.sleep(IDLE_WINDOW)
        out.update(varz_figures(idle, varz(urls), IDLE_WINDOW, "idle_per_s_"))
    try:
        out["fire"] = fire_time(meshes, n_actors, fire)
    except Exception as e:  # reported; the point's other figures still count
        print(f"[{FRAMEWORK}] fire-and-forget, {n_actors} actors: {e!r}", file=sys.stderr)
        out["fire_failed"] = 1
    return out


def reduce_rounds(mesh, rounds: int) -> dict:
    """``--layout per_proc`` (ours): the sum of every actor's reply by an ``Accumulator``
    given a reducer, so each proc's replies are merged there (``reduce``, p50 and p99)."""
    summed = monarch.actor.Accumulator(mesh.ping, 0, operator.add, reducer=operator.add)
    want = len(mesh)
    for _ in range(min(rounds, 10)):  # warm-up
        summed.accumulate(1).get(TIMEOUT)
    lat = []
    for _ in range(rounds):
        t = time.perf_counter()
        got = summed.accumulate(1).get(TIMEOUT)
        lat.append(time.perf_counter() - t)
        if got != want:
            raise AssertionError(f"the merged sum is {got}, not {want}")
    lat.sort()
    return {"reduce": percentile(lat, 0.5), "reduce_p99": percentile(lat, 0.99)}


def fire_time(meshes: list, n_actors: int, fire: int) -> float:
    """Seconds per FIRE_FULL messages, each one broadcast to every mesh."""
    msgs = fire if n_actors <= FIRE_CAP_ACTORS else max(1, fire * FIRE_CAP_ACTORS // n_actors)
    t = time.perf_counter()
    for i in range(msgs):
        for m in meshes:
            m.ping.broadcast(i)
    for f in [m.ping.call(-1) for m in meshes]:
        f.get(TIMEOUT)
    return (time.perf_counter() - t) * FIRE_FULL / msgs


def memory(base_mesh, before: set[int]) -> tuple[dict, set[int]]:
    """PSS of the procs (pids their actors report) and of everything the run added."""
    proc_pids = {int(p) for p in base_mesh.pid.call().get(TIMEOUT).values()}
    added = family({os.getpid()} | proc_pids) - before - {os.getpid()}
    procs_kb = [pss_kb(p) for p in proc_pids]
    return {
        "pss_proc_mb": statistics.fmean(procs_kb) / 1024,
        "pss_procs_total_mb": sum(procs_kb) / 1024,
        "pss_added_mb": sum(pss_kb(p) for p in added | proc_pids) / 1024,
        "n_added": len(added | proc_pids),
    }, proc_pids


def emit_point(rep: Reporter, sweep: str, x: int, figures: dict) -> None:
    units = {"spawn": "s", "gather": "s", "gather_p99": "s", "fire": "s", "n_added": "processes",
             "reduce": "s", "reduce_p99": "s",
             "fire_failed": "", "round_seconds": "s", "subscriptions": "", "connections": "",
             "slow_consumers": ""}  # fmt: skip
    for name, value in figures.items():
        unit = units.get(name, "MB")
        if name.startswith(("round_", "idle_per_s_")) and name != "round_seconds":
            unit = "bytes" if name.endswith("bytes") else "messages"
        rep.emit(f"{sweep}:{x}", name, value, unit, sweep=sweep, x=x)


def procs_point(rep: Reporter, p: int, args: argparse.Namespace, before: set[int]) -> None:
    t = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"gpus": p})
    mesh = procs.spawn("grow", Echo)
    mesh.ping.call(0).get(TIMEOUT)
    figures = {"spawn": time.perf_counter() - t}
    figures.update(measure([mesh], p, args.rounds, args.fire, args.varz))
    mem, pids = memory(mesh, before)
    figures.update(mem)
    procs.stop().get(TIMEOUT)
    wait_gone(pids)
    emit_point(rep, "procs", p, figures)


def actors_point(rep: Reporter, n: int, args: argparse.Namespace, before: set[int]) -> None:
    width = args.actor_procs
    procs = this_host().spawn_procs(per_host={"gpus": width})
    base = procs.spawn("base", Echo)  # the procs are up, and tell their pids
    base.ping.call(0).get(TIMEOUT)
    t = time.perf_counter()
    if n < width:
        meshes = [procs.slice(gpus=slice(0, n)).spawn("grow0", Echo)]
    elif args.layout.startswith("per_proc"):  # ours: one mesh, n/width actors in each proc
        cls = AsyncEcho if args.layout == "per_proc_async" else Echo
        meshes = [procs.per_proc(actors=n // width).spawn("grow", cls)]
    else:
        meshes = [procs.spawn(f"grow{i}", Echo) for i in range(n // width)]
    for f in [m.ping.call(0) for m in meshes]:
        f.get(TIMEOUT)
    figures = {"spawn": time.perf_counter() - t}
    per_proc = args.layout.startswith("per_proc") and n >= width
    figures.update(measure(meshes, n, args.rounds, args.fire, args.varz, reduce=per_proc))
    mem, pids = memory(base, before)
    figures.update(mem)
    procs.stop().get(TIMEOUT)
    wait_gone(pids)
    emit_point(rep, "actors", n, figures)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,2,4,8,16,32", help="procs sweep sizes ('' = none)")
    ap.add_argument("--actors", default="4,8,16,32,64,128,256,512", help="actors sweep sizes")
    ap.add_argument("--actor-procs", type=int, default=8, help="procs of the actors sweep")
    ap.add_argument("--rounds", type=int, default=50, help="broadcast-and-gather rounds")
    ap.add_argument("--fire", type=int, default=FIRE_FULL, help="fire-and-forget messages")
    ap.add_argument("--results", help="also append the result lines to this file")
    ap.add_argument("--varz", default="", help="brokers' HTTP monitor URLs (ours; see above)")
    ap.add_argument("--layout", choices=("meshes", "per_proc", "per_proc_async"),
                    default="meshes",
                    help="N actors as N/P meshes of P (both), or one per_proc mesh (ours; "
                         "per_proc_async: its endpoints async)")  # fmt: skip
    args = ap.parse_args()
    args.skip = set()
    args.varz = [u for u in args.varz.split(",") if u.strip()]
    rep = Reporter(FRAMEWORK, args)
    dist = "torchmonarch" if REAL else "monarch-nats"
    rep.info(version=importlib.metadata.version(dist), python=sys.version.split()[0])
    monarch.actor.unhandled_fault_hook = ignore_fault
    # The runtime (our broker and zygote, Monarch's local host) starts with the first
    # spawn; a throw-away 1-proc mesh starts it, so no point pays for it and `before`
    # holds those processes.
    warm = this_host().spawn_procs(per_host={"gpus": 1})
    warm_mesh = warm.spawn("warm", Echo)
    warm_pid = warm_mesh.pid.call_one().get(TIMEOUT)
    warm.stop().get(TIMEOUT)
    wait_gone({warm_pid})
    # What a runtime does once idle happens now, not during the first points: ours
    # forks its torch zygote, which imports torch for ~2 s of CPU (it would load the
    # 2- and 4-proc points and, appearing after `before`, count as added memory).
    # Both frameworks wait the same.
    time.sleep(SETTLE)
    before = family({os.getpid()})
    rep.info(runtime_processes=len(before) - 1,
             runtime_pss_mb=sum(pss_kb(p) for p in before - {os.getpid()}) / 1024)  # fmt: skip
    sizes = [("procs", int(x), procs_point) for x in args.procs.split(",") if x.strip()]
    sizes += [("actors", int(x), actors_point) for x in args.actors.split(",") if x.strip()]
    failed: set[str] = set()
    for sweep, x, point in sizes:
        if sweep in failed:
            continue  # a point that failed (memory, time) ends its sweep
        if not rep.run(f"{sweep}:{x}", lambda: point(rep, x, args, before)):  # noqa: B023
            failed.add(sweep)
            continue
        print(f"[{FRAMEWORK}] {sweep} {x} done", file=sys.stderr, flush=True)
    shutdown_context().get(30)


if __name__ == "__main__":
    main()
