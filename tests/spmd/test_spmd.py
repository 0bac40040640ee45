"""monarch.spmd: torchrun scripts on proc meshes, with torch elastic's environment and supervision.

Every test starts real procs on this host; scripts run inside them as torchrun
workers would. Expected environments are torch elastic's definitions (checked
by hand against ``torchrun`` and Monarch 0.7, which agree).
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import socket
import sys
import time
from pathlib import Path

import pytest

from monarch.actor import ActorError, SupervisionError, this_host
from monarch.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch.tools.network import AddrType
from tests.helpers import wait_until
from tests.spmd.spmd_actors import EnvProbe, SpmdOwner

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
DDP_SCRIPT = ROOT / "examples" / "spmd_ddp.py"


def elastic_env(rank: int, hosts: int, per_host: int, addr: str, port: int) -> dict[str, str]:
    """What torchrun --nnodes hosts --nproc-per-node per_host gives worker ``rank``."""
    world = hosts * per_host
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank % per_host), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(per_host), "GROUP_RANK": str(rank // per_host),
        "GROUP_WORLD_SIZE": str(hosts), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "rank", "MASTER_ADDR": addr, "MASTER_PORT": str(port),
    }  # fmt: skip


def spmd_on(pm, name: str = "_SPMDActor"):
    """SPMDActors on ``pm`` and the master (host, port) their first rank picked."""
    actors = pm.spawn(name, SPMDActor)
    first = dict.fromkeys(pm.extent.labels, 0)
    addr, port = actors.slice(**first).get_host_port.call_one(None).get(timeout=60)
    return actors, addr, port


class Printed:
    """What the client printed so far (forwarded lines arrive on its runtime's thread)."""

    def __init__(self, capsys) -> None:
        self.capsys = capsys
        self.out = self.err = ""

    def wait_for(self, texts: list[str], timeout: float = 20.0) -> Printed:
        """Poll (bounded) until every text was printed to stdout or stderr."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.capsys.readouterr()
            self.out, self.err = self.out + got.out, self.err + got.err
            if all(t in self.out + self.err for t in texts) or time.monotonic() > deadline:
                return self
            time.sleep(0.05)


@pytest.fixture
def two_procs(nats_url):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="spmd2")
    yield pm
    pm.stop().get(timeout=60)


def test_2x2_mesh_gets_torch_elastic_env_with_hosts_as_groups(nats_url):
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}, name="spmd22")
    try:
        setup_torch_elastic_env(pm)
        envs = pm.spawn("probe", EnvProbe).env.call().get(timeout=60)
        got = {point.rank: env for point, env in envs.items()}
        addr, port = got[0]["MASTER_ADDR"], int(got[0]["MASTER_PORT"])
        assert addr == socket.gethostname() and 0 < port < 65536
        assert got == {r: elastic_env(r, 2, 2, addr, port) for r in range(4)}
        # an address family asked for gives an IP of that family instead of the name
        spmd = pm.spawn("spmd_ip", SPMDActor).slice(hosts=0, gpus=0)
        ip, _ = spmd.get_host_port.call_one(AddrType.IPv4).get(timeout=60)
        socket.inet_pton(socket.AF_INET, ip)
    finally:
        pm.stop().get(timeout=60)


def test_flat_mesh_runs_script_as_torchrun_worker_with_output_forwarded(nats_url, tmp_path, capsys):
    pm = this_host().spawn_procs(per_host={"procs": 4}, name="spmdflat")
    try:
        actors, addr, port = spmd_on(pm)
        script = str(SCRIPTS / "env_dump.py")
        result = actors.main.call(addr, port, [script, str(tmp_path), "--lr", "0.1"]).get(
            timeout=60
        )
        assert [ok for _, ok in result.items()] == [True] * 4
        for r in range(4):
            seen = json.loads((tmp_path / f"rank-{r}.json").read_text())
            assert seen["env"] == elastic_env(r, 1, 4, addr, port)  # torchrun --nproc-per-node 4
            assert seen["name"] == "__main__"
            assert seen["argv"] == [script, str(tmp_path), "--lr", "0.1"]
            assert seen["path0"] == str(SCRIPTS)  # as `python script.py` sets it
        lines = [f"env_dump std{s} from rank {r}" for r in range(4) for s in ("out", "err")]
        printed = Printed(capsys).wait_for(lines)
        assert "[_SPMDActor[3]] env_dump stdout from rank 3" in printed.out
        assert "[_SPMDActor[2]] env_dump stderr from rank 2" in printed.err
    finally:
        pm.stop().get(timeout=60)


def test_module_form_and_async_setup_with_explicit_master(two_procs, tmp_path):
    asyncio.run(setup_torch_elastic_env_async(two_procs, "127.0.0.1", 29611))
    envs = two_procs.spawn("probe", EnvProbe).env.call().get(timeout=60)
    assert [env for _, env in envs.items()] == [
        elastic_env(r, 1, 2, "127.0.0.1", 29611) for r in range(2)
    ]
    actors = two_procs.spawn("spmd_m", SPMDActor)
    module = "tests.spmd.scripts.env_dump"
    actors.main.call("127.0.0.1", 29612, ["-m", module, str(tmp_path), "x"]).get(timeout=60)
    seen = json.loads((tmp_path / "rank-1.json").read_text())
    assert seen["name"] == "__main__" and seen["env"]["MASTER_PORT"] == "29612"
    assert seen["argv"] == [str(SCRIPTS / "env_dump.py"), str(tmp_path), "x"]  # as python -m
    assert seen["path0"] == os.getcwd()


def test_ddp_script_on_4_procs_matches_single_process_training(nats_url, tmp_path, monkeypatch):
    import torch  # here, not at the top: only this test needs it in the client

    pm = this_host().spawn_procs(per_host={"gpus": 4}, name="spmdddp")
    try:
        actors, addr, port = spmd_on(pm)
        out = str(tmp_path / "ddp-{rank}.pt")
        actors.main.call(addr, port, [str(DDP_SCRIPT), "--out", out]).get(timeout=120)
    finally:
        pm.stop().get(timeout=60)
    # The reference: the same script, unchanged, as `python spmd_ddp.py` (no RANK: one
    # process, every sample), run here rather than in a new interpreter to spare a torch import.
    single = str(tmp_path / "single.pt")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", [str(DDP_SCRIPT), "--out", single])
    runpy.run_path(str(DDP_SCRIPT), run_name="__main__")
    ranks = [torch.load(out.format(rank=r)) for r in range(4)]
    reference = torch.load(single)
    assert sorted(reference) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for params in ranks[1:]:  # DDP keeps the replicas bit-identical
        assert all(torch.equal(params[k], ranks[0][k]) for k in reference)
    initial = runpy.run_path(str(DDP_SCRIPT))["make_model"](0).state_dict()
    for k in reference:  # same data, same steps: only the float rounding of averaging differs
        assert torch.allclose(ranks[0][k], reference[k], rtol=1e-5, atol=1e-6), k
        assert not torch.allclose(reference[k], initial[k]), f"{k} did not train"


def test_script_exception_reaches_the_caller_with_its_traceback(two_procs):
    actors, addr, port = spmd_on(two_procs)
    script = str(SCRIPTS / "endings.py")
    with pytest.raises(ActorError, match="loss went NaN at step 1") as info:
        actors.main.call(addr, port, [script, "raise", "1"]).get(timeout=60)
    assert isinstance(info.value.exception, RuntimeError) and info.value.rank == 1
    assert "endings.py" in info.value.traceback and "in train_step" in info.value.traceback
    # as in Monarch, an exception is the caller's: the actor lives on and runs the next script
    result = actors.main.call(addr, port, [script, "ok", "1"]).get(timeout=60)
    assert [ok for _, ok in result.items()] == [True, True]


def test_sys_exit_zero_is_success(two_procs):
    actors, addr, port = spmd_on(two_procs)
    result = actors.main.call(addr, port, [str(SCRIPTS / "endings.py"), "exit0", "0"]).get(
        timeout=60
    )
    assert [ok for _, ok in result.items()] == [True, True]


@pytest.mark.parametrize(("mode", "status"), [("exit3", 3), ("exitmsg", 1)])
def test_nonzero_exit_fails_the_rank_with_status_and_traceback(
    two_procs, root_faults, mode, status
):
    actors, addr, port = spmd_on(two_procs)
    with pytest.raises(SupervisionError, match=f"exited with status {status}"):
        actors.main.call(addr, port, [str(SCRIPTS / "endings.py"), mode, "1"]).get(timeout=60)
    (failure,) = root_faults.wait(1)  # the client owns the mesh: its fault hook hears
    assert failure.mesh_name == "_SPMDActor" and failure.ranks == [1]
    assert failure.reason == "actor_failed"
    report = failure.report()
    assert "SystemExit" in report and f"exited with status {status}" in report
    assert 'endings.py", line' in report


def test_rank_killed_mid_script_reaches_the_owner_and_nothing_hangs(nats_url):
    owner_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="spmdownerp")
    try:
        owner = owner_procs.spawn("spmd_owner", SpmdOwner)
        script = str(SCRIPTS / "allreduce_steps.py")
        owner.start.call_one([script, "5", "2", "2"]).get(timeout=60)
        assert wait_until(lambda: owner.seen.call_one().get(timeout=30), timeout=60)
        ((mesh, reason, ranks, report),) = owner.seen.call_one().get(timeout=30)
        assert (mesh, reason, ranks) == ("_SPMDActor", "proc_died", [2])
        assert "exited with code -9" in report, report
        # the call running the script ends (no hang): with rank 2's death (SupervisionError)
        # or a peer's gloo error (ActorError), whichever reached the owner first
        outcome = owner.outcome.call_one(60.0).get(timeout=90)
        assert outcome.startswith(("SupervisionError", "ActorError")), outcome
    finally:
        owner_procs.stop().get(timeout=60)  # stops the owner's procs too, even if blocked in gloo


def test_bad_script_or_module_is_a_precise_error(two_procs, tmp_path):
    actors = two_procs.spawn("spmd_bad", SPMDActor)
    missing = str(tmp_path / "no_such_train.py")
    with pytest.raises(ActorError, match="does not exist") as info:
        actors.main.call("127.0.0.1", 29613, [missing, "--lr", "1"]).get(timeout=60)
    assert isinstance(info.value.exception, FileNotFoundError) and missing in str(info.value)
    with pytest.raises(ActorError, match="No module named 'no_such_pkg.train'") as info:
        actors.main.call("127.0.0.1", 29613, ["-m", "no_such_pkg.train"]).get(timeout=60)
    assert isinstance(info.value.exception, ModuleNotFoundError)
    with pytest.raises(ActorError, match="No script or module specified"):
        actors.main.call("127.0.0.1", 29613, []).get(timeout=60)
    with pytest.raises(ActorError, match="No module specified after '-m'"):
        actors.main.call("127.0.0.1", 29613, ["-m"]).get(timeout=60)
    with pytest.raises(ActorError, match="master_port must be in 1..65535"):
        actors.main.call("127.0.0.1", 0, [missing]).get(timeout=60)
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        setup_torch_elastic_env(two_procs, master_addr="127.0.0.1")
