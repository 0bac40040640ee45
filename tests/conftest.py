"""Shared fixtures: a real nats-server with JetStream, and a check that tests leave no processes.

The broker is session-scoped: starting one is cheap, but sharing it keeps the
suite quick, and every test uses its own meshes (unique names and ids), so
tests cannot see each other's traffic. ``MONARCH_NATS_URL`` points the
in-process client runtime (and every proc it starts) at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from monarch.broker.server import EmbeddedBroker


def descendants(pid: int | None = None) -> set[int]:
    """Pids of all live descendants of ``pid`` (default: this process), zombies excluded."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        state, ppid = rest[0], int(rest[1])
        if state == "Z":
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture(scope="session")
def nats_url():
    broker = EmbeddedBroker().start()
    os.environ["MONARCH_NATS_URL"] = broker.url
    from monarch.broker.config import settings

    settings.cache_clear()
    # The client's proc zygote lives as long as the session: start it before any
    # test counts its processes.
    from monarch.actors.launcher import ensure_zygote
    from monarch.core.runtime import runtime

    runtime()
    ensure_zygote()
    yield broker.url
    from monarch.core.runtime import shutdown_runtime

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
    if not wait_until(lambda: not (descendants() - before), timeout=10):
        leaked = descendants() - before
        for pid in leaked:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not leaked, f"test left processes running: {sorted(leaked)}"


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


@contextlib.contextmanager
def captured_traffic(url: str, subject: str = "mon.default.>"):
    """Collect ``(subject, headers, data)`` of every message on ``subject`` while inside.

    A raw nats-py subscriber on a thread of its own, the way a person watching
    with ``nats sub`` would see the traffic; subscribed before the block runs,
    and given a moment after it to receive the last messages.
    """
    captured: list = []
    stop = threading.Event()
    listening = threading.Event()

    async def listen():
        import nats

        nc = await nats.connect(url)

        async def on(msg):
            captured.append((msg.subject, msg.headers or {}, msg.data))

        await nc.subscribe(subject, cb=on)
        await nc.flush()
        listening.set()
        while not stop.is_set():
            await asyncio.sleep(0.02)
        await nc.flush()
        await nc.close()

    thread = threading.Thread(target=lambda: asyncio.run(listen()), daemon=True)
    thread.start()
    assert listening.wait(30), "the traffic listener did not subscribe"
    try:
        yield captured
    finally:
        time.sleep(0.3)
        stop.set()
        thread.join(30)
