"""The loopback NATS cluster the node-death tests use starts even when a port is taken.

A CI run failed when two of one cluster's ports, chosen one at a time, came out
the same (a node's route port was another node's HTTP monitor: "Router parser
ERROR ... HTTP/1.1 400 Bad Request"); the node that could not bind ended and the
start waited its whole 30 s on another node.
"""

from __future__ import annotations

import asyncio
import socket

import nats
import pytest

from monarch.broker.connections import cluster as cluster_module
from monarch.broker.connections.cluster import nats_cluster


@pytest.fixture
def taken_port():
    """A loopback port another process holds (a listening socket of this test's)."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    yield squatter.getsockname()[1]
    squatter.close()


def test_a_clusters_ports_are_all_different():
    for _ in range(20):
        ports = cluster_module._distinct_free_ports(9)
        assert len(set(ports)) == 9


def test_a_start_whose_port_was_taken_is_tried_again_on_new_ports(
    tmp_path, monkeypatch, taken_port
):
    taken = taken_port
    real = cluster_module._distinct_free_ports
    calls = []

    def first_with_a_taken_port(count):
        ports = real(count)
        if not calls:
            ports[4] = taken  # node n1's route port: it cannot listen there and ends
        calls.append(ports)
        return ports

    monkeypatch.setattr(cluster_module, "_distinct_free_ports", first_with_a_taken_port)
    # (Had the node that ended not been noticed, the first start would have failed
    # after its 30 s, "did not come up", instead of being tried again.)
    with nats_cluster(tmp_path / "cluster", timeout=30) as cluster:
        assert len(calls) == 2 and taken not in calls[1]

        async def routed():
            nc = await nats.connect(cluster.url.split(","), connect_timeout=5)
            try:
                return len(nc.servers)
            finally:
                await nc.close()

        assert asyncio.run(routed()) >= 3
        assert (tmp_path / "cluster" / "attempt2").is_dir()


def test_a_start_that_keeps_failing_says_which_node_ended(tmp_path, monkeypatch, taken_port):
    real = cluster_module._distinct_free_ports

    def always_taken(count):
        ports = real(count)
        ports[4] = taken_port
        return ports

    monkeypatch.setattr(cluster_module, "_distinct_free_ports", always_taken)
    with pytest.raises(RuntimeError, match="node n1 exited while starting"):
        with nats_cluster(tmp_path / "cluster", timeout=30, attempts=2):
            pass
