"""ProcessJob: named meshes of real ``monarch host`` agents, re-attaching, exec_command, kill."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from monarch.job import JobState, ProcessJob, exec_command, job_load
from monarch.job.process import _Agent, _alive
from tests.helpers import descendants, pid_alive, wait_until
from tests.hosts.agents import ROOT
from tests.job.job_actors import Whereabouts


@pytest.fixture(scope="module")
def job(nats_url, tmp_path_factory):
    """One two-mesh job for the module (its agents start once); killed at the end."""
    job = ProcessJob({"trainers": 2, "workers": 1}, env={"JOB_TEST_ENV": "from-the-job"})
    path = str(tmp_path_factory.mktemp("job") / "job_state.pkl")
    state = job.state(cached_path=path)
    try:
        yield job, state, path
    finally:
        job.kill()


def agent_pids(job: ProcessJob) -> set[int]:
    return {a.pid for a in job._agents.values()}


def run_client(code: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """A second client script, in its own Python process, run from the checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_each_named_mesh_is_a_host_mesh_of_its_own_agents(job):
    job_, state, _ = job
    assert isinstance(state, JobState) and job_.active
    assert dict(state.trainers.extent) == {"hosts": 2}
    assert dict(state.workers.extent) == {"hosts": 1}
    trainer_hosts = [h.uid for h in state.trainers.hosts]
    assert len(set(trainer_hosts)) == 2 and not set(trainer_hosts) & {
        h.uid for h in state.workers.hosts
    }
    procs = state.trainers.spawn_procs(per_host={"gpus": 2})
    try:
        assert dict(procs.extent) == {"hosts": 2, "gpus": 2}
        where = procs.spawn("where", Whereabouts).where.call().get(timeout=60)
        for point, w in where.items():
            # Started by the agent of its host, with the job's environment.
            assert w["host_uid"] == trainer_hosts[point["hosts"]]
            assert w["ppid"] in agent_pids(job_)
            assert w["job_env"] == "from-the-job"
    finally:
        procs.stop().get(timeout=60)


def test_an_unknown_mesh_name_says_which_names_there_are(job):
    _, state, _ = job
    with pytest.raises(AttributeError, match="'evaluators' is not a valid host mesh name. "
                       "Available names: trainers, workers"):  # fmt: skip
        state.evaluators


