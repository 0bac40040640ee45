"""What job message authentication costs: call round trip and fire-and-forget, off vs on.

    python benchmarks/bench_auth.py [--runs N] [--quick] [--json]

One broker (an ``EmbeddedBroker`` this script starts and stops; it has no
token, like a shared broker), and on it:

* raw nats-py: ``nc.request()`` round trips to an echo responder process, and
  N publishes then one request (the baseline, as in ``bench_actors.py``);
* two monarch jobs side by side, each a client process with one proc of its
  own (the key is fixed when a process connects): authentication off, and on
  (``MONARCH_AUTH=1``: every message signed with an HMAC tag and verified
  where it comes in). They take turns in slices of ``call_one`` round trips
  and of ``broadcast`` fire-and-forget sends, so the noise of a shared machine
  hits both alike; the client's CPU time per call and per send is kept too.

It also times one tag (sign, verify) in this process. Every figure is the
median over runs (``x off`` the median of each run's own on/off ratio);
per-run figures go to stderr.
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
import timeit
import uuid

from _job import own_broker
from bench_actors import TIMEOUT, RawClient, percentile, start_responders

from monarch.actor import Actor, endpoint, this_host

SIDES = ("off", "on")
SLICES = 10  # turns per scenario and run


class Echo(Actor):
    """Defined in ``__main__``: it reaches the proc by value (cloudpickle)."""

    @endpoint
    def ping(self, x):
        return x


# -- one monarch side, in a process of its own (``--side``) ----------------------------


def serve_side() -> None:
    """Spawn a proc, then answer ``{"op": "call"|"fire", "n": N}`` lines until stdin ends."""
    from monarch.broker.connections import auth
    from monarch.core.process_runtime import runtime

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        one = procs.spawn("echo", Echo)
        one.ping.call_one(0).get(TIMEOUT)
        print(json.dumps({"signed": auth.auth_of(runtime().nc) is not None}), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            n, out = req["n"], {}
            cpu = time.process_time()  # all of this process's threads (busy polling too)
            if req["op"] == "call":
                lat = []
                for i in range(n):
                    t = time.perf_counter()
                    one.ping.call_one(i).get(TIMEOUT)
                    lat.append(time.perf_counter() - t)
                out["lat"] = lat
            else:
                t = time.perf_counter()
                for i in range(n):
                    one.ping.broadcast(i)
                one.ping.call_one(-1).get(TIMEOUT)
                out["seconds"] = time.perf_counter() - t
            out["cpu"] = time.process_time() - cpu
            print(json.dumps(out), flush=True)
    finally:
        procs.stop().get(TIMEOUT)


class Side:
    """A ``--side`` child: a client process with authentication off or on."""

    def __init__(self, side: str) -> None:
        env = {
            k: v for k, v in os.environ.items() if k not in ("MONARCH_AUTH", "MONARCH_NATS_JOB_KEY")
        }
        env["MONARCH_OPEN_BROKER_OK"] = "1"  # this broker is open on purpose
        if side == "on":
            env["MONARCH_AUTH"] = "1"
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--side", side],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._answer()
        if hello["signed"] != (side == "on"):
            raise RuntimeError(f"the {side} side did not run with authentication {side}")

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()  # the child bounds each of its waits by TIMEOUT
        if not line:
            raise RuntimeError(f"the {self.side} side exited (status {self.proc.wait(TIMEOUT)})")
        return json.loads(line)

    def ask(self, op: str, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, "n": n}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def bench_sides(sides: dict[str, Side], cfg: dict) -> dict[str, dict[str, float]]:
    """One run: both sides take turns (order flipping each turn) through both scenarios."""
    lat: dict[str, list[float]] = {s: [] for s in sides}
    call_cpu = dict.fromkeys(sides, 0.0)
    fire_s = dict.fromkeys(sides, 0.0)
    fire_cpu = dict.fromkeys(sides, 0.0)
    for turn in range(SLICES):
        order = SIDES if turn % 2 == 0 else SIDES[::-1]
        for s in order:
            r = sides[s].ask("call", cfg["latency"] // SLICES)
            lat[s] += r["lat"]
            call_cpu[s] += r["cpu"]
        for s in order:
            r = sides[s].ask("fire", cfg["fire"] // SLICES)
            fire_s[s] += r["seconds"]
            fire_cpu[s] += r["cpu"]
    out = {}
    for s in sides:
        n_calls, n_sends = len(lat[s]), cfg["fire"] // SLICES * SLICES
        out[s] = {
            "call_p50": percentile(sorted(lat[s]), 0.5) * 1e6,
            "call_cpu": call_cpu[s] / n_calls * 1e6,
            "fire": n_sends / fire_s[s],
            "fire_cpu": fire_cpu[s] / n_sends * 1e6,
        }
    return out


# -- one tag, in this process ----------------------------------------------------------


def tag_costs() -> dict[str, float]:
    """Microseconds to sign and to verify one call-sized message (4 headers, 16 B body)."""
    from monarch.broker.connections.auth import TAG, MessageAuth
    from monarch.core.runtime import LocalMsg

    a = MessageAuth("k" * 43)
    subject, reply = "mon.default.act.echo.0a1b2c3d.0", "mon.default.port.client-0a1b2c3d.17"
    headers = {"Mon-Kind": "call", "Mon-Endpoint": "ping", "Mon-From": "client", "Mon-Seq": "42"}
    body = b"x" * 16
    signed = {**headers, TAG: a.tag(subject, reply, headers, body)}
    msg = LocalMsg(subject, body, reply, signed)
    assert a.valid(msg)
    n = 20_000
    sign = min(timeit.repeat(lambda: a.tag(subject, reply, headers, body), number=n, repeat=5))
    verify = min(timeit.repeat(lambda: a.valid(msg), number=n, repeat=5))
    return {"sign": sign / n * 1e6, "verify": verify / n * 1e6}


# -- report -----------------------------------------------------------------------------

# (key, figure, unit, higher_is_better, raw scenario or None, monarch scenario)
ROWS = [
    ("call_p50", "p50", "us", False, "raw request/reply", "call_one round trip"),
    ("call_cpu", "cpu", "us", False, None, "client CPU per call"),
    ("fire", "rate", "msgs/s", True, "raw pub x N + request", "broadcast fire-and-forget"),
    ("fire_cpu", "cpu", "us", False, None, "client CPU per send"),
]


def report(runs: dict[str, list[dict]], tags: dict[str, float], cfg: dict, as_json: bool) -> None:
    rows = []
    for key, figure, unit, higher, raw_name, name in ROWS:
        # Paired: each run's "on" against the same run's "off", then the median of those.
        paired = statistics.median(
            (off[key] / on[key]) if higher else (on[key] / off[key])
            for on, off in zip(runs["on"], runs["off"])
        )
        for side in ("raw", *SIDES) if raw_name else SIDES:
            values = [r[key] for r in runs[side]]
            x_off = {"raw": None, "off": 1.0, "on": paired}[side]
            label = raw_name if side == "raw" else name
            rows.append((side, label, figure, statistics.median(values), unit, x_off, values))
    print(f"\nmedian of {len(runs['raw'])} runs; counts per run and side: {cfg}")
    print(f"{'side':5} {'scenario':27} {'figure':6} {'value':>11} {'unit':7} {'x off':>6}")
    for side, name, figure, value, unit, x_off, _ in rows:
        ratio = f"{x_off:6.2f}" if x_off is not None else ""
        print(f"{side:5} {name:27} {figure:6} {value:11,.1f} {unit:7} {ratio:>6}")
    print(f"tag   sign one call message        {tags['sign']:18.2f} us")
    print(f"tag   verify one call message      {tags['verify']:18.2f} us")
    print(
        "\nx off: time (or client CPU time) per call or message with authentication on / off, "
        "the median of each run's own ratio (1.00 = free).\nraw: nats-py on the same broker, "
        "for scale. cpu: CPU time of the client process (all its threads, busy polling "
        "included) per call or send."
    )
    if as_json:
        keys = ("side", "scenario", "figure", "value", "unit", "x_off", "runs")
        for side, name, figure, value, unit, x_off, values in rows:
            ratio = round(x_off, 3) if x_off is not None else None
            rounded = [round(v, 2) for v in values]
            row = dict(zip(keys, (side, name, figure, round(value, 2), unit, ratio, rounded)))
            print(json.dumps({"bench": "auth", **row}))
        for what, us in tags.items():
            print(json.dumps({"bench": "auth", "side": "tag", "scenario": what, "value": us}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="repetitions; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process
    args = ap.parse_args()
    if args.side:
        serve_side()
        return
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.quick:
        cfg = dict(warmup=50, latency=300, fire=1000)
    else:
        cfg = dict(warmup=200, latency=2000, fire=10_000)
    raw_cfg = dict(cfg, pipelined=10, rounds=10)  # RawClient runs those too; unused here

    # Everything started is stopped in reverse order, even if a step fails or ^C.
    with contextlib.ExitStack() as cleanup:
        broker = own_broker(cleanup)
        prefix = f"bench.{uuid.uuid4().hex[:8]}"
        start_responders(broker.url, prefix, cleanup)
        raw_client = RawClient(broker.url, prefix)
        cleanup.callback(raw_client.close)
        sides = {}
        for s in SIDES:
            sides[s] = Side(s)
            cleanup.callback(sides[s].close)
        for s in SIDES:  # warm up: first calls, imports, the broker's routes
            sides[s].ask("call", cfg["warmup"])
        runs: dict[str, list[dict]] = {"raw": [], "off": [], "on": []}
        for i in range(args.runs):
            r = raw_client.bench(raw_cfg)
            runs["raw"].append({"call_p50": r["call_p50"], "fire": r["fire"]})  # no CPU figures
            for s, figures in bench_sides(sides, cfg).items():
                runs[s].append(figures)
            for s, rs in runs.items():
                figures = " ".join(f"{k}={v:,.1f}" for k, v in rs[-1].items())
                print(f"run {i + 1}/{args.runs} {s:4} {figures}", file=sys.stderr, flush=True)
        report(runs, tag_costs(), cfg, args.json)


if __name__ == "__main__":
    main()
