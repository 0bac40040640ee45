"""A host agent on a NATS cluster keeps starting procs after the server it first used is gone.

The agent is given all three servers of a cluster. Its procs must be given all
three as well: a proc handed only the server the agent happened to connect to
at start cannot reach the broker once that server is down ("cannot connect to
the broker at nats://nats:4222" in docker-compose.cluster.yml, issue 35).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request

from monarch.broker.connections.cluster import Node, nats_cluster
from tests.helpers import wait_until
from tests.hosts.agents import ROOT, start_agent, unique_label

CLIENT = """
    import json, os
    from monarch.actor import attach_to_workers
    from tests.hosts.host_actors import Where

    hosts = attach_to_workers(hosts=1, labels={"t": os.environ["TEST_LABEL"]}, timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        where = procs.spawn("where", Where).where.call().get(timeout=60)
        print(json.dumps([w["host_uid"] for w in where.values()]))
    finally:
        procs.stop().get(timeout=60)
"""


def connection_names(node: Node) -> set[str]:
    """The names of the clients connected to ``node`` (its monitoring endpoint)."""
    url = f"http://127.0.0.1:{node.monitor_port}/connz?limit=1000"
    with urllib.request.urlopen(url, timeout=5) as r:
        return {c.get("name", "") for c in json.load(r)["connections"]}


def test_procs_started_after_the_agents_first_server_died_reach_the_broker(tmp_path):
    label = unique_label()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    with nats_cluster(tmp_path / "cluster") as cluster:
        agent = start_agent(
            "failover", "--nats-url", cluster.url, "--labels", f"t={label}", env=env
        ).wait_ready()
        try:
            name = f"monarch-host-{agent.uid}"
            assert wait_until(
                lambda: any(name in connection_names(n) for n in cluster.nodes), timeout=10
            )
            first = next(n for n in cluster.nodes if name in connection_names(n))
            first.kill()
            others = [n for n in cluster.nodes if n is not first]
            # The agent has moved to a live server before the client asks it for procs.
            assert wait_until(lambda: any(name in connection_names(n) for n in others), timeout=30)
            script = tmp_path / "client.py"
            script.write_text(textwrap.dedent(CLIENT))
            client_env = dict(
                env,
                PYTHONPATH=str(ROOT),
                TEST_LABEL=label,
                MONARCH_NATS_URL=",".join(n.url for n in others),
            )
            out = subprocess.run(
                [sys.executable, str(script)],
                env=client_env,
                capture_output=True,
                text=True,
                timeout=150,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            assert json.loads(out.stdout.strip().splitlines()[-1]) == [agent.uid, agent.uid]
        finally:
            agent.stop()
