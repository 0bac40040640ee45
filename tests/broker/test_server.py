"""The embedded nats-server: starts ready for JetStream, stops cleanly, never outlives us."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import nats
import pytest

from monarch.broker.connections.server import BrokerError, EmbeddedBroker, find_nats_server
from monarch.settings import settings
from tests.helpers import pid_alive, wait_until


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    return wait_until(lambda: not pid_alive(pid), timeout=timeout, interval=0.05)


def _our_nats_servers() -> set[int]:
    """Pids of nats-server processes that are direct children of this test process."""
    pids = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if comm == "nats-server" and int(rest[1]) == os.getpid() and rest[0] != "Z":
            pids.add(int(entry))
    return pids


@pytest.fixture(autouse=True)
def no_leftover_servers():
    """Fail any test that leaves behind a nats-server it started (and kill it)."""
    before = _our_nats_servers()
    yield
    leftover = _our_nats_servers() - before
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"test left nats-server processes running: {leftover}"


def test_started_broker_serves_jetstream_to_a_client():
    async def roundtrip(url: str) -> bytes:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream(timeout=5)
            await js.add_stream(name="EMBEDDED", subjects=["embedded.>"])
            ack = await js.publish("embedded.x", b"hello")
            msg = await js.get_msg("EMBEDDED", ack.seq)
            return msg.data
        finally:
            await nc.close()

    with EmbeddedBroker() as broker:
        assert broker.running()
        assert broker.url == f"nats://127.0.0.1:{broker.port}"
        data = asyncio.run(asyncio.wait_for(roundtrip(broker.url), 20))
    assert data == b"hello"


def test_stop_kills_server_removes_store_and_is_idempotent():
    broker = EmbeddedBroker().start()
    pid, store = broker.pid, broker.store_dir
    assert pid is not None and os.path.isdir(store)
    broker.stop()
    assert not broker.running() and broker.pid is None
    assert _wait_gone(pid)
    assert not os.path.exists(store)
    broker.stop()  # second stop is a no-op


def test_stop_keeps_a_store_dir_the_caller_gave(tmp_path):
    store = tmp_path / "store"
    with EmbeddedBroker(store_dir=str(store)):
        pass
    assert (store / "jetstream").is_dir()


def test_two_brokers_run_side_by_side():
    with EmbeddedBroker() as a, EmbeddedBroker() as b:
        assert a.port != b.port and a.store_dir != b.store_dir
        assert a.running() and b.running()


def test_bad_binary_path_gives_clear_broker_error(monkeypatch, tmp_path):
    missing = str(tmp_path / "no-such-nats-server")
    try:
        with monkeypatch.context() as m:
            m.setenv("MONARCH_NATS_SERVER", missing)
            settings.cache_clear()
            with pytest.raises(BrokerError, match="MONARCH_NATS_SERVER") as info:
                find_nats_server()
            assert missing in str(info.value)
            broker = EmbeddedBroker()
            with pytest.raises(BrokerError, match="MONARCH_NATS_SERVER"):
                broker.start()
            assert not os.path.exists(broker.store_dir)
    finally:
        settings.cache_clear()


def test_server_that_exits_at_once_raises_with_its_output():
    broker = EmbeddedBroker(extra_args=["--no-such-flag-for-monarch"])
    with pytest.raises(BrokerError, match="no-such-flag-for-monarch"):
        broker.start(timeout=10)
    assert not broker.running()
    assert not os.path.exists(broker.store_dir)


def test_max_payload_reaches_the_server():
    async def server_max_payload(url: str) -> int:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            return nc.max_payload
        finally:
            await nc.close()

    with EmbeddedBroker(max_payload=4 * 1024 * 1024) as broker:
        assert asyncio.run(asyncio.wait_for(server_max_payload(broker.url), 20)) == 4 * 1024 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_server_dies_when_its_parent_is_sigkilled():
    script = textwrap.dedent(
        """
        import sys, time
        from monarch.broker.connections.server import EmbeddedBroker
        b = EmbeddedBroker().start()
        print(b.pid, b.store_dir, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    server_pid, store = None, None
    try:
        assert line and line[0].strip(), f"child printed nothing: {parent.poll()=}"
        pid_text, store = line[0].split(maxsplit=1)
        server_pid, store = int(pid_text), store.strip()
        assert pid_alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone(server_pid), "nats-server outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if server_pid is not None and pid_alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
        if store:
            shutil.rmtree(store, ignore_errors=True)  # no atexit ran to remove it
        parent.stdout.close()
        parent.stderr.close()


def test_explicit_port_held_by_another_server_is_an_error_not_a_false_start():
    with EmbeddedBroker() as first:
        second = EmbeddedBroker(port=first.port)
        with pytest.raises(BrokerError, match="address already in use"):
            second.start(timeout=10)
        assert first.running() and not second.running()


def test_start_embedded_broker_is_stopped_at_interpreter_exit():
    script = (
        "from monarch.broker.connections.server import start_embedded_broker\n"
        "b = start_embedded_broker()\n"
        "print(b.pid, b.store_dir)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid_text, store = out.stdout.split(maxsplit=1)
    assert _wait_gone(int(pid_text))
    assert not os.path.exists(store.strip())
