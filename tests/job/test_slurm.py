"""SlurmJob on a real one-node Slurm (munged + slurmctld + slurmd started by the fixture).

Skipped, with the reason, only where Slurm's binaries or root are missing
(``.ci/install-slurm.sh`` installs them). The one node offers 4 task slots,
so a two-host mesh is two agents on the same node (``ntasks_per_node=2``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from monarch.job.slurm import SlurmJob, SlurmJobError
from tests.helpers import wait_until
from tests.hosts.host_actors import Where
from tests.job.slurm_cluster import SlurmCluster, unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def slurm():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster().start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch/squeue/scancel find the cluster
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        cluster.stop()


def job_processes(job_id: str) -> list[int]:
    """Pids of live processes Slurm started for ``job_id`` (they carry SLURM_JOB_ID)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env:
            found.append(int(entry))
    return found


def listed(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()


def run_client(code: str, env: dict[str, str], timeout: float = 90) -> str:
    """Run a client script in a fresh interpreter; its stdout, or a failure with its stderr."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"client failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    return r.stdout


def test_two_host_mesh_runs_actors_reattaches_and_kill_leaves_nothing(slurm, nats_url, tmp_path):
    cached = str(tmp_path / "job_state.pkl")
    job = SlurmJob(
        meshes={"trainers": 2},
        ntasks_per_node=2,
        log_dir=str(tmp_path),
        job_start_timeout=30,
        agent_timeout=30,
    )
    try:
        trainers = job.state(cached_path=cached).trainers
        job_id = job.job_id
        assert job_id and "RUNNING" in listed(slurm, job_id)
        procs = trainers.spawn_procs(per_host={"gpus": 1})
        w = procs.spawn("w", Where)
        where = list(w.where.call().get(timeout=60).values())
        assert len({x["host_uid"] for x in where}) == 2  # two agents, one per task
        assert all(p in job_processes(job_id) for p in (x["pid"] for x in where))
        procs.stop().get(timeout=60)

        # A second script finds the running job in the cache and reuses its agents.
        out = run_client(
            f"""
            import json
            from monarch.job.slurm import SlurmJob
            from tests.hosts.host_actors import Where
            job = SlurmJob(meshes={{"trainers": 2}}, ntasks_per_node=2, log_dir={str(tmp_path)!r},
                           job_start_timeout=30, agent_timeout=30)
            procs = job.state(cached_path={cached!r}).trainers.spawn_procs(per_host={{"gpus": 1}})
            uids = sorted(x["host_uid"] for x in procs.spawn("w", Where).where.call().get(60).values())
            print(json.dumps([job.apply_id, uids]))
            procs.stop().get(timeout=60)
            """,
            dict(os.environ, PYTHONPATH=ROOT),
        )
        apply_id, uids = json.loads(out.strip().splitlines()[-1])
        assert apply_id == job.apply_id and uids == sorted(x["host_uid"] for x in where)
        assert listed(slurm, job_id)  # the second script left the job running

        job.kill()
        assert not job.active and listed(slurm, job_id) == ""
        assert wait_until(lambda: not job_processes(job_id), timeout=20), job_processes(job_id)
    finally:
        if job.active:
            job.kill()


def test_unknown_partition_is_refused_by_sbatch_with_its_reason(slurm, tmp_path):
    job = SlurmJob(meshes={"hosts": 1}, partition="nosuchpartition", log_dir=str(tmp_path))
    with pytest.raises(SlurmJobError, match="sbatch refused the job.*[Ii]nvalid partition"):
        job.apply()
    assert not job.active


def test_job_that_stays_pending_is_cancelled_and_named(slurm, nats_url, tmp_path):
    job = SlurmJob(
        meshes={"hosts": 1},
        slurm_args=["--begin=now+1hour"],
        log_dir=str(tmp_path),
        job_start_timeout=2,
    )
    job.apply()
    job_id = job.job_id
    with pytest.raises(
        SlurmJobError, match=rf"Slurm job {job_id} did not start.*PENDING.*BeginTime"
    ) as e:
        job.state(cached_path=None)
    assert e.value.job_id == job_id and e.value.state == "PENDING"
    assert listed(slurm, job_id) == ""


def test_cancelled_job_raises_with_its_id_and_state(slurm, nats_url, tmp_path):
    job = SlurmJob(meshes={"hosts": 1}, log_dir=str(tmp_path), job_start_timeout=30)
    job.apply()
    job_id = job.job_id
    slurm.run("scancel", job_id)
    with pytest.raises(SlurmJobError, match=rf"Slurm job {job_id} ended .*state CANCELLED"):
        job.state(cached_path=None)
    job.kill()
    assert wait_until(lambda: not job_processes(job_id), timeout=20)


def test_job_with_its_own_broker_is_reused_by_a_second_script(slurm, tmp_path):
    """No MONARCH_NATS_URL: the batch script runs the broker, so the job outlives its first client."""
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_NATS_URL"}
    env["PYTHONPATH"] = ROOT
    cached = str(tmp_path / "job_state.pkl")
    client = f"""
        import json, sys
        from monarch.job.slurm import SlurmJob
        from tests.hosts.host_actors import Where
        job = SlurmJob(meshes={{"a": 1, "b": 1}}, ntasks_per_node=2, log_dir={str(tmp_path)!r},
                       job_start_timeout=30, agent_timeout=30)
        state = job.state(cached_path={cached!r})
        uids = []
        for mesh in (state.a, state.b):
            procs = mesh.spawn_procs(per_host={{"gpus": 1}})
            uids += [x["host_uid"] for x in procs.spawn("w", Where).where.call().get(60).values()]
            procs.stop().get(timeout=60)
        print(json.dumps([job._running.job_id, uids]), flush=True)
        if sys.argv[1:] == ["kill"]:
            job.kill()
        """
    first_id, first_uids = json.loads(run_client(client, env).strip().splitlines()[-1])
    try:
        assert "RUNNING" in listed(slurm, first_id) and len(set(first_uids)) == 2
        conf = tmp_path / [d for d in os.listdir(tmp_path) if d.startswith("monarch_slurm_")][0]
        assert oct((conf / "env").stat().st_mode & 0o777) == "0o600"
        token = next(
            line.split("=", 1)[1]
            for line in (conf / "env").read_text().splitlines()
            if line.startswith("MONARCH_NATS_TOKEN=")
        )
        for pid in job_processes(first_id):  # the token is on no command line
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert token.encode() not in f.read()
        r = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(client), "kill"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        second_id, second_uids = json.loads(r.stdout.strip().splitlines()[-1])
        assert (second_id, second_uids) == (first_id, first_uids)
        assert listed(slurm, first_id) == ""
        assert wait_until(lambda: not job_processes(first_id), timeout=20)
    finally:
        slurm.run("scancel", first_id, check=False)


def test_serve_on_slurm_runs_a_torchrun_role_in_the_allocation_and_kill_ends_it(
    slurm, nats_url, tmp_path, monkeypatch
):
    from monarch.job.spmd import serve
    from tests.job.test_spmd_job import AppDef, Role

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "where.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ('RANK', 'WORLD_SIZE', 'SLURM_JOB_ID', 'ROLE_ENV')\n"
        "with open(os.path.join(sys.argv[1], 'rank-' + os.environ['RANK']), 'w') as f:\n"
        "    json.dump({k: os.environ.get(k) for k in keys}, f)\n"
    )
    role = Role(
        "trainer",
        "workspace/entrypoint.sh",
        ["torchrun", "--nnodes=1", "--nproc-per-node=2", str(script), str(tmp_path)],
        env={"ROLE_ENV": "set"},
    )
    job = serve(AppDef("spmd-on-slurm", [role]), scheduler="slurm",
                scheduler_cfg={"job_dir": str(tmp_path), "time": 10})  # fmt: skip
    try:
        job_id = job.handle.removeprefix("slurm://")
        assert job_id.isdigit() and listed(slurm, job_id)  # submitted; run_spmd waits for it
        job.run_spmd()
        assert "RUNNING" in listed(slurm, job_id)  # the hosts stay for the next run
        seen = [json.loads((tmp_path / f"rank-{r}").read_text()) for r in (0, 1)]
        assert seen == [
            {"RANK": str(r), "WORLD_SIZE": "2", "SLURM_JOB_ID": job_id, "ROLE_ENV": "set"}
            for r in (0, 1)
        ]
        job.kill()
        assert listed(slurm, job_id) == ""
        assert wait_until(lambda: not job_processes(job_id), timeout=20), job_processes(job_id)
    finally:
        if job.active:
            job.kill()
