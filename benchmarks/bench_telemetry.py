"""What telemetry costs: call_one latency and fire-and-forget throughput, telemetry on vs off.

    python benchmarks/bench_telemetry.py [--runs N] [--quick] [--fresh] [--json]

One broker (started here) and one client with ``MONARCH_TELEMETRY=1`` and a
2-proc mesh. ``--runs`` pairs of rounds, one round with recording paused in
every process (``set_recording(False)``: the hooks are then as with telemetry
off) and one with it on, their order alternating, so noise hits both alike.
Each round measures:

* call_one round trip (p50, p99) on one actor, after a warm-up;
* fire-and-forget: ``broadcast`` to both actors as fast as it goes, then one
  ``call`` that returns when both have handled everything: messages per second
  (then a pause for the burst's telemetry to be published before the next round).

Reported: the median of each figure over the rounds of each side, ``on/off``
the ratio of those medians, and ``paired`` the median of the per-pair ratios
(a pair's two rounds ran back to back). ``--fresh`` also runs table A: a fresh
client process per round, ``MONARCH_TELEMETRY=0`` vs ``1`` (noisier: each
process's memory layout differs). Last, the cost of the off path (the one
check of ``monarch.telemetry.recorder.ON`` per call) and of the on-path
hooks, in ns, by micro-benchmark.

Goal (issue 34): call_one p50 within 5% when on, and nothing added when off.
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
        time.sleep(cfg["settle"])
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
                out.append(dict(measure(on), pair=i))
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


ROWS = [("call_one p50 (us)", "p50_us"), ("call_one p99 (us)", "p99_us"),
        ("fire-and-forget (msgs/s)", "fire_msgs_s")]  # fmt: skip


def table(title: str, results: dict[bool, list[dict]], as_json: bool) -> None:
    print(title)
    print(f"{'figure':<26}{'telemetry off':>15}{'telemetry on':>15}{'on/off':>8}{'paired':>8}")
    for label, key in ROWS:
        off = statistics.median(r[key] for r in results[False])
        on = statistics.median(r[key] for r in results[True])
        pairs: dict[int, dict[bool, float]] = {}
        for side in (False, True):
            for r in results[side]:
                if "pair" in r:
                    pairs.setdefault(r["pair"], {})[side] = r[key]
        ratios = [p[True] / p[False] for p in pairs.values() if len(p) == 2]
        paired = statistics.median(ratios) if ratios else float("nan")
        print(f"{label:<26}{off:>15,.1f}{on:>15,.1f}{on / off:>8.3f}{paired:>8.3f}")
        if as_json:
            print(json.dumps({"table": title, "figure": key, "off": off, "on": on,
                              "ratio": on / off, "paired": paired}))  # fmt: skip


def _best_ns(fn: object, n: int = 200_000, repeat: int = 5) -> float:
    import timeit

    return min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e9  # type: ignore[arg-type]


def hook_costs() -> list[tuple[str, float]]:
    """ns per call of the off path's check and of the on path's hooks (this process)."""
    from monarch.actors.calls.activity import CallRecord
    from monarch.telemetry import recorder as tel

    def checked(trace: str | None = None, flow: bool = True) -> int:
        if tel.ON and trace is None and flow:  # ActorMesh._call's check
            return 1
        return 0

    def unchecked(trace: str | None = None, flow: bool = True) -> int:
        return 0

    assert not tel.ON
    off = _best_ns(checked) - _best_ns(unchecked)
    rec = tel.Recorder("bench", lambda body, headers: None, lambda: None, 1 << 30)
    record = CallRecord("m.u[0]", "m", "u", 0, "ep", "client-1", 1.0, 1.0, 1.0, True, "t" * 32)
    span = _best_ns(lambda: rec.span("send", "t", 1.0, 2.0, "m.u[0]", "m", 0, "ep", True))
    call = _best_ns(lambda: rec.call(record))
    trace = _best_ns(rec.new_trace)
    from monarch.actors.hosting.telemetry import count_endpoints, spans_of_calls

    rec = tel.Recorder("bench", lambda body, headers: None, lambda: None, 1 << 30)
    rec.expand_calls = spans_of_calls("bench")
    rec.span_listeners.append(count_endpoints)
    for rounds in (100, 20_000):  # a warm-up (the counters' keys), then the measure
        for _ in range(rounds):  # a call_one's four spans: send, reply, deliver, handle
            rec.span("send", "t", 1.0, 2.0, "m.u[0]", "m", 0, "ep", True)
            rec.span("reply", "t", 1.0, 2.0, "m.u[0]", "m", 0, "ep", True)
            rec.call(record)
        t = time.perf_counter()
        n = rec.flush()
        per_span = (time.perf_counter() - t) / n * 1e9
    return [
        ("off: the ON check in _call/_cast", off),
        ("on: a span (caller's send/reply)", span),
        ("on: a finished call (actor's thread)", call),
        ("on: a trace id", trace),
        ("on: flush, per span (flusher thread)", per_span),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="pairs of rounds (default 8)")
    ap.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    ap.add_argument("--fresh", action="store_true", help="also table A: a fresh client a round")
    ap.add_argument("--json", action="store_true", help="also print JSON lines")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    cfg = {"warmup": 200, "latency": 2000, "fire": 5000, "settle": 1.5}
    if args.quick:
        cfg = {"warmup": 50, "latency": 300, "fire": 1000, "settle": 1.2}
    from monarch.broker.server import EmbeddedBroker

    load0 = os.getloadavg()
    results: dict[bool, list[dict]] = {False: [], True: []}
    toggled: dict[bool, list[dict]] = {False: [], True: []}
    with contextlib.ExitStack() as cleanup:
        broker = EmbeddedBroker().start()
        cleanup.callback(broker.stop)
        for r in run_child(broker.url, True, dict(cfg, toggle=True, rounds=args.runs)):
            toggled[r["on"]].append(r)
        if args.fresh:
            for i in range(args.runs):
                for on in (False, True) if i % 2 == 0 else (True, False):
                    results[on].extend(dict(r, pair=i) for r in run_child(broker.url, on, cfg))
    load1 = os.getloadavg()
    print(f"{args.runs} rounds per side; counts: {cfg}")
    print(f"load average (1 min) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end")
    table("B. one client, recording paused/resumed each round", toggled, args.json)
    if args.fresh:
        table("A. a fresh client per round: MONARCH_TELEMETRY=0 vs 1", results, args.json)
    try:
        costs = hook_costs()
    except (AttributeError, ImportError) as e:  # an older tree, compared with this script
        print(f"hook costs: not measured here ({e!r})")
        costs = []
    print("hook costs (ns per call, best of 5)")
    for label, ns in costs:
        print(f"  {label:<40}{ns:>8.0f}")
        if args.json:
            print(json.dumps({"hook": label, "ns": ns}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
