"""Shared fixtures: a real nats-server with JetStream, and a check that tests leave no processes.

The broker is session-scoped: starting one is cheap, but sharing it keeps the
suite quick, and every test uses its own meshes (unique names and ids), so
tests cannot see each other's traffic. ``MONARCH_NATS_URL`` points the
in-process client runtime (and every proc it starts) at it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

import pytest

from monarch.actors.procs.zygote import TORCH_ZYGOTE_NAME
from monarch.broker.connections.server import EmbeddedBroker
from tests.helpers import descendants, wait_until
from tests.turns import forget_the_workers_terminal, turn

# Clients write job records and NATS contexts (monarch.broker.connections.job_records) under
# XDG_RUNTIME_DIR and XDG_CONFIG_HOME: the suite's go to a folder of its own, never
# to the real home's.
_XDG = tempfile.mkdtemp(prefix="monarch-tests-xdg-")
os.environ["XDG_RUNTIME_DIR"] = os.path.join(_XDG, "run")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_XDG, "config")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700)
atexit.register(shutil.rmtree, _XDG, ignore_errors=True)


def pytest_configure(config):
    forget_the_workers_terminal(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Two tests at a time, an ``alone`` one by itself (tests/turns.py)."""
    with turn(item):
        yield


@pytest.fixture(scope="session")
def nats_url():
    broker = EmbeddedBroker().start()
    os.environ["MONARCH_NATS_URL"] = broker.url
    from monarch.settings import settings

    settings.cache_clear()
    # The client's proc zygote lives as long as the session: start it before any
    # test counts its processes.
    from monarch.actors.procs.zygote_client import ensure_zygote
    from monarch.core.process_runtime import runtime

    runtime()
    ensure_zygote()
    yield broker.url
    from monarch.core.process_runtime import shutdown_runtime

    shutdown_runtime()
    broker.stop()
    os.environ.pop("MONARCH_NATS_URL", None)
    settings.cache_clear()


@pytest.fixture(autouse=True)
def no_leaked_processes(request):
    """Fail a test that leaves behind a process it started (and kill the leftovers)."""
    before = descendants()
    yield
    leaked = set()
    what = {}
    if not wait_until(lambda: not (_ours(descendants()) - before), timeout=10):
        leaked = _ours(descendants()) - before
        for pid in leaked:
            what[pid] = _describe(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not leaked, f"test left processes running: {what}"


def _ours(pids: set[int]) -> set[int]:
    """Less the torch zygotes: a zygote (a client script's, started by the test) forks
    one once it is idle, maybe only after the test that started it; it dies with its
    zygote (parent-death signal), so a zygote left behind is still caught."""
    return {pid for pid in pids if _comm(pid) != TORCH_ZYGOTE_NAME}


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _describe(pid: int) -> str:
    """A leftover process's command line and parent, for the failure message."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/stat") as f:
            ppid = f.read().rsplit(")", 1)[1].split()[1]
        return f"{cmd} (parent {ppid})"
    except OSError:
        return "gone"


class FaultRecorder:
    """Stands in for the root's unhandled_fault_hook (whose default exits the process)."""

    def __init__(self) -> None:
        self.failures: list = []
        self.expected = False

    def __call__(self, failure) -> None:
        self.failures.append(failure)

    def wait(self, n: int = 1, timeout: float = 30.0) -> list:
        self.expected = True
        assert wait_until(lambda: len(self.failures) >= n, timeout=timeout), (
            f"expected {n} unhandled failure(s), got {self.failures}"
        )
        return self.failures


@pytest.fixture(autouse=True)
def root_faults(monkeypatch):
    """Unhandled failures reach this recorder; a test that did not expect one fails."""
    import monarch.actor

    recorder = FaultRecorder()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", recorder)
    yield recorder
    if not recorder.expected:
        assert recorder.failures == [], f"unexpected unhandled failures: {recorder.failures}"
