"""A broker node of a three-node cluster dies under a running job.

The client script runs against the cluster (``MONARCH_NATS_URL`` lists the three
nodes; each process picks one at random) and SIGKILLs one node while it calls
or broadcasts in a loop. Nothing may hang, nothing may be lost without someone
being told: every call completes or raises within its timeout, every
broadcast was either run or reported lost, per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from monarch.broker.connections.cluster import nats_cluster

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
    import collections, json, os, signal, threading, time
    from monarch.actor import BrokerLostError, MessageLostError, this_host
    from monarch.actors.process_state import actor_process
    from monarch.core.process_runtime import runtime
    from tests.reliability.node_actors import Counter

    nodes = {int(k): v for k, v in json.loads(os.environ["TEST_NODES"]).items()}
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    mesh = procs.spawn("counter", Counter)
    proc_nodes = list(mesh.node_port.call().get(timeout=60).values())
    client_node = runtime().nc.connected_url.port
"""


def run_job(tmp_path: Path, body: str, timeout: float = 180.0) -> dict:
    """Run PRELUDE + ``body`` against a fresh cluster; the JSON its last line prints."""
    with nats_cluster(tmp_path / "cluster") as cluster:
        script = tmp_path / "client.py"
        script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        env.update(
            PYTHONPATH=str(ROOT),
            MONARCH_NATS_URL=cluster.url,
            TEST_NODES=json.dumps({n.port: n.proc.pid for n in cluster.nodes}),
        )
        result = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout
        )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(report)
    return report


def test_calls_complete_or_raise_when_a_replying_procs_node_dies(tmp_path):
    """The issue's case: the node of a proc (not the client's, where the draw allows) dies
    while mesh calls run back to back; its replies in flight die with it."""
    report = run_job(
        tmp_path,
        """
        others = [p for p in proc_nodes if p != client_node]
        victim = others[0] if others else client_node
        outcomes = collections.Counter()
        durations, wrong = [], []
        stop = threading.Event()

        def calls():
            i = 0
            while not stop.is_set():
                i += 1
                start = time.monotonic()
                try:
                    values = list(mesh.ping.call(i).get(timeout=30).values())
                    outcomes["ok"] += 1
                    if values != [i] * 4:
                        wrong.append(values)
                except (MessageLostError, BrokerLostError) as e:
                    outcomes[type(e).__name__] += 1
                except Exception as e:
                    outcomes["other: " + repr(e)[:200]] += 1
                durations.append(time.monotonic() - start)

        threads = [threading.Thread(target=calls) for _ in range(4)]  # 4 calls in flight
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        os.kill(nodes[victim], signal.SIGKILL)
        time.sleep(4.0)
        stop.set()
        for thread in threads:
            thread.join(90)
        print(json.dumps({
            "hung": any(t.is_alive() for t in threads), "outcomes": outcomes, "wrong": wrong[:3],
            "max_s": max(durations), "calls": len(durations),
            "victim_hosts": proc_nodes.count(victim), "victim_is_client": victim == client_node,
            "after": list(mesh.ping.call(-1).get(timeout=30).values()),
            "probes": actor_process(runtime()).prober.probes,
            "resent": sum(mesh.replies_resent.call().get(timeout=30).values()),
        }))
        procs.stop().get(timeout=60)
        """,
    )
    assert not report["hung"]
    assert [k for k in report["outcomes"] if k.startswith("other")] == []
    assert report["wrong"] == []
    assert report["outcomes"]["ok"] > 0
    assert report["after"] == [-1] * 4  # the job goes on over the two nodes left


def test_broadcasts_lost_with_the_clients_node_are_reported(tmp_path):
    """Broadcasts in a tight loop while the client's own node dies: per rank, what the
    actor ran plus what was reported lost to the sender is exactly what was sent."""
    report = run_job(
        tmp_path,
        """
        sent = 0
        lost = collections.Counter()

        def broadcast_for(seconds):
            global sent
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    mesh.incr.broadcast()
                    sent += 1
                except MessageLostError as e:  # that broadcast was not sent
                    lost.update(e.counts)

        broadcast_for(1.0)
        os.kill(nodes[client_node], signal.SIGKILL)
        broadcast_for(2.0)
        time.sleep(4.0)  # the sync markers go out, the loss reports come back
        while True:
            try:
                counts = list(mesh.count.call().get(timeout=30).values())
                break
            except MessageLostError as e:
                lost.update(e.counts)
            except BrokerLostError:
                time.sleep(0.2)
        print(json.dumps({
            "sent": sent, "handled": counts, "lost": [lost[r] for r in range(4)],
        }))
        procs.stop().get(timeout=60)
        """,
    )
    assert report["sent"] > 0
    for rank in range(4):
        assert report["handled"][rank] + report["lost"][rank] == report["sent"], report
