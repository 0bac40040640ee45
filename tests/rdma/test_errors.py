"""Failures: a dead or stopped owner, a server that stops mid-transfer. Nothing hangs,
and nothing half done is reported done."""

from __future__ import annotations

import base64
import dataclasses
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from monarch.rdma import OwnerGoneError, RDMABuffer, RDMAError, RDMATimeoutError
from monarch.rdma import protocol as p
from monarch.rdma.transports import tcp_transport
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def other_owner(nats_url):
    """A separate process owning a buffer: (process, buffer handle)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/rdma/owner_process.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()
        buf = pickle.loads(base64.b64decode(line))
        yield proc, buf
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.close()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.mark.parametrize("transport", ["same_host", "tcp"])
def test_owner_process_gone(other_owner, monkeypatch, transport):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    proc, buf = other_owner
    dst = bytearray(16)
    buf.read_into(dst, offset=0).get(timeout=30)
    assert dst == b"owned elsewhere "
    proc.stdin.close()
    proc.wait(20)
    with pytest.raises(OwnerGoneError, match="exited"):
        buf.read_into(dst, offset=0).get(timeout=30)
    with pytest.raises(OwnerGoneError):
        buf.write_from(b"x").get(timeout=30)


def test_stopped_owner_times_out_instead_of_hanging(other_owner, monkeypatch):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")  # same_host needs no help from the owner
    proc, buf = other_owner
    buf.read_into(bytearray(4), offset=0).get(timeout=30)
    os.kill(proc.pid, signal.SIGSTOP)
    assert wait_until(lambda: _state(proc.pid) == "T")  # the signal takes effect asynchronously
    with pytest.raises(RDMATimeoutError) as info:
        buf.read_into(bytearray(4), offset=0, timeout=0.5).get(timeout=30)
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(TimeoutError):
        buf.write_from(b"abcd", timeout=0.5).get(timeout=30)
    os.kill(proc.pid, signal.SIGCONT)
    dst = bytearray(5)
    buf.read_into(dst, offset=0).get(timeout=30)  # usable again once the owner runs
    assert dst == b"owned"


class _HalfServer:
    """A fake bulk server that answers one request and hangs up halfway through its payload."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            head = conn.recv(p.REQUEST.size, socket.MSG_WAITALL)
            op, length = p.REQUEST.unpack(head)[2], p.REQUEST.unpack(head)[7]
            if op == p.READ:
                conn.sendall(p.RESPONSE.pack(p.OK, 0, length, 0) + b"x" * (length // 2))
            else:
                conn.sendall(p.RESPONSE.pack(p.GO, 0, 0, 0))
                conn.recv(length, socket.MSG_WAITALL)  # all of it, then no acknowledgement

    def close(self) -> None:
        self.thread.join(10)
        self.sock.close()


@pytest.mark.parametrize("direction", ["read", "write"])
def test_a_transfer_cut_short_is_an_error_not_a_success(nats_url, monkeypatch, direction):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")
    tcp_transport().close()  # no pooled connection: talk to the fake server
    real = RDMABuffer(bytearray(1 << 20))
    server = _HalfServer()
    fake = RDMABuffer._from_handle(
        dataclasses.replace(real.handle, host="127.0.0.1", port=server.sock.getsockname()[1])
    )
    try:
        with pytest.raises(OwnerGoneError, match="closed"):
            if direction == "read":
                fake.read_into(bytearray(1 << 20)).get(timeout=30)
            else:
                fake.write_from(bytes(1 << 20)).get(timeout=30)
    finally:
        server.close()
        real.drop()


def test_errors_share_one_base():
    from monarch.rdma import errors

    for name in (
        "BufferDroppedError",
        "OwnerGoneError",
        "ReadOnlyBufferError",
        "TransportUnavailableError",
        "RDMATimeoutError",
    ):
        assert issubclass(getattr(errors, name), RDMAError)
