"""Helpers tests share (import them from here, not from conftest): process checks,
bounded waits, watching the wire, and one proc-mesh fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

import pytest


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


def run_in_own_loop(coro, timeout: float = 90.0):  # type: ignore[no-untyped-def]
    """Run ``coro`` to its end, at most ``timeout`` s, on a loop of its own.

    (asyncio.run would touch this test process's SIGINT handling.)
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        loop.close()


async def until(predicate, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """In a coroutine: wait for ``predicate()``, or fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.01)


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


def proc_mesh_fixture(
    per_host: dict[str, int],
    *,
    name: str | None = None,
    scope: str = "function",
    wait_ready: bool = False,
) -> Any:
    """A pytest fixture that yields a proc mesh of ``per_host`` on this machine, stopped after.

    ``procs = proc_mesh_fixture({"gpus": 2})`` at module level makes a
    fixture named ``procs``. ``wait_ready`` waits for the procs before the
    test's leaked-process snapshot (wider scopes need it).
    """

    @pytest.fixture(scope=scope)
    def fixture(nats_url: str) -> Any:
        from monarch.actor import this_host

        pm = this_host().spawn_procs(per_host=per_host, name=name)
        if wait_ready:
            pm.initialized.get(timeout=60)
        yield pm
        pm.stop().get(timeout=60)

    return fixture
