"""Discovery: a running job is found by the same user with no flags (issue 34).

Real client scripts on their own embedded brokers (no MONARCH_NATS_URL), and
the real `monarch` command run from here as another terminal would run it.
Every child's HOME, XDG_RUNTIME_DIR and XDG_CONFIG_HOME are in a folder of
the test's, so nothing touches the real home. That folder is world-readable
on purpose: what keeps another user out must be our own 0700/0600.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nats
import pytest

from monarch.broker.connections.job_records import default_stem
from monarch.broker.connections.ownership import process_identity
from monarch.broker.connections.server import EmbeddedBroker
from tests.hosts.agents import ROOT, _readline

JOB_SCRIPT = textwrap.dedent(
    """
    import asyncio
    import sys

    from monarch.actor import Actor, endpoint, this_host


    class Sleeper(Actor):
        @endpoint
        async def nap(self, seconds: float) -> float:
            await asyncio.sleep(seconds)
            return seconds


    if __name__ == "__main__":
        procs = None
        if sys.argv[1] == "procs":
            procs = this_host().spawn_procs(per_host={"gpus": 1})
            sleepers = procs.spawn("sleepers", Sleeper)
            sleepers.nap.call_one(0).get(timeout=60)
            busy = sleepers.nap.call_one(600)  # the job is busy while the test looks at it
        else:
            from monarch.core.process_runtime import runtime

            runtime()
        print("ready", flush=True)
        sys.stdin.readline()  # the test says when to end
        if procs is not None:
            procs.stop().get(timeout=60)
    """
)


class Home:
    """A user's home for the test's children: records, NATS contexts, the job script."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="monarch-discovery-"))
        self.base.chmod(0o755)  # readable by anyone: our own modes must keep others out
        self.run_dir, self.config = self.base / "run", self.base / "config"
        for d in (self.base / "home", self.run_dir, self.config):
            d.mkdir(mode=0o755)
            d.chmod(0o755)
        self.jobs_dir = self.run_dir / "monarch" / "jobs"
        self.contexts = self.config / "nats" / "context"
        self.script = self.base / "train.py"
        self.script.write_text(JOB_SCRIPT)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        self.env.update(
            HOME=str(self.base / "home"),
            XDG_RUNTIME_DIR=str(self.run_dir),
            XDG_CONFIG_HOME=str(self.config),
            PYTHONPATH=str(ROOT),
        )

    def monarch(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "monarch.cli.main", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def jobs(self) -> list[dict]:
        out = self.monarch("jobs", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


class Job:
    """A client script (the job's root) with the default embedded broker."""

    def __init__(self, home: Home, procs: bool = False, **env: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, str(home.script), "procs" if procs else "bare"],
            cwd=ROOT,
            env={**home.env, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        line = _readline(self.popen, 120)
        if line != "ready":
            self.kill()
            pytest.fail(f"job did not start: {line!r}")
        self.pid = self.popen.pid
        (self.record,) = [r for r in _records(home) if r["owner"]["pid"] == self.pid]
        self.name = self.record["name"]

    def end(self) -> None:
        """End as a script ends: its atexit handlers run."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(b"\n")
        self.popen.stdin.close()
        assert self.popen.wait(90) == 0

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(30)


def _records(home: Home) -> list[dict]:
    if not home.jobs_dir.is_dir():
        return []
    return [json.loads(p.read_text()) for p in home.jobs_dir.glob("*.json")]


@pytest.fixture
def home():
    h = Home()
    yield h
    shutil.rmtree(h.base, ignore_errors=True)


@pytest.fixture(scope="module")
def busy_job():
    """One job with a proc and a mesh whose endpoint sleeps, shared by the tests that only look."""
    h = Home()
    # its endpoint sleeps 600 s: a graceful stop at the end waits 1 s for it, not 10
    job = Job(h, procs=True, MONARCH_STOP_TIMEOUT="1")
    yield h, job
    try:
        job.end()
    finally:
        job.kill()
        shutil.rmtree(h.base, ignore_errors=True)


def test_ps_and_tail_find_the_job_on_its_embedded_broker_with_no_flags(busy_job):
    home, job = busy_job
    ps = home.monarch("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    snap = json.loads(ps.stdout)
    (mesh,) = [m for m in snap["meshes"] if m["name"] == "sleepers"]
    assert mesh["class"] == "Sleeper" and mesh["ranks"] == [0]
    assert [p["state"] for p in snap["procs"]] == ["up"]
    tail = home.monarch("tail", "--count", "3", "--seconds", "60")
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert lines[0] == "# listening on mon.default.>"
    messages = [line for line in lines[1:] if not line.startswith("  > ")]  # not a batch's insides
    assert len(messages) == 3 and all(m.startswith("mon.default.") for m in messages)


def test_jobs_lists_the_job_without_its_secrets(busy_job):
    home, job = busy_job
    (listed,) = home.jobs()
    token = job.record["url"].split("//", 1)[1].split("@", 1)[0]
    assert listed["name"] == job.name and job.name.startswith("train-")
    assert listed["pid"] == job.pid and listed["namespace"] == "default"
    assert listed["script"] == str(home.script) and listed["embedded"] is True
    assert listed["url"].startswith("nats://127.0.0.1:") and "@" not in listed["url"]
    table = home.monarch("jobs")
    assert job.name in table.stdout and token not in table.stdout + json.dumps(listed)


def test_record_and_context_are_private_to_the_user(busy_job):
    home, job = busy_job
    record_path = home.jobs_dir / f"{job.name}.json"
    context_path = home.contexts / f"{job.name}.json"
    for folder in (home.jobs_dir, home.jobs_dir.parent, home.contexts):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for path in (record_path, context_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    token = job.record["url"].split("//", 1)[1].split("@", 1)[0]
    assert len(token) >= 16 and json.loads(context_path.read_text())["token"] == token
    # No process's command line carries the token (every local user can read those).
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            assert token.encode() not in cmdline, f"token on the command line of pid {entry}"
    if os.geteuid() != 0:
        pytest.skip("reading as another user needs root (setpriv)")

    def as_nobody(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )

    public = home.base / "public.txt"  # the control: nobody reads what is world-readable here
    public.write_text("anyone")
    public.chmod(0o644)
    assert as_nobody(public).stdout == "anyone"
    for path in (record_path, context_path, home.jobs_dir):
        other = as_nobody(path)
        assert other.returncode != 0 and token not in other.stdout, path
        assert "Permission denied" in other.stderr, other.stderr


def test_nats_context_file_reaches_the_jobs_traffic(busy_job):
    home, job = busy_job
    ctx = json.loads((home.contexts / f"{job.name}.json").read_text())
    assert ctx["description"] == f"monarch job {job.name} (pid {job.pid})"
    assert "@" not in ctx["url"]  # the secret is in its own field, as the nats CLI expects

    async def first_message() -> str:
        nc = await nats.connect(ctx["url"], token=ctx["token"] or None, connect_timeout=10)
        try:
            got: asyncio.Future = asyncio.get_running_loop().create_future()

            async def on_msg(msg) -> None:
                if not got.done():
                    got.set_result(msg.subject)

            await nc.subscribe("mon.>", cb=on_msg)
            return await asyncio.wait_for(got, 30)
        finally:
            await nc.close()

    assert asyncio.run(first_message()).startswith("mon.default.")


def test_record_and_context_go_when_the_job_ends(home):
    job = Job(home)
    try:
        assert [j["name"] for j in home.jobs()] == [job.name]
        assert (home.contexts / f"{job.name}.json").exists()
        job.end()
        assert _records(home) == [] and list(home.contexts.glob("*.json")) == []
        assert home.jobs() == []
    finally:
        job.kill()


def test_stale_record_of_a_killed_job_is_pruned_not_listed(home):
    job = Job(home)
    try:
        job.popen.send_signal(signal.SIGKILL)
        job.popen.wait(30)
        assert [r["name"] for r in _records(home)] == [job.name]  # it could not remove it
        assert home.jobs() == []
        assert _records(home) == [] and list(home.contexts.glob("*.json")) == []
        ps = home.monarch("ps")
        assert ps.returncode == 1 and "no running job found" in ps.stderr
    finally:
        job.kill()


def test_several_jobs_need_job_to_pick_one(home):
    first, second = Job(home, MONARCH_JOB_NAME="alpha"), None
    try:
        second = Job(home)
        assert first.name == "alpha" and second.name.startswith("train-")
        ps = home.monarch("ps")
        assert ps.returncode == 2 and "--job" in ps.stderr
        assert "alpha" in ps.stderr and second.name in ps.stderr
        picked = home.monarch("ps", "--job", "alpha", "--json")
        assert picked.returncode == 0, picked.stderr
        assert json.loads(picked.stdout)["procs"] == []
        unknown = home.monarch("ps", "--job", "nosuch")
        assert unknown.returncode == 2 and "no running job named 'nosuch'" in unknown.stderr
        assert "alpha" in unknown.stderr and second.name in unknown.stderr
        taken = Job(home, MONARCH_JOB_NAME="alpha")  # a running job keeps its name
        try:
            assert taken.name.startswith("alpha-")
        finally:
            taken.end()
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_a_job_on_an_external_broker_hands_tools_its_credentials_and_key(home):
    """Token login and signed messages: ``ps`` gets both from the record, none from its shell."""
    token = "external-token-0123456789"
    with EmbeddedBroker(token=token) as broker:
        plain_url = broker.url.replace(f"{token}@", "")
        job = Job(
            home, procs=True, MONARCH_NATS_URL=plain_url, MONARCH_NATS_TOKEN=token, MONARCH_AUTH="1",
            MONARCH_STOP_TIMEOUT="1",  # its end waits 1 s for the sleeping endpoint, not 10
        )  # fmt: skip
        try:
            assert job.record["embedded"] is False and job.record["url"] == plain_url
            assert job.record["credentials"]["nats_token"] == token
            key = job.record["credentials"]["nats_job_key"]
            assert len(key) >= 32
            ps = home.monarch("ps", "--json")
            assert ps.returncode == 0, ps.stderr
            # The procs drop unsigned requests: they answer only because ps signed with the key.
            snap = json.loads(ps.stdout)
            assert [p["state"] for p in snap["procs"]] == ["up"]
            assert [m["name"] for m in snap["meshes"]] == ["sleepers"]
            ctx = json.loads((home.contexts / f"{job.name}.json").read_text())
            assert ctx["url"] == plain_url and ctx["token"] == token
            job.end()
        finally:
            job.kill()


def test_a_job_that_ended_after_discovery_is_reported_not_a_traceback(home):
    """The record is found while its owner lives; the owner ends while the tool connects."""
    owner = subprocess.Popen(["sleep", "600"])
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never greets: a dying broker
    try:
        port = listener.getsockname()[1]
        home.jobs_dir.mkdir(parents=True, mode=0o700)
        record = {
            "name": "gone",
            "url": f"nats://sometoken1234567890@127.0.0.1:{port}",
            "namespace": "default",
            "owner": process_identity(owner.pid),
            "started_at": 0.0,
            "script": "x.py",
            "embedded": True,
            "credentials": {},
        }
        fd = os.open(home.jobs_dir / "gone.json", os.O_WRONLY | os.O_CREAT, 0o600)
        with open(fd, "w") as f:
            json.dump(record, f)
        ps = subprocess.Popen(
            [sys.executable, "-m", "monarch.cli.main", "ps"],
            cwd=ROOT,
            env=home.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        listener.settimeout(60)
        conn, _ = listener.accept()  # ps found the job and is connecting: the job ends now
        owner.kill()
        owner.wait(10)
        conn.close()
        listener.close()
        _, err = ps.communicate(timeout=90)
        assert ps.returncode == 1 and "monarch ps: job gone ended" in err
        assert "Traceback" not in err and "sometoken" not in err
    finally:
        listener.close()
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)


def test_no_job_and_no_broker_says_what_to_do(home):
    ps = home.monarch("ps")
    assert ps.returncode == 1 and "no running job found and no broker given" in ps.stderr
    assert home.monarch("jobs").stdout.strip() == "no running jobs"


def test_invalid_job_name_is_refused_naming_the_variable(home):
    out = subprocess.run(
        [sys.executable, "-c", "from monarch.core.process_runtime import runtime; runtime()"],
        cwd=ROOT,
        env={**home.env, "MONARCH_JOB_NAME": "../evil"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode != 0 and "MONARCH_JOB_NAME" in out.stderr
    assert _records(home) == []


@pytest.mark.parametrize("bad", ["train\n", "../evil", "", "a" * 65, "-x"])
def test_a_job_name_that_is_not_a_plain_file_name_is_refused(bad):
    from monarch.broker.connections.job_records import check_name, find_job

    with pytest.raises(ValueError, match="invalid job name"):
        check_name(bad)
    assert find_job(bad) is None
    assert check_name("train_2-a") == "train_2-a"


@pytest.mark.parametrize(
    "argv0, stem",
    [
        ("/home/u/train.py", "train"),
        ("-c", "python"),
        ("", "python"),
        ("/x/mypkg/__main__.py", "mypkg"),
        ("my job!.py", "my-job"),
    ],
)
def test_default_name_comes_from_the_script(argv0, stem):
    assert default_stem(argv0) == stem
