"""How long a broker node's death can hold a call, and how fast lost broadcasts are reported.

    python benchmarks/bench_node_death.py [--runs N] [--json]

Each run starts a fresh three-node NATS cluster on loopback
(``monarch.broker.connections.cluster``) and a client script against it (``MONARCH_NATS_URL``
lists the three nodes) with a 4-proc mesh, then:

  a. four threads call the mesh back to back; SIGKILL the node of a proc that
     is not the client's (where the draw allows). Figure: from the kill until
     every call that was in flight at the kill has completed or raised (the
     bound of issue 14 item 2), and how many raised ``MessageLostError``;
  b. a tight loop of broadcasts; SIGKILL the client's own node. Figure: from
     the kill until the first report of lost broadcasts reaches the sender, and
     whether, per rank, what ran plus what was reported lost is what was sent.

Medians (and the worst) over runs; one machine, all clocks ``time.monotonic()``
inside the client script. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monarch.broker.connections.cluster import nats_cluster  # noqa: E402

PRELUDE = """
    import collections, json, os, signal, threading, time
    from monarch.actor import Actor, BrokerLostError, MessageLostError, endpoint, this_host
    from monarch.core.process_runtime import runtime

    class Counter(Actor):
        def __init__(self):
            self.handled = 0

        @endpoint
        def ping(self, i):
            self.handled += 1
            return i

        @endpoint
        def incr(self):
            self.handled += 1

        @endpoint
        def count(self):
            return self.handled

        @endpoint
        def node_port(self):
            from monarch.core.process_runtime import runtime
            return runtime().nc.connected_url.port

    nodes = {int(k): v for k, v in json.loads(os.environ["BENCH_NODES"]).items()}
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    mesh = procs.spawn("counter", Counter)
    proc_nodes = list(mesh.node_port.call().get(timeout=60).values())
    client_node = runtime().nc.connected_url.port
"""

CALLS = """
    others = [p for p in proc_nodes if p != client_node]
    victim = others[0] if others else client_node
    spans, lost, stop = [], 0, threading.Event()

    def calls():
        global lost
        i = 0
        while not stop.is_set():
            i += 1
            start = time.monotonic()
            try:
                mesh.ping.call(i).get(timeout=60)
            except (MessageLostError, BrokerLostError):
                lost += 1
            spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    killed = time.monotonic()
    os.kill(nodes[victim], signal.SIGKILL)
    time.sleep(6.0)
    stop.set()
    for t in threads:
        t.join(120)
    held = [end - killed for start, end in spans if start < killed < end]
    print(json.dumps({"held_s": max(held, default=0.0), "raised": lost, "calls": len(spans)}))
    procs.stop().get(timeout=60)
"""

BROADCASTS = """
    st = mesh._state
    sent, lost, first_report = 0, collections.Counter(), None
    killed = None
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        if killed is None and time.monotonic() > end - 2.0:
            killed = time.monotonic()
            os.kill(nodes[client_node], signal.SIGKILL)
        if killed is not None and first_report is None and st.lost:
            first_report = time.monotonic() - killed
        try:
            mesh.incr.broadcast()
            sent += 1
        except MessageLostError as e:
            lost.update(e.counts)
    deadline = time.monotonic() + 10
    while first_report is None and time.monotonic() < deadline:
        if st.lost:
            first_report = time.monotonic() - killed
        time.sleep(0.001)
    time.sleep(4.0)
    while True:
        try:
            counts = list(mesh.count.call().get(timeout=30).values())
            break
        except MessageLostError as e:
            lost.update(e.counts)
        except BrokerLostError:
            time.sleep(0.2)
    exact = all(counts[r] + lost[r] == sent for r in range(4))
    print(json.dumps({
        "report_s": first_report, "sent": sent, "lost": lost[0], "exact": exact,
    }))
    procs.stop().get(timeout=60)
"""


def run_once(body: str) -> dict:
    with tempfile.TemporaryDirectory() as folder, nats_cluster(Path(folder)) as cluster:
        script = Path(folder) / "client.py"
        script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        env.update(
            PYTHONPATH=str(ROOT),
            MONARCH_NATS_URL=cluster.url,
            BENCH_NODES=json.dumps({n.port: n.proc.pid for n in cluster.nodes}),
        )
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
            cwd=folder,
        )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"client script failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    calls = [run_once(CALLS) for _ in range(args.runs)]
    casts = [run_once(BROADCASTS) for _ in range(args.runs)]
    held = [r["held_s"] for r in calls]
    reports = [r["report_s"] for r in casts if r["report_s"] is not None]
    result = {
        "runs": args.runs,
        "calls_held_after_kill_s": {"median": statistics.median(held), "max": max(held)},
        "calls_raised_per_run": [r["raised"] for r in calls],
        "broadcast_loss_reported_after_kill_s": {
            "median": statistics.median(reports) if reports else None,
            "max": max(reports) if reports else None,
        },
        "broadcasts_lost_per_run": [r["lost"] for r in casts],
        "broadcasts_all_accounted_for": all(r["exact"] for r in casts),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"node death, {args.runs} runs (3-node cluster on loopback, 4 procs)")
    print(
        f"  a. calls in flight when a proc's node dies end within: median "
        f"{result['calls_held_after_kill_s']['median']:.2f} s, max "
        f"{result['calls_held_after_kill_s']['max']:.2f} s; raised MessageLostError per run: "
        f"{result['calls_raised_per_run']}"
    )
    rep = result["broadcast_loss_reported_after_kill_s"]
    med = "n/a" if rep["median"] is None else f"{rep['median']:.2f} s"
    worst = "n/a" if rep["max"] is None else f"{rep['max']:.2f} s"
    print(
        f"  b. broadcasts lost with the client's node reported after: median {med}, max {worst}; "
        f"lost per run {result['broadcasts_lost_per_run']}; all accounted for: "
        f"{result['broadcasts_all_accounted_for']}"
    )


if __name__ == "__main__":
    main()
