"""Where a ``call_one`` round trip spends its time, and where its tail comes from.

    python benchmarks/bench_call_tail.py [--calls 4000] [--runs 3]
        [--variant NAME=VAR=VALUE[,VAR=VALUE...]]...

For each variant (default: the plain settings, ``busy_poll`` =
``MONARCH_BUSY_POLL_US=1000``, ``heartbeat_5s`` = heartbeats every 5 s, and
``async_endpoint`` = the same echo as an ``async def`` endpoint),
interleaved over ``--runs`` rounds, a fresh client process spawns 4 procs with
an ``Echo`` actor each (as S1 of ``compare/run.py``), idles ``SETTLE`` seconds
(as compare/run.py does, so the runtime's start-up work is over), warms up with 300 calls,
then makes ``--calls`` ``call_one`` round trips to one of them and reports:

* latency percentiles (p50, p90, p99, p99.9, max) and a histogram;
* CPU time per call of every thread of the client, of the callee proc and of
  the broker (``/proc/<pid>/task/*/stat``), so a hand-over that costs CPU shows
  up, and so does a thread that spins;
* garbage collections during the calls, in the client (``gc.callbacks``, with
  the longest pause) and in the callee (``gc.get_stats()`` before and after).

Each run is a subprocess of its own (this file with ``--child``), so settings
read at start (``MONARCH_*``) apply. No assertion: it prints figures for
benchmarks/NOTES.md.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTLE = 8.0  # seconds of idling after the spawn, before the calls
EDGES_US = [0, 300, 400, 500, 600, 700, 800, 1000, 1500, 2000, 3000, 5000, 10000]
DEFAULT_VARIANTS = {
    "plain": {},
    "busy_poll": {"MONARCH_BUSY_POLL_US": "1000"},
    "heartbeat_5s": {"MONARCH_HEARTBEAT_INTERVAL": "5", "MONARCH_HEARTBEAT_TIMEOUT": "30"},
    # The callee's endpoint `async def`: runs on the proc's loop, no hand-over to the
    # actor's thread and back; the difference to plain is what that hand-over costs.
    "async_endpoint": {"BENCH_ASYNC_ECHO": "1"},
}


def thread_cpu_us(pid: int) -> dict[int, float]:
    """CPU time (user + system) of each thread of ``pid``, in microseconds."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) * 1e6 / tick
    return out


def per_call(before: dict[int, float], after: dict[int, float], calls: int) -> list[float]:
    """CPU us per call of each thread that used at least 1 us per call, largest first."""
    used = [(after[t] - before.get(t, 0.0)) / calls for t in after]
    return sorted((round(u) for u in used if u >= 1), reverse=True)


