"""monarch.job.spmd: torchrun commands served on this host, and StoreJob inside a real torchrun.

``serve()`` runs real procs here; the StoreJob tests start ``python -m
torch.distributed.run`` (torchrun) as a user would, whose ranks start real
workers. The Slurm form of ``serve`` is in tests/job/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from monarch.actor import ActorError
from monarch.job import job_load
from monarch.job.spmd import SPMDJob, StoreJob, serve
from monarch.job.store_job import WORKER_ADDR_ENV
from monarch.job.torchrun_command import TorchrunCommand, parse_torchrun
from tests.helpers import pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "spmd" / "scripts"


# -- reading torchrun commands -------------------------------------------------------------


@pytest.mark.parametrize(
    "command, expected",
    [
        (
            ["torchrun", "--nproc-per-node=4", "--standalone", "train.py", "--lr", "0.1"],
            TorchrunCommand(["train.py", "--lr", "0.1"], 4, 1),
        ),
        (
            ["torchrun", "--nproc_per_node", "2", "--nnodes=1:1", "-m", "pkg.train", "-m", "x"],
            TorchrunCommand(["-m", "pkg.train", "-m", "x"], 2, 1),
        ),
        (
            ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv-backend=c10d",
             "--rdzv-endpoint", "h:29500", "train.py"],
            TorchrunCommand(["train.py"], 1, 2),
        ),
        (["/usr/bin/torchrun", "train.py"], TorchrunCommand(["train.py"], 1, None)),
        (["python", "train.py", "--epochs", "3"], TorchrunCommand(["train.py", "--epochs", "3"], 1, None)),
        (["python3.11", "-m", "train"], TorchrunCommand(["-m", "train"], 1, None)),
    ],
)  # fmt: skip
def test_torchrun_commands_are_read_as_torchrun_reads_them(command, expected):
    assert parse_torchrun(command) == expected


@pytest.mark.parametrize(
    "command, message",
    [
        ([], "non-empty list"),
        (["torchrun", 3], "non-empty list"),
        (["bash", "train.sh"], "must start with torchrun"),
        (["torchrun", "--nproc-per-node=2"], "no training script"),
        (["torchrun", "--frobnicate", "1", "train.py"], "not understood: ['--frobnicate']"),
        (["torchrun", "--no-python", "./a.out"], "--no-python"),
        (["torchrun", "--nnodes=1:4", "train.py"], "elastic node range"),
        (["torchrun", "--nnodes=two", "train.py"], "N or N:N"),
        (["torchrun", "--nproc-per-node=0", "train.py"], "at least 1"),
        (["python"], "no script"),
    ],
)
def test_a_wrong_command_is_a_value_error_saying_what_is_wrong(command, message):
    with pytest.raises(ValueError) as e:
        parse_torchrun(command)
    assert message in str(e.value)


def test_nproc_per_node_by_device_kind_runs_one_worker_with_a_warning():
    with pytest.warns(UserWarning, match="--nproc-per-node=gpu is not an integer"):
        assert parse_torchrun(["torchrun", "--nproc-per-node=gpu", "t.py"]).nproc_per_node == 1


# -- serve() on this host --------------------------------------------------------------------


@dataclass
class Role:  # what serve() reads of torchx's specs.Role (torchx is not installed here)
    name: str
    entrypoint: str
    args: list[str]
    num_replicas: int = 1
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class AppDef:
    name: str
    roles: list[Role]


def test_serve_runs_the_command_on_fresh_procs_each_time_and_job_load_gets_it_back(
    nats_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    out = tmp_path / "out"
    out.mkdir()
    body = "import os, sys\nopen(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write('{}')\n"
    script.write_text(body.format("first") + "print('trained on rank', os.environ['RANK'])\n")

    job = serve(["torchrun", "--nproc-per-node=2", "--standalone", str(script), str(out)])
    assert isinstance(job, SPMDJob) and job.active
    assert capsys.readouterr().out == f"Launched: local_cwd://{job.apply_id}\n"
    job.run_spmd()
    assert {p.name: p.read_text() for p in out.iterdir()} == {"0": "first", "1": "first"}
    printed = capsys.readouterr().out  # each rank's output is there when run_spmd returns
    assert "trained on rank 0" in printed and "trained on rank 1" in printed

    # Edit the script, run again from the saved job: the same hosts run the new code.
    script.write_text(body.format("second"))
    again = job_load(".monarch/job_state.pkl")
    assert isinstance(again, SPMDJob) and again.apply_id == job.apply_id
    again.run_spmd()
    assert {p.name: p.read_text() for p in out.iterdir()} == {"0": "second", "1": "second"}

    # A second serve replaces the saved job, saying so.
    with pytest.warns(UserWarning, match="Removing stale job state file"):
        serve(["python", str(script), str(out)])


def test_an_appdef_role_runs_with_its_env_and_a_failing_rank_raises_at_run_spmd(
    nats_url, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    app = AppDef(
        "probe",
        [Role("trainer", "workspace/entrypoint.sh",
              ["torchrun", "--nproc-per-node=2", str(SCRIPTS / "env_dump.py"), str(tmp_path)],
              env={"SPMD_JOB_TEST": "from the role"})],
    )  # fmt: skip
    serve(app).run_spmd()
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert all(r["env"]["WORLD_SIZE"] == "2" for r in ranks)

    env_probe = tmp_path / "env_probe.py"
    env_probe.write_text(
        "import os, sys\n"
        "assert os.environ['SPMD_JOB_TEST'] == 'from the role'\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('loss went NaN on rank ' + os.environ['RANK'])\n"
    )
    app.roles[0].args = ["torchrun", "--nproc-per-node=2", str(env_probe)]
    with pytest.warns(UserWarning, match="stale"), pytest.raises(ActorError, match="NaN on rank 1"):
        serve(app).run_spmd()


def test_serve_refuses_what_it_cannot_run_before_anything_starts(nats_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = [
        (lambda: serve("torchrun train.py"), TypeError, "list of words"),
        (lambda: serve(["torchrun", "--nnodes=2", "train.py"]), ValueError, "runs on one host"),
        (lambda: serve(["torchrun", "t.py"], scheduler="mast_conda"), ValueError, "not supported"),
        (lambda: serve(["torchrun", "t.py"], scheduler_cfg={"partition": "x"}), ValueError, "no scheduler_cfg"),
        (lambda: serve(AppDef("a", [Role("r", "torchrun", ["t.py"], num_replicas=2)])), ValueError, "not 2 hosts"),
        (lambda: serve(AppDef("a", [])), ValueError, "exactly one role"),
        (lambda: serve(AppDef("a", [Role("r", "torchrun", ["--nnodes=3", "t.py"], num_replicas=2)]),
                       scheduler="slurm"), ValueError, "must agree"),
        (lambda: serve(["torchrun", "t.py"], scheduler="slurm", scheduler_cfg={"nodes": 2}), ValueError,
         "not understood for slurm: ['nodes']"),
    ]  # fmt: skip
    for call, kind, message in cases:
        with pytest.raises(kind) as e:
            call()
        assert message in str(e.value), (message, e.value)
    assert not (tmp_path / ".monarch").exists()  # nothing was started or saved


# -- StoreJob: Monarch inside a torchrun job -------------------------------------------------

STORE_CLIENT = """
import json, os, sys
import torch.distributed as dist
from monarch.actor import Actor, endpoint
from monarch.job.spmd import StoreJob

