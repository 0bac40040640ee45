"""A NATS cluster of a few nodes on this machine: routed nats-servers on loopback, JetStream on.

For trying what a job does when a broker node dies (the tests and
``benchmarks/bench_node_death.py`` SIGKILL one), without a real cluster.
Point ``MONARCH_NATS_URL`` at :attr:`Cluster.url`; each process connects to
one node at random and moves to another when its node goes away. No
credentials: loopback only, for experiments.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

from monarch.broker.connections.server import find_nats_server, free_port, read_info


@dataclass
class Node:
    name: str
    port: int
    route_port: int
    monitor_port: int = 0  # HTTP monitoring (/connz says who is connected where)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL: the node vanishes with whatever it had not forwarded yet."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@dataclass
class Cluster:
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """What ``MONARCH_NATS_URL`` is set to: every node, comma-separated."""
        return ",".join(n.url for n in self.nodes)

    def node_at(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)


def _config(node: Node, nodes: list[Node], store: Path) -> str:
    routes = ", ".join(f"nats-route://127.0.0.1:{n.route_port}" for n in nodes if n is not node)
    return (
        f"server_name: {node.name}\n"
        f"listen: 127.0.0.1:{node.port}\n"
        f"http: 127.0.0.1:{node.monitor_port}\n"
        f'jetstream {{ store_dir: "{store}" }}\n'
        f"cluster {{ name: monarch-test, listen: 127.0.0.1:{node.route_port}, "
        f"routes: [{routes}] }}\n"
    )


@contextlib.contextmanager
def nats_cluster(folder: Path, size: int = 3, timeout: float = 30.0):
    """Start ``size`` routed nats-servers; yield the :class:`Cluster`; kill them all."""
    binary = find_nats_server()
    cluster = Cluster([Node(f"n{i}", free_port(), free_port(), free_port()) for i in range(size)])
    try:
        for node in cluster.nodes:
            store = folder / node.name
            store.mkdir(parents=True, exist_ok=True)
            conf = folder / f"{node.name}.conf"
            conf.write_text(_config(node, cluster.nodes, store))
            log = open(folder / f"{node.name}.log", "wb")  # noqa: SIM115
            node.proc = subprocess.Popen(
                [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            log.close()
        deadline = time.monotonic() + timeout
        for node in cluster.nodes:  # every node up, routed and with JetStream ready
            while True:
                info = read_info("127.0.0.1", node.port)
                if info and info.get("jetstream") and len(info.get("connect_urls") or []) >= size:
                    break
                if time.monotonic() > deadline or node.proc.poll() is not None:
                    text = (folder / f"{node.name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"NATS cluster node {node.name} did not come up:\n{text}")
                time.sleep(0.05)
        asyncio.run(_wait_for_jetstream(cluster, deadline))
        yield cluster
    finally:
        for node in cluster.nodes:
            node.kill()
        os.sync()


async def _wait_for_jetstream(cluster: Cluster, deadline: float) -> None:
    """Until the nodes have elected a JetStream meta leader (streams can be made)."""
    nc = await nats.connect(cluster.url.split(","), connect_timeout=5)
    try:
        while True:
            try:
                await nc.jetstream().account_info()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await nc.close()
