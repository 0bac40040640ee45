"""Round trip and broadcast-and-gather through a routed NATS cluster, against one node.

    python benchmarks/bench_cluster.py [--runs 3] [--quick] [--json]

Three placements, each run on fresh brokers, taken in turn per run:

* ``single``: one nats-server (``EmbeddedBroker``), client and procs on it;
* ``cluster, same node``: a three-node cluster on loopback
  (``monarch.broker.connections.cluster``), client and procs on node 0;
* ``cluster, across``: the client on node 0, the procs on node 1, so every
  message crosses a route between two nats-servers.

The client and the procs are pinned to their node the way a real cluster would
do it: the client's ``MONARCH_NATS_URL`` is its node; a host agent
(``run_worker_loop_forever``) runs with the procs' node as its URL, and the
client gets its 4 procs from it with ``attach_to_workers`` (an agent gives its
procs its own broker URL). The client script checks where each side really is.
Figures: ``call_one`` round trip p50/p99 (2000 after 200 and at least 8 s of
warm-up: agent-started procs import torch in their first seconds; to the actor
at ``gpus=0``) and ``mesh.ping.call(i).get()`` over 4 procs (p50 per round,
1000 rounds after 50 warm-up); the baseline is raw nats-py over the same two
nodes: ``request`` to a responder process, and a publish to a subject 4
responder processes share, waiting for the 4 replies. Medians over runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monarch.broker.connections.cluster import nats_cluster  # noqa: E402
from monarch.broker.connections.server import EmbeddedBroker  # noqa: E402

RUN_TIMEOUT = 300.0  # seconds for one client script

AGENT = "from monarch.actor import run_worker_loop_forever; run_worker_loop_forever(name='bench')"

RESPONDER = r"""
import asyncio, sys
import nats, uvloop

