"""Helpers tests share (import them from here, not from conftest): process checks,
bounded waits, watching the wire, and one proc-mesh fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
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


def cpu_binds() -> tuple[list[int], list[dict[str, str]]]:
    """This machine's CPUs, and a ``proc_bind`` for two procs of a host: the first CPU
    (``cpus``), the first two (``physcpubind``). Fails the test on a one-CPU machine."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail("this test needs a machine with two CPUs or more")
    return cpus, [{"cpus": str(cpus[0])}, {"physcpubind": f"{cpus[0]}-{cpus[1]}"}]


def signal_storm(popen: Any, sig: int, limit: float = 20.0) -> tuple[int, int]:
    """Send ``sig`` to ``popen`` again and again until it exits: (its exit code, signals sent).

    A long-running process stops on the first signal; every later one lands
    somewhere on its way out. SIGKILL after ``limit`` seconds (the code is then -9).
    """
    sent = 0
    deadline = time.monotonic() + limit
    while popen.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, sig)
            sent += 1
    try:
        return popen.wait(timeout=max(0.0, deadline - time.monotonic()) + 1), sent
    except subprocess.TimeoutExpired:
        popen.send_signal(signal.SIGKILL)
        return popen.wait(timeout=10), sent


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


class ForwardingProxy:
    """A TCP proxy on a free loopback port in front of ``127.0.0.1:upstream_port``.

    What a client sends goes to the server as it is; what the server sends goes
    through ``to_client(data, writer)``, which writes it (changed, or cut up, as
    the test needs). ``async with`` it: on leaving, the listener and every
    connection it serves are closed and their tasks ended.
    """

    def __init__(self, upstream_port: int, to_client) -> None:  # type: ignore[no-untyped-def]
        self.upstream_port = upstream_port
        self.to_client = to_client
        self.port = 0
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task] = set()

    async def __aenter__(self) -> ForwardingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._serving:
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, reader, writer) -> None:  # type: ignore[no-untyped-def]
        self._serving.add(asyncio.current_task())  # type: ignore[arg-type]
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(
            self._pipe(reader, up_writer, _as_it_is), self._pipe(up_reader, writer, self.to_client)
        )

    @staticmethod
    async def _pipe(src, dst, forward) -> None:  # type: ignore[no-untyped-def]
        try:
            while data := await src.read(65536):
                await forward(data, dst)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            dst.close()


async def _as_it_is(data: bytes, dst: asyncio.StreamWriter) -> None:
    dst.write(data)
    await dst.drain()


def run_client(tmp_path: Any, body: str, timeout: float = 90.0, **env: str) -> tuple[int, str, str]:
    """Run ``body`` as a client script (heartbeats every 0.2 s); its return code, stdout
    and stderr. One that does not end within ``timeout`` is killed, its procs too, and
    fails the test with what it printed."""
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = Path(tmp_path) / "client.py"
    script.write_text(textwrap.dedent(body))
    full_env = {**os.environ, "PYTHONPATH": str(root), "MONARCH_HEARTBEAT_INTERVAL": "0.2", **env}
    p = subprocess.Popen(
        [sys.executable, str(script)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = sorted(descendants(p.pid))
        p.kill()
        for pid in left:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=10)
        raise AssertionError(
            f"client script did not finish in {timeout} s:\n{out}\n{err}"
        ) from None
    return p.returncode, out, err
