"""Starting and stopping real ``monarch host`` processes for tests."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Agent:
    """A ``monarch host`` process; ``uid`` is read from its first line of output."""

    def __init__(self, popen: subprocess.Popen, name: str) -> None:
        self.popen = popen
        self.name = name
        self.uid = ""
        self.banner = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout: float = 30.0) -> Agent:
        """Block until the agent says it serves (it is registered by then)."""
        self.banner = _readline(self.popen, timeout)
        if "serving" not in self.banner:
            self.stop()
            raise RuntimeError(f"agent {self.name} did not start: {self.banner!r}")
        self.uid = self.banner.split("(", 1)[1].split(")", 1)[0]
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Signal the agent and wait for it; SIGKILL if it does not go in time."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode


def start_agent(
    name: str,
    *args: str,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> Agent:
    """Start ``monarch host --name NAME *args`` (optionally behind ``prefix``, e.g. ip netns exec)."""
    cmd = [*(prefix or []), sys.executable, "-m", "monarch.cli.main", "host", "--name", name, *args]
    popen = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=dict(os.environ if env is None else env, PYTHONPATH=str(ROOT)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    return Agent(popen, name)


def unique_label() -> str:
    """A label value no other test's agents carry, so tests never pick each other's hosts."""
    return uuid.uuid4().hex[:8]


def _readline(popen: subprocess.Popen, timeout: float) -> str:
    assert popen.stdout is not None
    fd, buf = popen.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").split("\n", 1)[0]