def test_a_second_client_script_reattaches_to_the_running_agents(job):
    job_, state, path = job
    out = run_client(
        f"""
        import json
        from monarch.job import ProcessJob
        from tests.job.job_actors import Whereabouts
        job = ProcessJob({{"trainers": 2, "workers": 1}})
        state = job.state(cached_path={path!r})
        procs = state.workers.spawn_procs()
        w = procs.spawn("w", Whereabouts).where.call_one().get(timeout=60)
        procs.stop().get(timeout=60)
        print(json.dumps({{"cached": type(job._status).__name__, "ppid": w["ppid"],
                          "hosts": [h.uid for h in state.trainers.hosts]}}))
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["cached"] == "_CachedRunning"  # no new job was applied
    assert said["ppid"] in agent_pids(job_)
    assert said["hosts"] == [h.uid for h in state.trainers.hosts]
    assert job_load(path).can_run(job_)  # still the same running job


def test_exec_command_runs_on_every_host_and_returns_the_largest_exit_code(job, tmp_path):
    _, state, _ = job
    cmd = ["bash", "-c", 'echo "$MONARCH_RANK_hosts/$MONARCH_SIZE_hosts $GREETING"; '
           "exit $((MONARCH_RANK_hosts + 3))"]  # fmt: skip
    out = str(tmp_path / "out" / "$SUBDIR")
    rc = exec_command(state.trainers, cmd, env={"GREETING": "hi"}, output_dir=out)
    assert rc.get(timeout=90) == 4
    for rank in (0, 1):
        with open(tmp_path / "out" / f"hosts_{rank}" / "stdout.txt") as f:
            assert f.read() == f"{rank}/2 hi\n"
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    assert exec_command(state.trainers, [str(script), "5"], rank=1).get(timeout=90) == 5
    with pytest.raises(ValueError, match="rank or point, not both"):
        exec_command(state.trainers, ["true"], rank=0, point={"hosts": 0})


def test_a_bad_spec_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="non-empty dict"):
        ProcessJob({})
    with pytest.raises(ValueError, match="positive int"):
        ProcessJob({"hosts": 0})
    with pytest.raises(ValueError, match="identifier"):
        ProcessJob({"my hosts": 1})
    with pytest.raises(RuntimeError, match="batch-mode"):
        ProcessJob({"hosts": 1}).apply(client_script="train.py")


def test_an_agent_that_cannot_start_is_an_error_with_its_exit_status_and_output(nats_url):
    job = ProcessJob({"hosts": 2}, env={"MONARCH_LOG_LEVEL": "NOPE"})
    with pytest.raises(RuntimeError, match=r"exited while starting \(exit code 1\)") as e:
        job.state(cached_path=None)
    assert "Unknown level: 'NOPE'" in str(e.value)  # its own words, from its log
    assert not job.active and not job._agents  # the other agent was stopped too


def test_an_agent_just_started_is_asked_through_its_popen_not_its_command_line(tmp_path):
    """For microseconds after Popen returns, the kernel has not yet written the new
    program's command line (/proc/<pid>/cmdline reads empty): a look there would
    take a starting agent for dead (it did, in CI, on a busy machine). A child whose
    command line does not name it stands in for that window here."""
    log = tmp_path / "agent.log"
    serve_soon = "import sys, time; time.sleep(0.5); open(sys.argv[1], 'w').write('x serving y')"
    job = ProcessJob({"hosts": 1})
    popen = subprocess.Popen([sys.executable, "-c", serve_soon, str(log)])
    try:
        agent = _Agent(popen.pid, "hosts-0-notyet", str(log))
        job._popens.append(popen)
        job._agents["hosts_0"] = agent
        assert not _alive(agent)  # what /proc says in that window
        job._wait_ready(timeout=30)  # waits for it instead of calling it dead
        assert popen.wait(10) == 0
        assert not job._agent_runs(agent) and job._exit_status(agent) == "exit code 0"
    finally:
        popen.kill()
        popen.wait(10)


def test_kill_stops_the_agents_and_every_proc_on_them(nats_url):
    job = ProcessJob({"hosts": 1})
    state = job.state(cached_path=None)
    agents = agent_pids(job)
    procs = state.hosts.spawn_procs(per_host={"procs": 2})
    procs.spawn("w", Whereabouts).where.call().get(timeout=60)
    under = set().union(*(descendants(pid) for pid in agents))
    assert len(under) >= 2  # the two procs (at least) run under the agent
    job.kill()
    assert not job.active
    assert wait_until(lambda: not any(pid_alive(p) for p in agents | under), timeout=15)
    assert not job.can_run(job)


def test_with_the_embedded_broker_agents_get_its_token_only_in_their_environment():
    """No MONARCH_NATS_URL: the client's own broker; a script's exit takes its agents along."""
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_NATS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    code = textwrap.dedent(
        """
        import json
        from monarch.job import ProcessJob
        from tests.job.job_actors import Whereabouts
        from monarch.core.process_runtime import runtime
        job = ProcessJob({"hosts": 1})
        state = job.state(cached_path=None)
        agent = next(iter(job._agents.values())).pid
        url = runtime().nats_url
        with open(f"/proc/{agent}/environ", "rb") as f:
            environ = dict(e.split(b"=", 1) for e in f.read().split(b"\\0") if b"=" in e)
        with open(f"/proc/{agent}/cmdline", "rb") as f:
            argv = f.read()
        procs = state.hosts.spawn_procs()
        w = procs.spawn("w", Whereabouts).where.call_one().get(timeout=60)
        token = url.split("://", 1)[1].split("@", 1)[0]
        print(json.dumps({"agent": agent, "proc": w["pid"], "has_token": "@" in url,
                          "env_url": environ[b"MONARCH_NATS_URL"].decode() == url,
                          "token_in_argv": token.encode() in argv}))
        """
    )  # the script ends without kill(): its exit must stop the agent and the proc
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["has_token"] and said["env_url"] and not said["token_in_argv"]
    assert wait_until(lambda: not pid_alive(said["agent"]) and not pid_alive(said["proc"]), 15)
