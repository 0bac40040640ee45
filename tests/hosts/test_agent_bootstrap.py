"""Procs a host agent starts bound (``proc_bind``) or with a client's command (``bootstrap_command``,
``with_python_executable``), as Monarch 0.7's host meshes start them."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from monarch.actor import ProcStartError, attach_to_workers
from monarch.actors.procs.command_launcher import BootstrapCommand, default_bootstrap_cmd
from tests.helpers import cpu_binds
from tests.hosts.agents import start_agent, unique_label
from tests.hosts.host_actors import HowStarted

# Debian's numactl, on a machine with NUMA node 0 (every Linux one shows node0).
HAS_NUMACTL = (
    shutil.which("numactl") is not None and Path("/sys/devices/system/node/node0").is_dir()
)


@pytest.fixture(scope="module")
def agent(nats_url):
    a = start_agent("binder", "--labels", f"t={unique_label()}").wait_ready()
    try:
        yield a
    finally:
        a.stop()


def _how(hosts, **spawn) -> list[dict]:
    procs = hosts.spawn_procs(**spawn)
    try:
        got = procs.spawn("how", HowStarted).how.call().get(timeout=60)
        return [v for _, v in sorted(got.items(), key=lambda kv: kv[0].rank)]
    finally:
        procs.stop().get(timeout=60)


def test_proc_bind_through_an_agent_pins_cpus(agent):
    cpus, binds = cpu_binds()
    hosts = attach_to_workers(workers=[agent.uid], timeout=30)
    got = _how(hosts, per_host={"gpus": 2}, proc_bind=binds, name="bound")
    assert {g["host_uid"] for g in got} == {agent.uid}  # the agent started them, not we
    assert got[0]["cpus"] == [cpus[0]]
    assert got[1]["cpus"] == list(range(cpus[0], cpus[1] + 1))
    assert [g["memory_policy"] for g in got] == ["default", "default"]
    # The next mesh of the same host is unbound again.
    assert _how(hosts, per_host={"gpus": 1}, name="free")[0]["cpus"] == cpus


@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl is not installed (.ci/run installs it)")
def test_proc_bind_through_an_agent_binds_numa_nodes_under_numactl(agent):
    node0 = Path("/sys/devices/system/node/node0/cpulist").read_text().strip()
    lo, _, hi = node0.partition("-")
    hosts = attach_to_workers(workers=[agent.uid], timeout=30)
    binds = [{"cpunodebind": "0", "membind": "0"}, {"membind": "0"}]
    got = _how(hosts, per_host={"gpus": 2}, proc_bind=binds, name="numa")
    assert {g["host_uid"] for g in got} == {agent.uid}
    assert got[0]["cpus"] == list(range(int(lo), int(hi or lo) + 1))
    assert [g["memory_policy"] for g in got] == ["bind:0", "bind:0"]


def test_a_binding_the_agents_machine_cannot_give_fails_the_mesh_naming_it(agent):
    hosts = attach_to_workers(workers=[agent.uid], timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "4000"}], name="nope")
    with pytest.raises(ProcStartError, match=r"binder.*proc_bind CPUs \[4000\] are not among"):
        procs.initialized.get(timeout=60)
    procs = hosts.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"membind": "63"}], name="nope2")
    with pytest.raises(ProcStartError, match=r"NUMA node\(s\) \[63\]"):
        procs.initialized.get(timeout=60)
    # Malformed bindings are refused by the caller, before any request.
    with pytest.raises(ValueError, match="must equal procs_per_host"):
        hosts.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="unknown proc_bind key"):
        hosts.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cores": "0"}])
    # The agent still starts procs.
    assert _how(hosts, per_host={"gpus": 1}, name="after")[0]["host_uid"] == agent.uid


def test_bootstrap_command_through_an_agent_per_point_and_without_the_environment(agent):
    hosts = attach_to_workers(workers=[agent.uid], timeout=30)

    def per_point(point) -> BootstrapCommand:
        cmd = default_bootstrap_cmd().with_env({"HOW_MARK": f"proc-{point['gpus']}"})
        return BootstrapCommand(cmd.program, f"monarch-proc-{point['gpus']}", cmd.args, cmd.env)

    got = _how(hosts, per_host={"gpus": 2}, bootstrap_command=per_point, name="marked")
    assert [g["mark"] for g in got] == ["proc-0", "proc-1"]
    assert [g["argv0"] for g in got] == ["monarch-proc-0", "monarch-proc-1"]
    assert {g["host_uid"] for g in got} == {agent.uid}
    bare = BootstrapCommand(sys.executable, None, default_bootstrap_cmd().args, {}, False)
    got = _how(hosts, per_host={"gpus": 1}, bootstrap_command=bare, name="bare")
    assert got[0]["home"] is None and got[0]["host_uid"] == agent.uid
    # Not kept on the host mesh: the next spawn starts procs the agent's way.
    got = _how(hosts, per_host={"gpus": 1}, name="plain")
    assert got[0]["mark"] is None and got[0]["argv0"] == sys.executable
    # A command function that gives something else fails the mesh, as on this machine.
    procs = hosts.spawn_procs(
        per_host={"gpus": 1}, bootstrap_command=lambda point: "python", name="bad"
    )
    with pytest.raises(TypeError, match="not a BootstrapCommand"):
        procs.initialized.get(timeout=60)


def test_with_python_executable_through_an_agent(agent, tmp_path):
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nHOW_WRAPPER_PID=$$ exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    hosts = attach_to_workers(workers=[agent.uid], timeout=30).with_python_executable(str(wrapper))
    got = _how(hosts, per_host={"gpus": 2}, name="wrapped")
    assert all(g["wrapper"] for g in got) and got[0]["wrapper"] != got[1]["wrapper"]


def test_an_agent_with_pickle_off_refuses_a_clients_command(nats_url):
    env = dict(os.environ, MONARCH_PICKLE="0")
    strict = start_agent("strict", "--labels", f"t={unique_label()}", env=env).wait_ready()
    try:
        hosts = attach_to_workers(workers=[strict.uid], timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1}, bootstrap_command=default_bootstrap_cmd())
        with pytest.raises(ProcStartError, match="strict.*MONARCH_PICKLE=0"):
            procs.initialized.get(timeout=60)
    finally:
        strict.stop()


def test_an_older_agent_is_refused_what_it_would_ignore(agent):
    hosts = attach_to_workers(workers=[agent.uid], timeout=30)
    assert hosts.hosts[0].features == ["bind", "command"]
    hosts.hosts[0].features = []  # as an agent of an earlier version registers
    procs = hosts.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "0"}], name="old")
    with pytest.raises(ProcStartError, match="cannot start procs with a proc_bind.*older"):
        procs.initialized.get(timeout=60)
    procs = hosts.spawn_procs(
        per_host={"gpus": 1}, bootstrap_command=default_bootstrap_cmd(), name="old2"
    )
    with pytest.raises(ProcStartError, match="cannot start procs with a bootstrap_command"):
        procs.initialized.get(timeout=60)
