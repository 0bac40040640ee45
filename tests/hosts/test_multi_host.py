"""Meshes across host agents: placement, devices, failures reported through supervision."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

from monarch.actor import ProcStartError, SupervisionError, attach_to_workers, hosts_from_config
from tests.helpers import pid_alive, wait_until
from tests.hosts.agents import ROOT, start_agent, unique_label
from tests.hosts.host_actors import Where


@pytest.fixture(scope="module")
def two_hosts(nats_url):
    """Two agents sharing a label no other test uses; stopped after the module."""
    label = unique_label()
    agents = [start_agent(n, "--labels", f"t={label},mesh=m{label}") for n in ("h0", "h1")]
    try:
        yield label, [a.wait_ready() for a in agents]
    finally:
        for a in agents:
            a.stop()


def test_mesh_spans_the_agents_and_each_proc_sees_its_own_gpu(two_hosts):
    label, agents = two_hosts
    hosts = attach_to_workers(workers=["h1", "h0"], labels={"t": label}, timeout=30)
    assert [h.uid for h in hosts.hosts] == [agents[1].uid, agents[0].uid]
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        assert dict(procs.extent) == {"hosts": 2, "gpus": 2}
        where = procs.spawn("where", Where).where.call().get(timeout=60)
        for point, w in where.items():
            agent = agents[1 - point["hosts"]]  # workers were named in reverse
            assert w["host_uid"] == agent.uid and w["ppid"] == agent.pid
            assert w["cuda"] == str(point["gpus"])
            assert w["rank"] == point.rank
    finally:
        procs.stop().get(timeout=60)


def test_hosts_by_count_by_config_name_and_a_clear_timeout(two_hosts):
    label, agents = two_hosts
    assert attach_to_workers(hosts=2, labels={"t": label}, timeout=30).size("hosts") == 2
    assert {h.uid for h in hosts_from_config(f"m{label}", timeout=30).hosts} == {
        a.uid for a in agents
    }
    # As in Monarch, a mesh comes back anyway and says why once it is used.
    nobody = attach_to_workers(hosts=1, labels={"t": "nobody-has-this"}, timeout=0.5)
    with pytest.raises(TimeoutError, match=r"0 live agent\(s\) of the 1 asked for"):
        nobody.initialized.get(timeout=5)
    with pytest.raises(TimeoutError, match=r"0 live agent\(s\) of the 1 asked for"):
        nobody.spawn_procs(per_host={"gpus": 1})
    assert nobody.hosts == [] and "attach failed" in repr(nobody)
    with pytest.raises(ValueError, match="never reached its hosts"):
        pickle.dumps(nobody)
    missing_one = attach_to_workers(workers=["h0", "h9"], labels={"t": label}, timeout=0.5)
    with pytest.raises(TimeoutError, match=r"no live agent for \['h9'\]"):
        missing_one.initialized.get(timeout=5)
    assert missing_one.size("hosts") == 2


def test_proc_exit_on_a_host_is_reported_at_once(two_hosts, root_faults):
    label, _ = two_hosts
    procs = attach_to_workers(hosts=2, labels={"t": label}, timeout=30).spawn_procs(
        per_host={"gpus": 1}
    )
    try:
        w = procs.spawn("exiting", Where)
        w.ping.call().get(timeout=60)
        with pytest.raises(SupervisionError, match="exited with code 7"):
            w.slice(hosts=1).exit.call_one(7).get(timeout=30)
        (failure,) = root_faults.wait(1)
        assert failure.reason == "proc_died" and failure.ranks == [1]
        assert w.slice(hosts=0).ping.call_one(3).get(timeout=30) == 3
    finally:
        procs.stop().get(timeout=60)


def test_spawning_more_than_a_host_takes_fails_clearly(nats_url):
    agent = start_agent("tiny", "--labels", f"t={unique_label()}", "--capacity", "1").wait_ready()
    try:
        procs = attach_to_workers(workers=[agent.uid], timeout=30).spawn_procs(per_host={"gpus": 2})
        with pytest.raises(ProcStartError, match="at most 1"):
            procs.initialized.get(timeout=60)
    finally:
        agent.stop()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_silent_or_killed_host_fails_its_ranks_through_supervision(nats_url, root_faults, how):
    """A killed agent takes its procs along; a stopped one just goes silent. Either way, its
    ranks are declared dead by heartbeat, and its procs do not linger."""
    label = unique_label()
    agents = [start_agent(n, "--labels", f"t={label}") for n in ("ok", "doomed")]
    procs = None
    try:
        for a in agents:
            a.wait_ready()
        procs = attach_to_workers(workers=["ok", "doomed"], labels={"t": label}, timeout=30)
        procs = procs.spawn_procs(per_host={"gpus": 2})
        w = procs.spawn("w", Where)
        pids = [x["pid"] for x in w.where.call().get(timeout=60).values()]
        os.kill(agents[1].pid, getattr(signal, how))
        failures = root_faults.wait(2)
        with pytest.raises(SupervisionError, match="no heartbeat"):
            w.slice(hosts=1).ping.call().get(timeout=30)
        assert sorted(r for f in failures for r in f.ranks) == [2, 3]
        assert {f.reason for f in failures} == {"heartbeat_lost"}
        if how == "SIGSTOP":  # its procs still beat: the host's silence alone fails them
            assert all(f"host agent {agents[1].uid} is gone" in f.message for f in failures)
        assert list(w.slice(hosts=0).ping.call(1).get(timeout=30).values()) == [1, 1]
        if how == "SIGSTOP":
            os.kill(agents[1].pid, signal.SIGCONT)  # it wakes up to the kill request
        assert wait_until(lambda: not any(pid_alive(p) for p in pids[2:]), timeout=30)
    finally:
        if procs is not None:
            procs.stop().get(timeout=60)
        for a in agents:
            if a.popen.poll() is None:
                os.kill(a.pid, signal.SIGCONT)
            a.stop()


def test_agent_kills_the_procs_of_a_client_that_died(two_hosts, tmp_path):
    """The procs would wait a minute for their client's heartbeat (the job's setting, which
    they get from it); the agent watches the client too, with its own timeout."""
    label, _ = two_hosts
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            from monarch.actor import attach_to_workers
            from tests.hosts.host_actors import Where
            procs = attach_to_workers(hosts=2, labels={{"t": "{label}"}}, timeout=30)
            procs = procs.spawn_procs(per_host={{"gpus": 1}})
            w = procs.spawn("w", Where)
            print([x["pid"] for x in w.where.call().get(timeout=60).values()], flush=True)
            time.sleep(120)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), MONARCH_HEARTBEAT_TIMEOUT="60")
    client = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pids = eval(client.stdout.readline())
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        client.kill()
        client.wait(10)
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