class Where(Actor):
    @endpoint
    def where(self):
        return {"pid": os.getpid(), "parent": os.getppid()}

dist.init_process_group("gloo")
job = StoreJob.from_store(dist.distributed_c10d._get_default_store())
seen = {"rank": int(os.environ["RANK"]), "job": job is not None}
if job is not None:
    seen["addrs"] = job._worker_addrs
    procs = job.state().monarch_worker.spawn_procs(per_host={"gpus": 2})
    seen["where"] = list(procs.spawn("w", Where).where.call().get(timeout=60).values())
    procs.stop().get(timeout=60)
print("SEEN " + json.dumps(seen), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def workers_listening_on(address: str) -> list[int]:
    """Pids of live store workers started to listen on ``address`` (read from their environment)."""
    found = []
    needle = f"{WORKER_ADDR_ENV}={address}".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and pid_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_store_job_under_torchrun_makes_rank_0_the_client_of_its_node_worker(tmp_path):
    script = tmp_path / "store_client.py"
    script.write_text(textwrap.dedent(STORE_CLIENT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MONARCH_NATS_URL", None)  # rank 0's own embedded broker, as on a laptop
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
         str(script)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    seen = sorted(
        (json.loads(line[5:]) for line in r.stdout.splitlines() if line.startswith("SEEN ")),
        key=lambda s: s["rank"],
    )
    assert [(s["rank"], s["job"]) for s in seen] == [(0, True), (1, False)]
    (address,) = seen[0]["addrs"]  # one node, so one worker, started by local rank 0
    assert address.startswith("ipc://")
    assert os.stat(os.path.dirname(address.removeprefix("ipc://"))).st_mode & 0o077 == 0
    where = seen[0]["where"]
    assert len(where) == 2 and len({w["parent"] for w in where}) == 1  # both procs: one worker's
    assert wait_until(lambda: not workers_listening_on(address), timeout=15)  # ended with its rank


def test_a_store_worker_ends_when_its_rank_is_killed(tmp_path):
    rank = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import time
            from monarch.job.spmd import StoreJob

            class Store(dict):
                def set(self, key, value): self[key] = value
                def get(self, key): return self[key]

            job = StoreJob.from_store(Store(), rank=0, local_rank=0, world_size=1, local_world_size=1)
            print(job._worker_addrs[0], flush=True)
            time.sleep(600)
        """)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        address = rank.stdout.readline().strip()
        assert wait_until(lambda: len(workers_listening_on(address)) == 1, timeout=15), address
        (worker,) = workers_listening_on(address)
        with open(f"/proc/{worker}/cmdline", "rb") as f:
            assert address.encode() not in f.read()  # not on the command line, for ps to show
        rank.send_signal(signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(worker), timeout=15)
    finally:
        rank.kill()
        rank.wait(timeout=10)


def test_store_job_without_torchrun_topology_or_with_a_bad_transport_says_what_is_missing(
    monkeypatch,
):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="needs RANK"):
        StoreJob.from_store({})
    kw = {"rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1}
    with pytest.raises(ValueError, match="fixed non-zero port"):
        StoreJob.from_store({}, transport="tcp", **kw)
    with pytest.raises(ValueError, match="transport must be one of"):
        StoreJob.from_store({}, transport="metatls", **kw)
    with pytest.raises(ValueError, match="multiple of LOCAL_WORLD_SIZE"):
        StoreJob.from_store({}, rank=0, local_rank=0, world_size=3, local_world_size=2)
