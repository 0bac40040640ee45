"""Actor messaging costs of Monarch over NATS, against raw nats-py on the same broker.

    python benchmarks/bench_actors.py [--runs N] [--quick] [--json]

One broker (an ``EmbeddedBroker`` this script starts and stops), one run:
monarch scenarios on a 4-proc mesh, then the raw nats-py equivalents against
echo responders in separate OS processes, repeated ``--runs`` times
(interleaved, so noise hits both sides alike). Every figure is the median over
runs. See benchmarks/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
import uuid

import nats
import uvloop
from _job import own_broker

from monarch.actor import Actor, endpoint, this_host

TIMEOUT = 60.0  # seconds; any single wait longer than this is a failure, not a slow result
N_PROCS = 4
PAYLOAD = b"x" * 16

# An echo responder: replies with the request body to every message that has a
# reply subject. It exits when its stdin closes, so it never outlives us; it runs
# in its own session so a terminal's ^C reaches only us, and we stop it in order.
RESPONDER = r"""
import asyncio, sys
import nats, uvloop

async def quiet(e):
    pass

async def main(url, subjects):
    nc = await nats.connect(url, error_cb=quiet)
    async def echo(msg):
        if msg.reply:
            await nc.publish(msg.reply, msg.data)
    for s in subjects:
        await nc.subscribe(s, cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()

uvloop.new_event_loop().run_until_complete(main(sys.argv[1], sys.argv[2:]))
"""


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, round(q * (len(sorted_xs) - 1)))]


# -- monarch -----------------------------------------------------------------


class Echo(Actor):
    @endpoint
    def ping(self, x):
        return x


def bench_monarch(mesh, one, cfg: dict) -> dict[str, float]:
    r: dict[str, float] = {}
    for i in range(cfg["warmup"]):
        one.ping.call_one(i).get(TIMEOUT)
    lat = []
    for i in range(cfg["latency"]):
        t = time.perf_counter()
        one.ping.call_one(i).get(TIMEOUT)
        lat.append(time.perf_counter() - t)
    lat.sort()
    r["call_p50"], r["call_p99"] = percentile(lat, 0.50) * 1e6, percentile(lat, 0.99) * 1e6

    n = cfg["pipelined"]
    t = time.perf_counter()
    futs = [one.ping.call_one(i) for i in range(n)]
    for f in futs:
        f.get(TIMEOUT)
    r["pipelined"] = n / (time.perf_counter() - t)

    rounds = cfg["rounds"]
    t = time.perf_counter()
    for i in range(rounds):
        mesh.ping.call(i).get(TIMEOUT)
    r["gather"] = rounds / (time.perf_counter() - t)

    n = cfg["fire"]
    t = time.perf_counter()
    for i in range(n):
        one.ping.broadcast(i)
    one.ping.call_one(-1).get(TIMEOUT)
    r["fire"] = n / (time.perf_counter() - t)
    return r


# -- raw nats-py ---------------------------------------------------------------


class RawClient:
    """A nats-py requester on a uvloop loop driven from this (main) thread."""

    def __init__(self, url: str, prefix: str) -> None:
        self.loop = uvloop.new_event_loop()
        self.one, self.all = f"{prefix}.one", f"{prefix}.all"
        self.inbox = f"_INBOX.{prefix}"
        self._got, self._want, self._done = 0, 0, None
        self.nc = self.run(nats.connect(url))
        self.run(self.nc.subscribe(self.inbox, cb=self._on_reply))

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))

    async def _on_reply(self, msg) -> None:
        self._got += 1
        if self._got == self._want:
            self._done.set_result(None)

    async def _expect(self, n: int, send) -> None:
        """Send with ``send()``, then wait until ``n`` replies reached our inbox."""
        self._got, self._want, self._done = 0, n, self.loop.create_future()
        await send()
        await self._done

    def bench(self, cfg: dict) -> dict[str, float]:
        return self.run(self._bench(cfg))

    async def _bench(self, cfg: dict) -> dict[str, float]:
        r: dict[str, float] = {}
        nc = self.nc
        for _ in range(cfg["warmup"]):
            await nc.request(self.one, PAYLOAD, timeout=TIMEOUT)
        lat = []
        for _ in range(cfg["latency"]):
            t = time.perf_counter()
            await nc.request(self.one, PAYLOAD, timeout=TIMEOUT)
            lat.append(time.perf_counter() - t)
        lat.sort()
        r["call_p50"], r["call_p99"] = percentile(lat, 0.50) * 1e6, percentile(lat, 0.99) * 1e6

        n = cfg["pipelined"]

        async def burst(subject: str, count: int, reply: str) -> None:
            for _ in range(count):
                await nc.publish(subject, PAYLOAD, reply=reply)
            await nc.flush()

        t = time.perf_counter()
        await self._expect(n, lambda: burst(self.one, n, self.inbox))
        r["pipelined"] = n / (time.perf_counter() - t)

        rounds = cfg["rounds"]
        t = time.perf_counter()
        for _ in range(rounds):
            await self._expect(N_PROCS, lambda: nc.publish(self.all, PAYLOAD, reply=self.inbox))
        r["gather"] = rounds / (time.perf_counter() - t)

        n = cfg["fire"]
        t = time.perf_counter()
        await burst(self.one, n, "")
        await nc.request(self.one, PAYLOAD, timeout=TIMEOUT)
        r["fire"] = n / (time.perf_counter() - t)
        return r

    def close(self) -> None:
        try:
            self.run(self.nc.close())
        finally:
            self.loop.close()


def start_responders(url: str, prefix: str, cleanup: contextlib.ExitStack) -> list:
    """N_PROCS echo processes on ``prefix.all``; the first also on ``prefix.one``."""
    procs: list[subprocess.Popen] = []
    cleanup.callback(stop_responders, procs)
    for i in range(N_PROCS):
        subjects = [f"{prefix}.all"] + ([f"{prefix}.one"] if i == 0 else [])
        cmd = [sys.executable, "-c", RESPONDER, url, *subjects]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(subprocess.Popen(cmd, **pipes, start_new_session=True))
    for p in procs:  # bounded: a responder that cannot connect exits with an error
        if p.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"raw nats-py responder failed to start (exit {p.wait(TIMEOUT)})")
    return procs


def stop_responders(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.stdin:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- report --------------------------------------------------------------------

# (key, monarch scenario, raw nats-py equivalent, figure, unit, higher_is_better)
ROWS = [
    ("call_p50", "call_one round trip", "raw request/reply", "p50", "us", False),
    ("call_p99", "call_one round trip", "raw request/reply", "p99", "us", False),
    ("pipelined", "pipelined call_one", "raw pipelined request", "rate", "calls/s", True),
    (
        "gather",
        f"call() gather x{N_PROCS}",
        f"raw pub, {N_PROCS} replies",
        "rate",
        "rounds/s",
        True,
    ),
    ("fire", "broadcast fire-and-forget", "raw pub x N + request", "rate", "msgs/s", True),
]
FOOTNOTE = """
x raw: ours/raw for latencies; raw_rate/our_rate for rates, i.e. how many times longer
monarch takes per call, round or message than raw nats-py sending the same traffic
(1.00 = as fast as raw; higher is worse). Raw equivalents: request/reply = nc.request()
to a responder process; pipelined = N publishes with a reply inbox, then wait for N
replies; gather = one publish to a subject 4 responders share, wait for 4 replies;
fire = N publishes without reply, then one request (nats-py keeps per-subscription order)."""


def report(ours: list[dict], raw: list[dict], cfg: dict, as_json: bool) -> None:
    lines = []
    for key, scenario, raw_scenario, figure, unit, higher in ROWS:
        o = statistics.median(r[key] for r in ours)
        b = statistics.median(r[key] for r in raw)
        ratio = b / o if higher else o / b  # always "times the raw cost"; 1.0 = as fast as raw
        lines.append(("monarch", scenario, figure, o, unit, ratio, [r[key] for r in ours]))
        lines.append(("raw", raw_scenario, figure, b, unit, 1.0, [r[key] for r in raw]))
    print(f"\nmedian of {len(ours)} runs; counts: {cfg}")
    print(f"{'side':8} {'scenario':27} {'figure':6} {'value':>11} {'unit':9} {'x raw':>6}")
    for side, scenario, figure, value, unit, ratio, _ in lines:
        print(f"{side:8} {scenario:27} {figure:6} {value:11,.1f} {unit:9} {ratio:6.2f}")
    print(FOOTNOTE)
    if as_json:
        keys = ("side", "scenario", "figure", "value", "unit", "x_raw", "runs")
        for side, scenario, figure, value, unit, ratio, runs in lines:
            values = (side, scenario, figure, round(value, 2), unit, round(ratio, 3))
            row = dict(zip(keys, (*values, [round(v, 2) for v in runs])))
            print(json.dumps({"bench": "actors", **row}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="repetitions; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test, < 30 s)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.quick:
        cfg = dict(warmup=50, latency=200, pipelined=1000, rounds=100, fire=1000)
    else:
        cfg = dict(warmup=200, latency=2000, pipelined=10_000, rounds=1000, fire=10_000)

    # Everything started is stopped in reverse order, even if a step fails or ^C.
    with contextlib.ExitStack() as cleanup:
        broker = own_broker(cleanup)
        procs = this_host().spawn_procs(per_host={"gpus": N_PROCS})
        cleanup.callback(lambda: procs.stop().get(TIMEOUT))
        mesh = procs.spawn("echo", Echo)
        one = mesh.slice(gpus=0)

        prefix = f"bench.{uuid.uuid4().hex[:8]}"
        start_responders(broker.url, prefix, cleanup)
        raw_client = RawClient(broker.url, prefix)
        cleanup.callback(raw_client.close)

        ours, raw = [], []
        for i in range(args.runs):
            ours.append(bench_monarch(mesh, one, cfg))
            raw.append(raw_client.bench(cfg))
            for side, r in (("monarch", ours[-1]), ("raw", raw[-1])):
                figures = " ".join(f"{k}={v:,.0f}" for k, v in r.items())
                print(f"run {i + 1}/{args.runs} {side:7} {figures}", file=sys.stderr, flush=True)
        report(ours, raw, cfg, args.json)


if __name__ == "__main__":
    main()
