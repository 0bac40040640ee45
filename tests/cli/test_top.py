"""``monarch top`` against a real job: in a tmux terminal of fixed size, and ``--once``.

The job (tests/cli/watch_job.py) has a mesh called in a loop, an actor stalled
in a long sleep (MONARCH_STALL_THRESHOLD=1) and a failed one. The screen is
read with ``tmux capture-pane``; keys go in with ``send-keys``. The last
screen is kept as an artefact (its path is printed).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
import uuid

import pytest

from tests.cli.watching import Job, artefact_dir, watch_env
from tests.hosts.agents import ROOT

WIDTH, HEIGHT = 200, 50
# A job starts several processes: on a busy machine that takes a while.
pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def job(nats_url):
    j = Job(nats_url)
    yield j
    j.end()


class Tmux:
    """A private tmux server (own socket) running one command in a fixed-size pane."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.socket = "monarch-top-" + uuid.uuid4().hex[:8]
        self.env = {**env, "TERM": "xterm-256color"}
        self.tmux("new-session", "-d", "-s", "top", "-x", str(WIDTH), "-y", str(HEIGHT), command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, ok, what: str, timeout: float = 60) -> str:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if ok(screen):
                return screen
            time.sleep(0.5)
        raise AssertionError(f"never saw {what} within {timeout} s; the screen:\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def top_command() -> str:
    """top, then its exit status, then a pause so that the pane stays readable."""
    top = shlex.join([sys.executable, "-m", "monarch.cli.main", "top"])
    return f"cd {shlex.quote(str(ROOT))} && {top}; echo TOP-EXIT=$?; sleep 120"


def whole_job_shown(screen: str) -> bool:
    # The failure's reason and the stall's endpoint too: "failed" is in the header's count
    # as soon as one is known, which on a busy machine may be a refresh before its reason.
    return (
        all(w in screen for w in ("mesh workers", "mesh sleepy", "mesh doomed"))
        and all(s in screen for s in ("serving", "stalled", "failed"))
        and re.search(r"workers\s+ping\s+2\s+[0-9.]*[1-9][0-9.]*/s", screen) is not None
        and "boom: this actor was broken on purpose" in screen
        and "sleep running" in screen
    )


def test_top_shows_the_job_and_answers_keys(job, tmp_path):
    t = Tmux(top_command(), job.env)
    try:
        screen = t.wait_for(whole_job_shown, "the meshes, their states and a rate", timeout=150)
        assert "boom: this actor was broken on purpose" in screen  # the failure's reason
        assert "sleep running" in screen  # the stall, with its endpoint
        path = artefact_dir(tmp_path) / "top-screen.txt"
        path.write_text(screen)
        print(f"\nmonarch top screen saved: {path}")

        t.keys("?")
        t.wait_for(lambda s: "r refresh now" in s, "the help line")
        t.keys("?")  # not Escape: an Escape and a key sent at once read as Alt+key
        t.wait_for(lambda s: "r refresh now" not in s, "the help line gone")
        t.keys("s")
        t.wait_for(lambda s: "sorted by rate" in s, "the sort by rate")
        t.keys("Down", "Down")  # root -> host -> first proc
        t.wait_for(lambda s: re.search(r"endpoints \(proc [\w-]+\)", s), "the proc's endpoints")
        t.keys("f")
        t.keys("-l", "workers")
        t.keys("Enter")
        screen = t.wait_for(lambda s: "filter: 'workers'" in s, "the filter applied")
        t.wait_for(
            lambda s: "mesh workers" in s and "mesh sleepy" not in s and "mesh doomed" not in s,
            "only the workers mesh in the tree",
        )
        t.keys("q")
        screen = t.wait_for(lambda s: "TOP-EXIT=" in s, "top exiting on q")
        assert "TOP-EXIT=0" in screen and "Traceback" not in screen, screen
    finally:
        t.close()


def test_top_once_prints_a_snapshot(job):
    out = subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", "top", "--once"],
        cwd=ROOT,
        env=job.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for word in (
        "stall over",
        "sleep took",
        "mesh workers",
        "mesh sleepy",
        "mesh doomed",
        "serving",
        "stalled",
        "failed",
        "ENDPOINTS",
    ):
        assert word in out.stdout


def test_top_once_without_a_job_says_so(nats_url):
    env = watch_env(nats_url, "nojob" + uuid.uuid4().hex[:8])
    out = subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", "top", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "waiting for a job: no proc answers" in out.stderr and "Traceback" not in out.stderr


def test_top_says_job_ended_and_exits(nats_url):
    j = Job(nats_url)
    t = Tmux(top_command(), j.env)
    try:
        t.wait_for(whole_job_shown, "the job", timeout=150)
        assert j.end() == 0
        screen = t.wait_for(
            lambda s: "TOP-EXIT=" in s, "top exiting after the job ended", timeout=90
        )
        assert "job ended" in screen and "TOP-EXIT=0" in screen, screen
        assert "Traceback" not in screen, screen
    finally:
        t.close()
        j.end()


def test_top_with_no_broker_there_is_a_clear_error(nats_url):
    from monarch.broker.connections.server import free_port

    env = watch_env(f"nats://127.0.0.1:{free_port()}", "nobroker")
    for extra in ([], ["--once"]):
        out = subprocess.run(
            [sys.executable, "-m", "monarch.cli.main", "top", *extra, "--connect-timeout", "2"],
            cwd=ROOT,
            env={**env, "TERM": "dumb"},
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 1, (extra, out.stderr)
        assert "cannot reach the NATS broker" in out.stderr and "Traceback" not in out.stderr
