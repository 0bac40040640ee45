"""Three hosts, each in its own network namespace, reaching the broker over a bridge.

The closest thing to a cluster one machine offers: each agent (and every proc
it starts) sees only its own network interface and address, and reaches the
broker, which listens on the bridge's address only, across that network.
Then one host is unplugged and another loses power, and the client hears of
both through supervision.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from monarch.actor import SupervisionError, attach_to_workers
from monarch.broker.connections.server import EmbeddedBroker
from tests.helpers import wait_until
from tests.hosts.agents import start_agent, unique_label
from tests.hosts.host_actors import Where
from tests.hosts.netns import Lab, unavailable


@contextlib.contextmanager
def client_runtime_on(url: str):
    """This process's client runtime, connected to ``url`` for the duration (then as before)."""
    from monarch.core.process_runtime import shutdown_runtime
    from monarch.settings import settings

    saved = os.environ.get("MONARCH_NATS_URL")
    shutdown_runtime()
    os.environ["MONARCH_NATS_URL"] = url
    settings.cache_clear()
    try:
        yield
    finally:
        shutdown_runtime()
        if saved is None:
            os.environ.pop("MONARCH_NATS_URL", None)
        else:
            os.environ["MONARCH_NATS_URL"] = saved
        settings.cache_clear()


@pytest.fixture
def lab():
    why = unavailable()
    if why is not None:
        pytest.skip(f"network namespaces unavailable: {why}")
    lab = Lab(3).open()
    broker = None
    try:
        broker = EmbeddedBroker(host=lab.gateway).start()
        with client_runtime_on(broker.url):
            yield lab, broker.url
    finally:
        lab.close()
        if broker is not None:
            broker.stop()


def test_mesh_across_namespaced_hosts_and_losing_two_of_them(lab, root_faults):
    lab, url = lab
    label = unique_label()
    agents = [
        start_agent(f"node{i}", "--labels", f"t={label}", "--nats-url", url, prefix=lab.prefix(i))
        for i in range(3)
    ]
    procs = None
    try:
        for a in agents:
            a.wait_ready()
        hosts = attach_to_workers(hosts=3, labels={"t": label}, timeout=30)
        # Each agent registered the address it reaches the broker from: its namespace's.
        assert [h.address for h in hosts.hosts] == lab.addresses
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        where = procs.spawn("where", Where).where.call().get(timeout=60)
        for point, w in where.items():
            h = point["hosts"]
            assert w["address"] == lab.addresses[h]  # procs too go over their host's network
            assert w["host_uid"] == agents[h].uid and w["cuda"] == str(point["gpus"])
        w = procs.spawn("w", Where)
        w.ping.call().get(timeout=60)

        lab.unplug(2)  # cut off: its agent and procs live on, unheard
        lab.kill(1)  # power cut: agent and procs die at once, nobody reports it
        failures = root_faults.wait(8)  # ranks 2..5 of both meshes
        lost = sorted((f.mesh_name, r) for f in failures for r in f.ranks)
        assert lost == sorted((m, r) for m in ("where", "w") for r in (2, 3, 4, 5))
        assert {f.reason for f in failures} == {"heartbeat_lost"}
        with pytest.raises(SupervisionError):
            w.slice(hosts=2).ping.call().get(timeout=30)
        assert list(w.slice(hosts=0).ping.call(7).get(timeout=30).values()) == [7, 7]
        # Nobody can reach the unplugged host, yet its procs end (their agent, or they
        # themselves, hear the client no more): no orphans.
        assert wait_until(lambda: set(lab.pids(2)) <= {agents[2].pid}, timeout=30)
    finally:
        if procs is not None:
            procs.stop().get(timeout=60)
        for i in (1, 2):
            lab.kill(i)
        for a in agents:
            a.stop()
