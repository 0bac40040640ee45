"""For the watch tests: a real job to watch (tests/cli/watch_job.py) and where artefacts go."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests.hosts.agents import ROOT

JOB = Path(__file__).with_name("watch_job.py")


def watch_env(nats_url: str, namespace: str) -> dict[str, str]:
    """The environment of the job and of its watchers: one broker, one namespace of their own."""
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        MONARCH_NATS_URL=nats_url,
        MONARCH_NAMESPACE=namespace,
        MONARCH_STALL_THRESHOLD="1",
        MONARCH_STOP_TIMEOUT="2",
        MONARCH_OPEN_BROKER_OK="1",
    )


class Job:
    """The job of watch_job.py, started in its own namespace; ``end()`` stops it (bounded)."""

    def __init__(self, nats_url: str) -> None:
        self.namespace = "watch" + uuid.uuid4().hex[:8]
        self.env = watch_env(nats_url, self.namespace)
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB)],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # One reader thread keeps the pipe drained (a full pipe would block the job).
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + 180
        seen = []
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if line.strip() == "ready":
                return
            if not line:  # the job exited
                break
        self.end()
        raise AssertionError(f"the watched job did not start: {''.join(seen)[-2000:]}")

    def _read(self, lines: queue.Queue[str]) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put("")

    def end(self) -> int:
        """Stop the job (it stops its procs); its exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")  # type: ignore[union-attr]
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def artefact_dir(tmp_path: Path) -> Path:
    """MONARCH_TEST_ARTIFACTS if set (the lead keeps them), else the test's tmp_path."""
    where = Path(os.environ.get("MONARCH_TEST_ARTIFACTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where