def child(calls: int) -> None:
    from monarch.actor import Actor, endpoint, this_host
    from monarch.actors.client import embedded_broker_url

    class Echo(Actor):
        @endpoint
        def ping(self, x: int) -> int:
            return x

        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def gc_collections(self) -> list[int]:
            return [s["collections"] for s in gc.get_stats()]

    class AsyncEcho(Actor):
        """All endpoints async: the actor runs on the proc's loop, no thread of its own."""

        @endpoint
        async def ping(self, x: int) -> int:
            return x

        @endpoint
        async def pid(self) -> int:
            return os.getpid()

        @endpoint
        async def gc_collections(self) -> list[int]:
            return [s["collections"] for s in gc.get_stats()]

    if os.environ.get("BENCH_ASYNC_ECHO") == "1":  # the async_endpoint variant
        Echo = AsyncEcho  # noqa: N806

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    mesh = procs.spawn("echo", Echo)
    mesh.ping.call(0).get(60)
    one = mesh.slice(gpus=0)
    callee = one.pid.call_one().get(60)
    broker_port = (embedded_broker_url() or "").rsplit(":", 1)[-1]
    broker = None  # the embedded nats-server: our child
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"nats-server" in cmd and ppid == os.getpid():
            broker = int(pid)
    # Measure the steady state: our zygote forks its torch zygote once idle, and that
    # import (~2 s of CPU) must not land in the calls (benchmarks/NOTES.md entry 29).
    time.sleep(SETTLE)
    for i in range(300):
        one.ping.call_one(i).get(60)

    pauses: list[tuple[int, float]] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            on_gc.t = time.perf_counter()  # type: ignore[attr-defined]
        else:
            pauses.append((info["generation"], time.perf_counter() - on_gc.t))  # type: ignore[attr-defined]

    callee_gc = one.gc_collections.call_one().get(60)
    cpu0 = (thread_cpu_us(os.getpid()), thread_cpu_us(callee), broker and thread_cpu_us(broker))
    gc.callbacks.append(on_gc)
    lat = []
    for i in range(calls):
        t = time.perf_counter()
        one.ping.call_one(i).get(60)
        lat.append((time.perf_counter() - t) * 1e6)
    gc.callbacks.remove(on_gc)
    cpu1 = (thread_cpu_us(os.getpid()), thread_cpu_us(callee), broker and thread_cpu_us(broker))
    callee_gc = [b - a for a, b in zip(callee_gc, one.gc_collections.call_one().get(60))]
    procs.stop().get(60)

    lat.sort()
    hist = collections.Counter()
    for x in lat:
        lo = max(e for e in EDGES_US if e <= x)
        hist[lo] += 1
    print(
        json.dumps(
            {
                "p50": lat[len(lat) // 2],
                "p90": lat[int(len(lat) * 0.9)],
                "p99": lat[int(len(lat) * 0.99)],
                "p999": lat[min(len(lat) - 1, int(len(lat) * 0.999))],
                "max": lat[-1],
                "hist": {str(k): hist[k] for k in EDGES_US},
                "cpu_client": per_call(cpu0[0], cpu1[0], calls),
                "cpu_callee": per_call(cpu0[1], cpu1[1], calls),
                "cpu_broker": per_call(cpu0[2], cpu1[2], calls) if broker else [],
                "broker_port": broker_port,
                "gc_client": dict(collections.Counter(g for g, _ in pauses)),
                "gc_client_max_pause_us": max((p for _, p in pauses), default=0.0) * 1e6,
                "gc_callee": callee_gc,
            }
        ),
        flush=True,
    )


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variant", action="append", help="NAME=VAR=VALUE[,VAR=VALUE...]")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.calls)
        return
    variants = dict(map(parse_variant, args.variant)) if args.variant else DEFAULT_VARIANTS
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for run in range(args.runs):
        for name, extra in variants.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
            env.update(extra)
            env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
            proc = subprocess.run(
                [sys.executable, __file__, "--child", "--calls", str(args.calls)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                cwd="/tmp",
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"run {run + 1} {name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(lines[-1])
            results[name].append(r)
            print(
                f"run {run + 1} {name:13s} p50 {r['p50']:6.0f} p90 {r['p90']:6.0f} "
                f"p99 {r['p99']:6.0f} p99.9 {r['p999']:6.0f} max {r['max']:7.0f} us | "
                f"cpu/call client {r['cpu_client']} callee {r['cpu_callee']} "
                f"broker {r['cpu_broker']} | gc client {r['gc_client']} "
                f"(max {r['gc_client_max_pause_us']:.0f} us) callee {r['gc_callee']}",
                flush=True,
            )
    print(f"\nmedians of {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    for name, rs in results.items():
        if not rs:
            continue
        med = {k: statistics.median(r[k] for r in rs) for k in ("p50", "p90", "p99", "p999", "max")}
        hist = {e: statistics.median(r["hist"][str(e)] for r in rs) for e in EDGES_US}
        print(
            f"{name:13s} p50 {med['p50']:6.0f} p90 {med['p90']:6.0f} p99 {med['p99']:6.0f} "
            f"p99.9 {med['p999']:6.0f} max {med['max']:7.0f} us"
        )
        print("  histogram (us from: calls) " + " ".join(f"{e}:{hist[e]:g}" for e in EDGES_US))


if __name__ == "__main__":
    main()
