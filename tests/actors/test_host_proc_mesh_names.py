"""HostMesh and ProcMesh names from Monarch 0.7: shutdown, stop, bootstrap, rank tensors.

``HostMesh.shutdown()``, ``HostMesh.stop()``, ``with_python_executable``, ``is_fake_in_process``,
``default_bootstrap_cmd`` (with ``spawn_procs(bootstrap_command=...)``),
``spawn_procs(bootstrap=...)``,
``spawn_procs(proc_bind=...)`` and ``ProcMesh.rank_tensor`` / ``rank_tensors``
behave as in Monarch 0.7; each
test starts real procs (or real host agents) and checks what they report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from monarch.actor import (
    ActorError,
    HostMesh,
    SupervisionError,
    attach_to_workers,
    this_host,
    this_proc,
)
from monarch.actors.procs.command_launcher import BootstrapCommand, default_bootstrap_cmd
from tests.actors.ref_actors import (
    Box,
    Hop,
    SeesBootstrap,
    Where,
    WrapperProbe,
    fail_bootstrap,
    mark_bootstrapped,
    mark_bootstrapped_async,
)
from tests.helpers import cpu_binds, pid_alive, proc_mesh_fixture
from tests.hosts.agents import start_agent, unique_label

# -- is_fake_in_process ----------------------------------------------------------------


def test_this_host_runs_real_processes_not_fake_ones(nats_url):
    hm = this_host()
    assert hm.is_fake_in_process is False
    assert hm.with_python_executable(sys.executable).is_fake_in_process is False
    procs = hm.spawn_procs(per_host={"gpus": 2}, name="notfake")
    try:
        pids = [v["pid"] for v in procs.spawn("w", Where).where.call().get(timeout=60).values()]
        assert len(set(pids)) == 2 and os.getpid() not in pids
    finally:
        procs.stop().get(timeout=60)


# -- default_bootstrap_cmd and bootstrap_command ---------------------------------------


def test_default_bootstrap_cmd_is_this_python_and_with_env_copies():
    cmd = default_bootstrap_cmd()
    assert isinstance(cmd, BootstrapCommand)
    assert cmd.program == sys.executable
    assert cmd.args == ["-m", "monarch.actors.hosting.proc"]
    assert cmd.env == {} and cmd.inherit_env is True and cmd.arg0 is None
    changed = cmd.with_env({"A": "1"}).with_env({"B": None})
    assert changed.env == {"A": "1", "B": None}
    assert cmd.env == {}  # the original is unchanged


def test_spawn_procs_with_bootstrap_command_sets_env_only_for_that_mesh(nats_url):
    cmd = default_bootstrap_cmd().with_env({"REF_TEST_MARK": "3"})
    marked = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd, name="marked")
    plain = this_host().spawn_procs(per_host={"gpus": 1}, name="plain")
    try:
        probe = marked.spawn("probe", WrapperProbe)
        assert probe.env.call_one("REF_TEST_MARK").get(timeout=60) == "3"
        assert probe.env.call_one("MONARCH_RANK").get(timeout=60) == "0"
        other = plain.spawn("probe", WrapperProbe)
        assert other.env.call_one("REF_TEST_MARK").get(timeout=60) is None
    finally:
        marked.stop().get(timeout=60)
        plain.stop().get(timeout=60)


def test_bootstrap_command_per_point_arg0_and_empty_env(nats_url, monkeypatch):
    monkeypatch.setenv("REF_TEST_INHERITED", "yes")

    def per_point(point):
        cmd = BootstrapCommand(
            sys.executable,
            arg0=f"proc-{point['gpus']}",
            args=["-m", "monarch.actors.hosting.proc"],
            env={"REF_TEST_GPU": str(point["gpus"])},
            inherit_env=False,
        )
        return cmd

    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=per_point, name="pp")
    try:
        probe = procs.spawn("probe", WrapperProbe)
        assert list(probe.env.call("REF_TEST_GPU").get(timeout=60).values()) == ["0", "1"]
        assert list(probe.argv0.call().get(timeout=60).values()) == ["proc-0", "proc-1"]
        assert list(probe.env.call("REF_TEST_INHERITED").get(timeout=60).values()) == [None] * 2
    finally:
        procs.stop().get(timeout=60)


def test_bootstrap_command_not_a_command_fails_the_mesh(nats_url):
    procs = this_host().spawn_procs(
        per_host={"gpus": 1}, bootstrap_command=lambda point: "python", name="bad"
    )
    with pytest.raises(TypeError, match="not a BootstrapCommand"):
        procs.initialized.get(timeout=60)
    procs.stop().get(timeout=60)


def test_proc_bind_pins_each_proc_of_a_host_to_its_cpus(nats_url):
    cpus, binds = cpu_binds()
    procs = this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=binds, name="bound")
    try:
        got = procs.spawn("probe", WrapperProbe).affinity.call().get(timeout=60)
        assert list(got.values()) == [[cpus[0]], list(range(cpus[0], cpus[1] + 1))]
    finally:
        procs.stop().get(timeout=60)


@pytest.mark.skipif(
    shutil.which("numactl") is None or not os.path.isdir("/sys/devices/system/node/node0"),
    reason="numactl is not installed (.ci/run installs it)",
)
def test_proc_bind_numa_keys_start_the_proc_under_numactl(nats_url):
    binds = [{"cpunodebind": "0", "membind": "0"}, {"membind": "0"}]
    procs = this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=binds, name="numa")
    try:
        got = procs.spawn("probe", WrapperProbe).memory_policy.call().get(timeout=60)
        assert list(got.values()) == ["bind:0", "bind:0"]
    finally:
        procs.stop().get(timeout=60)


def test_proc_bind_and_bootstrap_refusals_are_clear(nats_url):
    with pytest.raises(ValueError, match="must equal procs_per_host"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match=r"NUMA node\(s\) \[63\], which .* does not have"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"membind": "63"}])
    with pytest.raises(ValueError, match=r"CPUs \[4000\] are not among the CPUs procs may use"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "4000"}])
    with pytest.raises(ValueError, match="takes its CPUs as 'physcpubind'"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "0", "membind": "0"}])
    with pytest.raises(ValueError, match="'0-x' is not a CPU list"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "0-x"}])
    with pytest.raises(ValueError, match="unknown proc_bind key"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"numa": "0"}])
    with pytest.raises(TypeError, match="bootstrap must be a function"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap="setup.sh")


# -- spawn_procs(bootstrap=...) --------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "how"), [(mark_bootstrapped, "sync"), (mark_bootstrapped_async, "async")]
)
def test_bootstrap_runs_on_every_proc_before_its_first_actor(nats_url, setup, how):
    # As Monarch's: spawned at once, not after waiting on initialized; each actor's
    # __init__ already sees what the function did in its proc.
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=setup, name="booted")
    try:
        seen = procs.spawn("sees", SeesBootstrap).seen_at_init.call().get(timeout=60)
        assert sorted(seen.values(), key=str) == sorted(
            ((f"{how} {pid}", pid) for _, pid in seen.values()), key=str
        )
        assert len({pid for _, pid in seen.values()}) == 2
        assert procs.initialized.get(timeout=60) is True
    finally:
        procs.stop().get(timeout=60)


def test_a_failing_bootstrap_fails_initialized_and_spawns_with_its_error(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=fail_bootstrap, name="unbooted")
    try:
        with pytest.raises(ActorError, match="the scratch disk is not mounted") as info:
            procs.initialized.get(timeout=60)
        assert isinstance(info.value.exception, RuntimeError)
        with pytest.raises(SupervisionError, match="the scratch disk is not mounted"):
            procs.spawn("sees", SeesBootstrap).seen_at_init.call().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)


# -- with_python_executable --------------------------------------------------------------


@pytest.fixture
def wrapper(tmp_path):
    """A Python 'executable' that is a shell script marking its procs, then running Python."""
    path = tmp_path / "python-wrapper"
    path.write_text(f'#!/bin/sh\nexport WRAPPER_MARKER_PID=$$\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_with_python_executable_starts_procs_and_their_procs_with_it(nats_url, wrapper):
    host = this_host().with_python_executable(wrapper)
    assert isinstance(host, HostMesh) and host is not this_host()
    procs = host.spawn_procs(per_host={"procs": 1}, name="wrapped")
    try:
        probe = procs.spawn("probe", WrapperProbe)
        direct = probe.marker.call_one().get(timeout=60)
        assert direct != ""
        inner = probe.spawn_inner.call_one().get(timeout=60)  # this_host() inside the proc
        nested = inner.marker.call_one().get(timeout=60)
        assert nested != "" and nested != direct
        # this_host() itself is unchanged: its procs start with the default Python
        plain = this_host().spawn_procs(per_host={"procs": 1}, name="unwrapped")
        try:
            assert plain.spawn("probe", WrapperProbe).marker.call_one().get(timeout=60) == ""
        finally:
            plain.stop().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)


# -- HostMesh.shutdown --------------------------------------------------------------------


def test_shutdown_of_a_host_mesh_reference_raises_runtime_error(nats_url):
    for hm in (this_host(), this_host().with_python_executable(sys.executable)):
        fut = hm.shutdown()
        with pytest.raises(RuntimeError, match="reference instead of owned"):
            fut.get(timeout=10)
    # and this_host() still works afterwards
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="after")
    try:
        assert procs.spawn("w", Where).add.call_one(1).get(timeout=60) == 2
    finally:
        procs.stop().get(timeout=60)


@pytest.fixture
def one_agent(nats_url):
    label = unique_label()
    agent = start_agent("ref-h0", "--labels", f"t={label}").wait_ready()
    try:
        yield label, agent
    finally:
        agent.stop()


def test_shutdown_of_an_owned_host_mesh_stops_its_procs(one_agent):
    label, agent = one_agent
    hosts = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2}, name="owned")
    pids = [v["pid"] for v in procs.spawn("w", Where).where.call().get(timeout=60).values()]
    assert all(pid_alive(p) for p in pids)
    # a slice is a reference: it may not shut the hosts down
    with pytest.raises(RuntimeError, match="reference"):
        hosts.slice(hosts=0).shutdown().get(timeout=10)
    assert hosts.shutdown().get(timeout=60) is None
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="already been shut down"):
        hosts.spawn_procs(per_host={"gpus": 1})
    with pytest.raises(RuntimeError, match="already been shut down"):
        hosts.shutdown().get(timeout=10)
    assert agent.popen.poll() is None  # the agent itself keeps serving other clients


def test_stop_of_an_owned_host_mesh_stops_only_its_own_procs(one_agent):
    # As Monarch's HostMesh.stop: its procs end, another host mesh's procs on the
    # same host do not, and the host stays for a new host mesh.
    label, agent = one_agent
    first = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    second = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    mine = first.spawn_procs(per_host={"gpus": 2}, name="first")
    theirs = second.spawn_procs(per_host={"gpus": 1}, name="second")
    mine_pids = [v["pid"] for v in mine.spawn("w", Where).where.call().get(timeout=60).values()]
    other = theirs.spawn("w", Where)
    (their_pid,) = [v["pid"] for v in other.where.call().get(timeout=60).values()]
    for reference in (this_host(), first.slice(hosts=0)):
        with pytest.raises(RuntimeError, match="cannot stop `HostMesh` that is a reference"):
            reference.stop().get(timeout=10)
    assert first.stop().get(timeout=60) is None
    assert not any(pid_alive(p) for p in mine_pids)
    assert pid_alive(their_pid) and other.add.call_one(1).get(timeout=60) == 2
    with pytest.raises(RuntimeError, match="already been stopped"):
        first.spawn_procs(per_host={"gpus": 1})
    with pytest.raises(RuntimeError, match="already been stopped"):
        first.stop().get(timeout=10)
    assert agent.popen.poll() is None
    third = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    fresh = third.spawn_procs(per_host={"gpus": 1}, name="third")
    assert fresh.spawn("w", Where).add.call_one(2).get(timeout=60) == 3
    third.shutdown().get(timeout=60)
    second.shutdown().get(timeout=60)
    assert not pid_alive(their_pid)


def test_owned_host_mesh_sent_to_an_actor_is_a_reference_there(one_agent, nats_url):
    label, _ = one_agent
    hosts = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="holder")
    try:
        hop = procs.spawn("hop", Hop)
        back = hop.back.call_one(Box(hosts=hosts)).get(timeout=60).get("hosts")
        assert [h.uid for h in back.hosts] == [h.uid for h in hosts.hosts]
        with pytest.raises(RuntimeError, match="reference"):
            back.shutdown().get(timeout=10)
        # the actor can start procs through the agent it received
        said = hop.procs_on_host.call_one(Box(hosts=hosts)).get(timeout=60)
        assert len(said) == 1
    finally:
        procs.stop().get(timeout=60)
    hosts.shutdown().get(timeout=60)


# -- ProcMesh.host_mesh ----------------------------------------------------------------


def test_host_mesh_of_a_one_proc_mesh_starts_procs_on_the_same_machine(nats_url):
    # As Monarch 0.7's ProcMesh.host_mesh: one proc only, a reference of no dimensions.
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="hostof")
    holder = this_host().spawn_procs(per_host={"gpus": 1}, name="hostof_holder")
    try:
        with pytest.raises(NotImplementedError, match="non-singleton proc meshes"):
            procs.host_mesh
        one = procs.slice(gpus=1)
        hosts = one.host_mesh
        assert isinstance(hosts, HostMesh) and dict(hosts.extent) == {}
        with pytest.raises(RuntimeError, match="reference instead of owned"):
            hosts.shutdown().get(timeout=10)
        more = hosts.spawn_procs(per_host={"gpus": 1}, name="hostof_more")
        (pid,) = [v["pid"] for v in more.spawn("w", Where).where.call().get(timeout=60).values()]
        assert pid_alive(pid) and pid != os.getpid()
        more.stop().get(timeout=60)
        # this_proc() is a one-proc mesh too: its host is this machine
        mine = this_proc().host_mesh.spawn_procs(per_host={"gpus": 1}, name="hostof_mine")
        assert mine.spawn("w", Where).add.call_one(4).get(timeout=60) == 5
        mine.stop().get(timeout=60)
        # the one-proc mesh sent to an actor: its host_mesh works there too
        hop = holder.spawn("hop", Hop)
        for sent in (one, this_proc()):
            (there,) = hop.procs_on_host_of.call_one(Box(procs=sent)).get(timeout=60)
            assert pid_alive(there)
    finally:
        holder.stop().get(timeout=60)
        procs.stop().get(timeout=60)


def test_host_mesh_of_a_proc_started_by_an_agent_is_that_agent(one_agent):
    label, agent = one_agent
    hosts = attach_to_workers(hosts=1, labels={"t": label}, timeout=30)
    try:
        procs = hosts.spawn_procs(per_host={"gpus": 2}, name="agentof")
        one = procs.slice(gpus=0)
        assert [h.uid for h in one.host_mesh.hosts] == [h.uid for h in hosts.hosts]
        again = one.host_mesh.spawn_procs(per_host={"gpus": 1}, name="agentof_again")
        assert again.spawn("w", Where).add.call_one(1).get(timeout=60) == 2
        again.stop().get(timeout=60)
    finally:
        hosts.shutdown().get(timeout=60)


# -- ProcMesh.rank_tensor / rank_tensors ------------------------------------------------


grid = proc_mesh_fixture({"hosts": 2, "gpus": 2}, name="grid")


def test_rank_tensor_holds_each_procs_coordinate(grid):
    import torch

    import monarch

    pts = [(h, g) for h in range(2) for g in range(2)]
    gpus = grid.rank_tensor("gpus")
    assert gpus.dtype == torch.long and tuple(gpus.shape) == ()
    with grid.activate():
        assert [monarch.inspect(gpus, hosts=h, gpus=g).item() for h, g in pts] == [0, 1, 0, 1]
        both = grid.rank_tensor(["hosts", "gpus"])
        assert [monarch.inspect(both, hosts=h, gpus=g).item() for h, g in pts] == [0, 1, 2, 3]
        flipped = grid.rank_tensor(("gpus", "hosts"))
        assert [monarch.inspect(flipped, hosts=h, gpus=g).item() for h, g in pts] == [0, 2, 1, 3]
        ranks = grid.rank_tensors()
        assert list(ranks) == ["hosts", "gpus"]
        assert [monarch.inspect(ranks["hosts"], hosts=h, gpus=g).item() for h, g in pts] == [
            0,
            0,
            1,
            1,
        ]
        doubled = 10 * grid.rank_tensor("gpus")
        assert monarch.inspect(doubled, hosts=1, gpus=1).item() == 10


def test_rank_tensor_of_a_slice_counts_within_the_slice(grid):
    import monarch

    part = grid.slice(gpus=1)
    with part.activate():
        hosts = part.rank_tensor("hosts")
        assert [monarch.inspect(hosts, hosts=h).item() for h in range(2)] == [0, 1]
    with pytest.raises(KeyError, match="gpus"):
        part.rank_tensor("gpus")  # sliced away


def test_rank_tensor_names_a_missing_dimension(grid):
    with pytest.raises(KeyError, match="nodes"):
        grid.rank_tensor("nodes")


def test_importing_monarch_actor_does_not_import_torch():
    code = "import sys, monarch.actor; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
