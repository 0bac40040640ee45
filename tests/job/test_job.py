"""The job contract (apply, state, the .monarch cache, contexts) and LocalJob."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from monarch.actor import HostMesh
from monarch.job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    LocalJob,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)
from tests.hosts.agents import ROOT


class CountingJob(JobTrait):
    """A scheduler whose 'hosts' are names: counts what the base class asks of it."""

    def __init__(self, names=("default",), runs=None):
        super().__init__()
        self.names = tuple(names)
        self.runs = runs  # spec names this job can serve; None: any
        self.created = 0
        self.killed = 0

    def _create(self, client_script):
        self.created += 1

    def _state(self):
        return JobState({n: f"mesh:{n}" for n in self.names})

    def _kill(self):
        self.killed += 1
        if "KILL_LOG" in os.environ:  # a job killed after unpickling: seen through a file
            with open(os.environ["KILL_LOG"], "a") as f:
                f.write("killed\n")

    def can_run(self, spec):
        return self.runs is None or tuple(getattr(spec, "names", ())) in self.runs


def test_apply_creates_once_and_kill_lets_it_apply_again():
    job = CountingJob()
    assert not job.active and job.apply_id is None
    job.apply()
    job.apply()
    assert job.created == 1 and job.active and job.apply_id
    first = job.apply_id
    job.kill()
    assert job.killed == 1 and not job.active
    job.apply()
    assert job.created == 2 and job.apply_id != first


def test_state_applies_saves_and_a_new_spec_attaches_to_the_cached_job(tmp_path):
    path = str(tmp_path / "sub" / "job_state.pkl")
    job = CountingJob(names=("trainers",))
    assert job.state(cached_path=path).trainers == "mesh:trainers"
    assert job.created == 1 and os.path.exists(path)
    assert os.stat(path).st_mode & 0o777 == 0o600  # it may hold what reaches the hosts
    again = CountingJob(names=("trainers",))
    assert again.state(cached_path=path).trainers == "mesh:trainers"
    assert again.created == 0 and again.active  # attached, not applied
    assert again.apply_id == job_load(path).apply_id


def test_an_incompatible_cached_job_is_killed_and_replaced(tmp_path, monkeypatch):
    path = str(tmp_path / "job_state.pkl")
    monkeypatch.setenv("KILL_LOG", str(tmp_path / "kills"))
    CountingJob(names=("old",), runs=()).state(cached_path=path)
    new = CountingJob(names=("new",))
    state = new.state(cached_path=path)
    assert new.created == 1 and state.new == "mesh:new"
    assert (tmp_path / "kills").read_text() == "killed\n"  # the cached job was killed
    with pytest.raises(AttributeError, match="'old' is not a valid host mesh name"):
        state.old
    assert job_load(path)._state()._hosts == {"new": "mesh:new"}


def test_dumps_and_job_loads_keep_a_running_job():
    job = CountingJob(names=("a", "b"))
    job.apply()
    loaded = job_loads(job.dumps())
    assert loaded.active and loaded.apply_id == job.apply_id
    assert sorted(loaded.state(cached_path=None)._hosts) == ["a", "b"]
    assert loaded.created == 1  # state() of a running job applies nothing


def test_job_state_names_its_meshes_and_refuses_others():
    state = JobState({"b": "B", "a": "A"})
    assert state.a == "A" and "JobState" in repr(state)
    with pytest.raises(AttributeError, match="Available names: a, b"):
        state.c


def test_local_job_is_this_machine_under_every_name():
    state = LocalJob(hosts=("trainers", "workers")).state(cached_path=None)
    assert isinstance(state.trainers, HostMesh) and isinstance(state.workers, HostMesh)
    assert state.trainers.size() == 1
    assert LocalJob().can_run(LocalJob()) is False  # always re-applied: it costs nothing
    assert DEFAULT_JOB_PATH == ".monarch/job_state.pkl"


def test_the_current_job_context_names_a_job_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "myjobs.py").write_text(
        "from monarch.job import LocalJob\njob = LocalJob(('hosts',))\nnot_a_job = 3\n"
    )
    with pytest.raises(FileNotFoundError, match="No spec found"):
        load_current_job()
    (tmp_path / ".monarch").mkdir()
    (tmp_path / ".monarch" / "job_state.pkl").write_bytes(b"legacy")
    set_current_job("myjobs.job")
    assert os.path.islink(DEFAULT_JOB_PATH)  # now a link into the default context
    assert (tmp_path / ".monarch" / "default" / "state.pkl").read_bytes() == b"legacy"
    assert isinstance(load_current_job(), LocalJob)
    set_current_job("myjobs.not_a_job")
    with pytest.raises(TypeError, match="must be a JobTrait"):
        load_current_job()
    set_current_job("nodot")
    with pytest.raises(ValueError, match="module.attr"):
        load_current_job()


def test_a_local_batch_client_finds_the_job_it_runs_in(tmp_path, nats_url, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            from monarch.job import LocalJob
            state = LocalJob(("hosts",)).state()
            print("batch_launched_hosts", hasattr(state, "batch_launched_hosts"))
            print("hosts", hasattr(state, "hosts"))
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    job = LocalJob(("batch_launched_hosts",))
    job.apply(client_script=str(script))
    assert job.process.wait(90) == 0
    with open(os.path.join(job._log_dir, "stdout.log")) as f:
        out = f.read()
    assert "batch_launched_hosts True" in out and "hosts False" in out
    # Run directly (not in batch mode), the same script applies its own job.
    regular = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=dict(os.environ),
                             capture_output=True, text=True, timeout=90)  # fmt: skip
    assert "hosts True" in regular.stdout, regular.stderr[-2000:]
