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
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

from monarch.broker.connections.server import find_nats_server, read_info


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


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` ports free a moment ago, all different (held open together while chosen).

    Chosen one at a time, two of a cluster's ports could be the same port, freed
    and handed out again: a node's route port then answering as another's HTTP
    monitor (a route "Protocol Violation", the node never routed).
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class _NodeExited(RuntimeError):
    """A node ended while the cluster was starting (most often: another process took one
    of its ports between choosing and binding it). The start is tried again on new ports."""


def _start_nodes(binary: str, folder: Path, size: int) -> Cluster:
    ports = _distinct_free_ports(3 * size)
    cluster = Cluster([Node(f"n{i}", *ports[3 * i : 3 * i + 3]) for i in range(size)])
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
    return cluster


def _wait_until_routed(cluster: Cluster, folder: Path, deadline: float) -> None:
    """Every node up, routed to all the others and with JetStream ready."""
    size = len(cluster.nodes)
    for node in cluster.nodes:
        while True:
            info = read_info("127.0.0.1", node.port)
            if info and info.get("jetstream") and len(info.get("connect_urls") or []) >= size:
                break
            for other in cluster.nodes:  # any node that ended: no waiting out the deadline
                if other.proc is not None and other.proc.poll() is not None:
                    text = (folder / f"{other.name}.log").read_text(errors="replace")[-2000:]
                    raise _NodeExited(
                        f"NATS cluster node {other.name} exited while starting:\n{text}"
                    )
            if time.monotonic() > deadline:
                text = (folder / f"{node.name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"NATS cluster node {node.name} did not come up:\n{text}")
            time.sleep(0.05)


@contextlib.contextmanager
def nats_cluster(folder: Path, size: int = 3, timeout: float = 30.0, attempts: int = 3):
    """Start ``size`` routed nats-servers; yield the :class:`Cluster`; kill them all.

    A start whose node ended (a port taken by another process meanwhile) is tried
    again on new ports, up to ``attempts`` times, each within ``timeout`` seconds.
    """
    binary = find_nats_server()
    cluster = Cluster()
    try:
        for attempt in range(1, attempts + 1):
            tried = folder if attempt == 1 else folder / f"attempt{attempt}"
            cluster = _start_nodes(binary, tried, size)
            deadline = time.monotonic() + timeout
            try:
                _wait_until_routed(cluster, tried, deadline)
                break
            except _NodeExited:
                for node in cluster.nodes:
                    node.kill()
                if attempt == attempts:
                    raise
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
