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
from typing import Any

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

        @endpoint
        def cpu(self) -> float:
            return time.process_time()  # this proc's threads, the telemetry thread included

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn(f"bench{uuid.uuid4().hex[:6]}", Sink)
    one = mesh.slice(gpus=0)
    for i in range(cfg["warmup"]):
        one.ping.call_one(i).get(TIMEOUT)
    sent = 0

    def record(on: bool | None) -> None:
        if on is not None:
            mesh.record.call(on).get(TIMEOUT)
            set_recording(on)

    def latency(on: bool | None, n: int, pair: int) -> dict:
        record(on)
        lat = []
        cpu = time.process_time() + one.cpu.call_one().get(TIMEOUT)
        for i in range(n):
            t = time.perf_counter()
            one.ping.call_one(i).get(TIMEOUT)
            lat.append((time.perf_counter() - t) * 1e6)
        cpu = time.process_time() + one.cpu.call_one().get(TIMEOUT) - cpu
        return {"on": on, "pair": pair, "lat_us": lat, "cpu_us": cpu / n * 1e6}

    def fire(on: bool | None, pair: int) -> dict:
        nonlocal sent
        record(on)
        n = cfg["fire"]
        t = time.perf_counter()
        for _ in range(n):
            mesh.tick.broadcast()
        counts = mesh.count.call().get(TIMEOUT)
        elapsed = time.perf_counter() - t
        sent += n
        assert list(counts.values()) == [sent, sent], counts
        # The burst's spans (two per message and actor) leave within the next flushes;
        # let them go before the next burst, so each is measured with its own.
        time.sleep(cfg["settle"])
        return {"on": on, "pair": pair, "fire_msgs_s": 2 * n / elapsed}  # both actors

    def orders(pairs: int) -> list[tuple[int, bool]]:
        return [(i, on) for i in range(pairs) for on in ((False, True), (True, False))[i % 2]]

    if cfg.get("toggle"):
        # Latency in short blocks, on and off in turn: the machine's drift (other
        # processes, frequency) hits both sides alike; flushes (every interval, on a
        # thread of their own) fall where they fall, as in a real job.
        out = [latency(on, cfg["block"], i) for i, on in orders(cfg["blocks"])]
        out += [fire(on, i) for i, on in orders(cfg["rounds"])]
    else:
        out = [latency(None, cfg["latency"], 0), fire(None, 0)]
    procs.stop().get(TIMEOUT)
    shutdown_context().get(TIMEOUT)
    return out


def run_child(url: str, telemetry: bool, cfg: dict) -> list[dict]:
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


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def figures(results: list[dict]) -> list[tuple[str, float, float, float]]:
    """(label, off, on, paired ratio) of call_one p50 and p99, CPU and the fire rate.

    Latency: percentiles of all the samples of a side; ``paired``: the median over
    pairs of (block on) / (block off). CPU a call_one: the client's and the called
    proc's CPU time (all their threads, telemetry's included) over a block, per
    call; medians of the blocks. Fire rate: medians of the bursts, and paired.
    """
    lat = {side: [r for r in results if r["on"] == side and "lat_us" in r] for side in (0, 1)}
    fire = {side: [r for r in results if r["on"] == side and "fire_msgs_s" in r] for side in (0, 1)}

    def paired(rows: dict[int, list[dict]], value: Any) -> float:
        by_pair: dict[int, dict[int, float]] = {}
        for side in (0, 1):
            for r in rows[side]:
                by_pair.setdefault(r["pair"], {})[side] = value(r)
        ratios = [p[1] / p[0] for p in by_pair.values() if len(p) == 2]
        return statistics.median(ratios) if ratios else float("nan")

    out = []
    for label, q in (("call_one p50 (us)", 0.5), ("call_one p99 (us)", 0.99)):
        off, on = (_pct([x for r in lat[s] for x in r["lat_us"]], q) for s in (0, 1))
        out.append((label, off, on, paired(lat, lambda r, q=q: _pct(r["lat_us"], q))))
    off, on = (statistics.median(r["cpu_us"] for r in lat[s]) for s in (0, 1))
    out.append(("CPU a call_one (us)", off, on, paired(lat, lambda r: r["cpu_us"])))
    off, on = (statistics.median(r["fire_msgs_s"] for r in fire[s]) for s in (0, 1))
    out.append(("fire-and-forget (msgs/s)", off, on, paired(fire, lambda r: r["fire_msgs_s"])))
    return out


def table(title: str, results: list[dict], as_json: bool) -> None:
    print(title)
    print(f"{'figure':<26}{'telemetry off':>15}{'telemetry on':>15}{'on/off':>8}{'paired':>8}")
    for label, off, on, paired in figures(results):
        print(f"{label:<26}{off:>15,.1f}{on:>15,.1f}{on / off:>8.3f}{paired:>8.3f}")
        if as_json:
            print(json.dumps({"table": title, "figure": label, "off": off, "on": on,
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
    from monarch.actors.hosting.telemetry import count_calls, count_endpoints, without_flow_markers

    rec = tel.Recorder("bench", lambda body, headers: None, lambda: None, 1 << 30)
    rec.call_filter = without_flow_markers
    rec.call_listeners.append(count_calls)
    rec.span_listeners.append(count_endpoints)
    tel.start(rec)  # on, so the endpoint counters count as in a job
    for rounds in (100, 20_000):  # a warm-up (the counters' keys), then the measure
        for _ in range(rounds):  # a call_one's four spans: send, reply, deliver, handle
            rec.span("send", "t", 1.0, 2.0, "m.u[0]", "m", 0, "ep", True)
            rec.span("reply", "t", 1.0, 2.0, "m.u[0]", "m", 0, "ep", True)
            rec.call(record)
        t = time.perf_counter()
        n = rec.flush()
        per_span = (time.perf_counter() - t) / n * 1e9
    tel.stop()
    return [
        ("off: the ON check in _call/_cast", off),
        ("on: a span (caller's send/reply)", span),
        ("on: a finished call (actor's thread)", call),
        ("on: a trace id", trace),
        ("on: flush, per record (flusher thread)", per_span),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--runs", type=int, default=8, help="pairs of fire-and-forget bursts (default 8)"
    )
    ap.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    ap.add_argument("--fresh", action="store_true", help="also table A: a fresh client a round")
    ap.add_argument("--json", action="store_true", help="also print JSON lines")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    cfg = {"warmup": 300, "latency": 3000, "block": 500, "blocks": 30, "fire": 5000,
           "settle": 1.5}  # fmt: skip
    if args.quick:
        cfg = {"warmup": 50, "latency": 300, "block": 100, "blocks": 4, "fire": 1000,
               "settle": 1.2}  # fmt: skip
    from monarch.broker.connections.server import EmbeddedBroker

    load0 = os.getloadavg()
    fresh: list[dict] = []
    with contextlib.ExitStack() as cleanup:
        broker = EmbeddedBroker().start()
        cleanup.callback(broker.stop)
        toggled = run_child(broker.url, True, dict(cfg, toggle=True, rounds=args.runs))
        if args.fresh:
            for i in range(args.runs):
                for on in (False, True) if i % 2 == 0 else (True, False):
                    fresh.extend(dict(r, on=on, pair=i) for r in run_child(broker.url, on, cfg))
    load1 = os.getloadavg()
    print(f"counts: {cfg}; fire-and-forget bursts and fresh clients: {args.runs} a side")
    print(f"load average (1 min) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end")
    table("B. one client, recording paused/resumed in turn", toggled, args.json)
    if args.fresh:
        table("A. a fresh client per round: MONARCH_TELEMETRY=0 vs 1", fresh, args.json)
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