async def main(url, prefix, rank):
    nc = await nats.connect(url)
    async def echo(msg):
        await nc.publish(msg.reply, msg.data)
    await nc.subscribe(f"{prefix}.one.{rank}", cb=echo)
    await nc.subscribe(f"{prefix}.all", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()

uvloop.new_event_loop().run_until_complete(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""

CLIENT = r"""
import asyncio, json, os, subprocess, sys, time
import nats, uvloop
from monarch.actor import Actor, attach_to_workers, endpoint, shutdown_context
from monarch.core.process_runtime import runtime  # where this client is connected (a check)

WARMUP, LATENCY, ROUNDS = (int(x) for x in os.environ["BENCH_COUNTS"].split(","))
PROC_URL = os.environ["BENCH_PROC_URL"]
SETTLE_S = float(os.environ["BENCH_SETTLE_S"])

class Echo(Actor):
    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def node_port(self) -> int:
        from monarch.core.process_runtime import runtime  # the proc's runtime, in the proc
        return runtime().nc.connected_url.port

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]

def timed(fn, warmup, n):
    # warm-up: at least `warmup` calls and SETTLE_S seconds (agent-started procs import
    # torch in the background at first, which slows their first seconds)
    end = time.monotonic() + SETTLE_S
    i = 0
    while i < warmup or time.monotonic() < end:
        fn(i)
        i += 1
    lat = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    return pct(lat, 0.5) * 1e6, pct(lat, 0.99) * 1e6

out = {}
hosts = attach_to_workers(hosts=1, timeout=60)
procs = hosts.spawn_procs(per_host={"gpus": 4})
mesh = procs.spawn("echo", Echo)
out["client_port"] = runtime().nc.connected_url.port
out["proc_ports"] = sorted(set(mesh.node_port.call().get(timeout=60).values()))
one = mesh.slice(gpus=0)
out["s1_p50"], out["s1_p99"] = timed(lambda i: one.ping.call_one(i).get(timeout=60),
                                     WARMUP, LATENCY)
out["gather_p50"], out["gather_p99"] = timed(lambda i: mesh.ping.call(i).get(timeout=60),
                                             50, ROUNDS)
procs.stop().get(timeout=60)

# raw nats-py: responders on the procs' node, this client's connection on its own node
prefix = f"bench.raw.{os.getpid()}"
responders = [subprocess.Popen([sys.executable, "-c", os.environ["BENCH_RESPONDER"], PROC_URL,
                                prefix, str(r)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
              for r in range(4)]
loop = uvloop.new_event_loop()
try:
    for r in responders:
        if r.stdout.readline().strip() != b"ready":
            raise RuntimeError("a raw responder did not start")
    client_url = os.environ["MONARCH_NATS_URL"]
    nc = loop.run_until_complete(nats.connect(client_url))
    inbox = nc.new_inbox()
    replies = asyncio.Queue()
    async def on_reply(msg):
        replies.put_nowait(msg)
    loop.run_until_complete(nc.subscribe(inbox, cb=on_reply))
    async def gather():
        await nc.publish(f"{prefix}.all", b"x" * 16, reply=inbox)
        for _ in range(4):
            await asyncio.wait_for(replies.get(), 60)
    out["raw_client_port"] = nc.connected_url.port
    out["raw_s1_p50"], out["raw_s1_p99"] = timed(
        lambda i: loop.run_until_complete(nc.request(f"{prefix}.one.0", b"x" * 16, timeout=60)),
        WARMUP, LATENCY)
    out["raw_gather_p50"], out["raw_gather_p99"] = timed(
        lambda i: loop.run_until_complete(gather()), 50, ROUNDS)
    loop.run_until_complete(nc.close())
finally:
    loop.close()
    for r in responders:
        r.stdin.close()
    for r in responders:
        try:
            r.wait(5)
        except subprocess.TimeoutExpired:
            r.kill()
            r.wait()
shutdown_context().get(30)
print(json.dumps(out), flush=True)
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    # loopback brokers of this script only: no credentials, so silence that warning
    env.update(PYTHONPATH=str(ROOT), MONARCH_OPEN_BROKER_OK="1", **extra)
    return env


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (an agent stops its procs), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def run_client(folder: Path, client_url: str, proc_url: str, counts: str, settle: float) -> dict:
    """Start an agent on ``proc_url`` and the client script on ``client_url``; its figures."""
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT], env=clean_env(MONARCH_NATS_URL=proc_url), cwd=folder,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        script = folder / "client.py"
        script.write_text(textwrap.dedent(CLIENT))
        env = clean_env(
            MONARCH_NATS_URL=client_url,
            BENCH_PROC_URL=proc_url,
            BENCH_COUNTS=counts,
            BENCH_RESPONDER=RESPONDER,
            BENCH_SETTLE_S=str(settle),
        )
        out = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=folder, capture_output=True, text=True,
            timeout=RUN_TIMEOUT, start_new_session=True,
        )  # fmt: skip
    finally:
        stop(agent)
    if out.returncode != 0:
        raise RuntimeError(f"client script failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_run(counts: str, settle: float) -> dict[str, dict]:
    """The three placements, each on fresh brokers."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        folder = Path(tmp)
        broker = EmbeddedBroker().start()
        try:
            results["single"] = run_client(folder, broker.url, broker.url, counts, settle)
        finally:
            broker.stop()
        with nats_cluster(folder / "cluster") as cluster:
            n0, n1 = cluster.nodes[0], cluster.nodes[1]
            results["cluster, same node"] = run_client(folder, n0.url, n0.url, counts, settle)
            r = run_client(folder, n0.url, n1.url, counts, settle)
            if r["client_port"] != n0.port or r["proc_ports"] != [n1.port]:
                raise RuntimeError(f"placement not as asked: {r}")
            results["cluster, across"] = r
    return results


FIGS = [
    ("s1_p50", "S1 call_one round trip p50", "us"),
    ("s1_p99", "S1 call_one round trip p99", "us"),
    ("raw_s1_p50", "  raw nats-py request p50", "us"),
    ("raw_s1_p99", "  raw nats-py request p99", "us"),
    ("gather_p50", "broadcast + gather x4, p50", "us"),
    ("gather_p99", "broadcast + gather x4, p99", "us"),
    ("raw_gather_p50", "  raw nats-py publish + 4 replies p50", "us"),
    ("raw_gather_p99", "  raw nats-py publish + 4 replies p99", "us"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also one JSON line per figure")
    args = ap.parse_args()
    counts = "20,200,100" if args.quick else "200,2000,1000"
    settle = 1.0 if args.quick else 8.0
    runs = []
    for i in range(args.runs):
        runs.append(one_run(counts, settle))
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr, flush=True)
    places = list(runs[0])
    med = {p: {k: statistics.median(r[p][k] for r in runs) for k, _, _ in FIGS} for p in places}
    head = (
        f"{'figure (median of ' + str(args.runs) + ' runs)':40}"
        + "".join(f"{p:>20}" for p in places)
        + f"{'across/single':>15}"
    )
    print(head)
    print("-" * len(head))
    for key, what, unit in FIGS:
        cells = "".join(f"{med[p][key]:>17.0f} {unit}" for p in places)
        ratio = med["cluster, across"][key] / med["single"][key]
        print(f"{what:40}{cells}{ratio:>14.2f}x")
    for p in places:
        ours_raw = med[p]["s1_p50"] / med[p]["raw_s1_p50"]
        gather_raw = med[p]["gather_p50"] / med[p]["raw_gather_p50"]
        print(f"{p}: S1 p50 = {ours_raw:.2f}x raw, gather p50 = {gather_raw:.2f}x raw")
    if args.json:
        for p in places:
            for key, _, unit in FIGS:
                print(json.dumps(dict(bench="cluster", placement=p, figure=key,
                                      value=round(med[p][key], 1), unit=unit,
                                      runs=[round(r[p][key], 1) for r in runs])))  # fmt: skip


if __name__ == "__main__":
    main()
