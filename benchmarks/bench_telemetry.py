"""What telemetry costs: call_one latency and fire-and-forget throughput, telemetry on vs off.

    python benchmarks/bench_telemetry.py [--runs N] [--quick] [--json]

One broker (started here), then ``--runs`` rounds; each round runs the same
client twice as a fresh process (telemetry is decided when a process's
runtime starts), once with ``MONARCH_TELEMETRY=0`` and once with ``=1``, in
alternating order so noise hits both alike. Each client spawns a 2-proc mesh
and measures:

* call_one round trip (p50, p99) on one actor, after a warm-up;
* fire-and-forget: ``broadcast`` to both actors as fast as it goes, then one
  ``call`` that returns when both have handled everything: messages per second
  (then 2.5 s for the burst's telemetry to be published before the next round).

Every figure is the median over rounds; ``x off`` is on / off. Goal
(issue 34): call_one p50 within 5% when on, and nothing added when off (off
is the code path of a build without telemetry, one boolean check per call).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

TIMEOUT = 60.0


def child(cfg: dict) -> list[dict]:
    """One client: the measurements, with this process's MONARCH_TELEMETRY.

    With ``cfg["toggle"]`` (telemetry on), it measures ``cfg["rounds"]`` rounds each
    way on the same procs, pausing recording everywhere for the "off" rounds
    (``set_recording``); otherwise one round as the environment says.
    """
    from monarch.actor import Actor, endpoint, shutdown_context, this_host
    from monarch.actors.hosting.telemetry import set_recording

    class Sink(Actor):
        def __init__(self) -> None:
            self.n = 0

        @endpoint
        def ping(self, x: int) -> int:
            return x

        @endpoint
        def tick(self) -> None:
            self.n += 1

        @endpoint
        def count(self) -> int:
            return self.n

        @endpoint
        def record(self, on: bool) -> bool:
            return set_recording(on)

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn(f"bench{uuid.uuid4().hex[:6]}", Sink)
    one = mesh.slice(gpus=0)
    for i in range(cfg["warmup"]):
        one.ping.call_one(i).get(TIMEOUT)
    sent = 0

    def measure(on: bool | None) -> dict:
        nonlocal sent
        if on is not None:
            mesh.record.call(on).get(TIMEOUT)
            set_recording(on)
        lat = []
        for i in range(cfg["latency"]):
            t = time.perf_counter()
            one.ping.call_one(i).get(TIMEOUT)
            lat.append(time.perf_counter() - t)
        lat.sort()
        fire = cfg["fire"]
        t = time.perf_counter()
        for _ in range(fire):
            mesh.tick.broadcast()
        counts = mesh.count.call().get(TIMEOUT)
        elapsed = time.perf_counter() - t
        sent += fire
        assert list(counts.values()) == [sent, sent], counts
        # The burst's spans (two per message and actor) leave within the next flushes;
        # let them go before the next latency round, which measures call_one alone.
        time.sleep(2.5)
        return {
            "on": on,
            "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1e6,
            "fire_msgs_s": 2 * fire / elapsed,  # each broadcast reaches both actors
        }

    if cfg.get("toggle"):
        out = []
        for i in range(cfg["rounds"]):
            for on in (False, True) if i % 2 == 0 else (True, False):
                out.append(measure(on))
    else:
        out = [measure(None)]
    procs.stop().get(TIMEOUT)
    shutdown_context().get(TIMEOUT)
    return out


def run_child(url: str, telemetry: bool, cfg: dict) -> dict:
    env = dict(os.environ, MONARCH_NATS_URL=url, MONARCH_OPEN_BROKER_OK="1")
    env["MONARCH_TELEMETRY"] = "1" if telemetry else "0"
    env["MONARCH_NAMESPACE"] = f"benchtel{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"client failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(title: str, results: dict[bool, list[dict]], as_json: bool) -> None:
    print(title)
    print(f"{'figure':<26}{'telemetry off':>16}{'telemetry on':>16}{'on/off':>8}")
    rows = [("call_one p50 (us)", "p50_us"), ("call_one p99 (us)", "p99_us"),
            ("fire-and-forget (msgs/s)", "fire_msgs_s")]  # fmt: skip
    for label, key in rows:
        off = statistics.median(r[key] for r in results[False])
        on = statistics.median(r[key] for r in results[True])
        print(f"{label:<26}{off:>16,.1f}{on:>16,.1f}{on / off:>8.3f}")
        if as_json:
            print(json.dumps({"table": title, "figure": key, "off": off, "on": on,
                              "ratio": on / off}))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    ap.add_argument("--json", action="store_true", help="also print JSON lines")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    cfg = {"warmup": 200, "latency": 3000, "fire": 10000}
    if args.quick:
        cfg = {"warmup": 50, "latency": 300, "fire": 1000}
    from monarch.broker.server import EmbeddedBroker

    results: dict[bool, list[dict]] = {False: [], True: []}
    toggled: dict[bool, list[dict]] = {False: [], True: []}
    with contextlib.ExitStack() as cleanup:
        broker = EmbeddedBroker().start()
        cleanup.callback(broker.stop)
        for i in range(args.runs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for on in order:
                results[on].extend(run_child(broker.url, on, cfg))
        for r in run_child(broker.url, True, dict(cfg, toggle=True, rounds=args.runs)):
            toggled[r["on"]].append(r)
    print(f"medians of {args.runs} rounds per side; counts: {cfg}")
    table("A. a fresh client per round: MONARCH_TELEMETRY=0 vs 1", results, args.json)
    table("B. one client, recording paused/resumed each round", toggled, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
