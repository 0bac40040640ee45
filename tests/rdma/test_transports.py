"""Buffers passed through endpoints, on every transport that runs here, and how one is chosen."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import subprocess
import sys

import pytest
import torch

from monarch.rdma import (
    RDMABuffer,
    TransportUnavailableError,
    get_rdma_backend,
    get_rdma_transport,
    is_ibverbs_available,
)
from monarch.rdma import transports as tr
from monarch.rdma.transports import choose_transport, ibverbs, same_host
from tests.helpers import run_client
from tests.rdma.rdma_actors import pattern


def test_actor_owned_buffer_read_and_written_by_the_client(owners, transport):
    buf = owners.slice(gpus=0).make.call_one("a", 1 << 20, 3).get(timeout=30)
    assert isinstance(buf, RDMABuffer) and buf.owner.startswith("rdmaprocs-")
    assert buf.transport == transport and buf.backend == "tcp"
    dst = torch.zeros(1 << 20, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=30)
    assert torch.equal(dst, pattern(1 << 20, 3))
    part = bytearray(1000)
    buf.read_into(part, offset=12345).get(timeout=30)
    assert part == bytes(pattern(1 << 20, 3)[12345:13345].numpy())
    buf.write_from(torch.full((4096,), 9, dtype=torch.uint8), offset=100).get(timeout=30)
    after = owners.slice(gpus=0).contents.call_one("a").get(timeout=30)
    expected = pattern(1 << 20, 3)
    expected[100:4196] = 9
    assert torch.equal(after, expected)


def test_client_owned_buffer_read_and_written_by_actors(owners, transport):
    t = pattern(300_000, 5)
    buf = RDMABuffer(t)
    try:
        got = owners.read.call(buf, 1000, 50_000).get(timeout=30)
        assert list(got.values()) == [bytes(t[1000:51000].numpy())] * 2
        assert set(owners.transport.call(buf).get(timeout=30).values()) == {transport}
        owners.slice(gpus=1).write.call_one(buf, b"\x01\x02\x03", 7).get(timeout=30)
        assert t[7:10].tolist() == [1, 2, 3]
    finally:
        buf.drop()


def test_proc_to_proc(owners, transport):
    buf = owners.slice(gpus=0).make.call_one("p2p", 4096, 11).get(timeout=30)
    data = owners.slice(gpus=1).read.call_one(buf, 0, 4096).get(timeout=30)
    assert data == bytes(pattern(4096, 11).numpy())


def test_drop_by_owner_fails_readers_everywhere(owners, transport):
    buf = owners.slice(gpus=0).make.call_one("d", 1024).get(timeout=30)
    owners.slice(gpus=0).drop.call_one("d").get(timeout=30)
    from monarch.rdma import BufferDroppedError

    with pytest.raises(BufferDroppedError):
        buf.read_into(bytearray(1024)).get(timeout=30)
    assert owners.slice(gpus=1).read_error.call_one(buf).get(timeout=30) == "BufferDroppedError"


def test_drop_by_a_reader_releases_the_owners_registration(owners, transport):
    buf = owners.slice(gpus=0).make.call_one("r", 64).get(timeout=30)
    buf.drop().get(timeout=30)
    assert owners.slice(gpus=0).read_error.call_one(buf).get(timeout=30) == "BufferDroppedError"


def test_auto_prefers_same_host_and_falls_back_to_tcp(owners):
    buf = owners.slice(gpus=0).make.call_one("auto", 64).get(timeout=30)
    assert get_rdma_transport() == "same_host" and get_rdma_backend() == "tcp"
    assert choose_transport(buf.handle).name == "same_host"
    elsewhere = dataclasses.replace(buf.handle, host_id="another-host")
    assert choose_transport(elsewhere).name == "tcp"
    on_gpu = dataclasses.replace(buf.handle, device="cuda:0")
    assert choose_transport(on_gpu).name == "tcp"


def test_forcing_a_transport_that_cannot_reach_the_buffer_is_an_error(owners, monkeypatch):
    buf = owners.slice(gpus=0).make.call_one("forced", 64).get(timeout=30)
    elsewhere = RDMABuffer._from_handle(dataclasses.replace(buf.handle, host_id="another-host"))
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "same_host")
    with pytest.raises(TransportUnavailableError, match="another host"):
        elsewhere.read_into(bytearray(64)).get(timeout=30)
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "ibverbs")
    with pytest.raises(TransportUnavailableError, match="MONARCH_RDMA_TRANSPORT=ibverbs"):
        buf.read_into(bytearray(64)).get(timeout=30)
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="MONARCH_RDMA_TRANSPORT"):
        buf.read_into(bytearray(64)).get(timeout=30)


def test_eperm_falls_back_to_tcp_and_is_remembered(owners, monkeypatch):
    monkeypatch.setattr(tr, "_denied", {})
    buf = owners.slice(gpus=0).make.call_one("eperm", 4096, 2).get(timeout=30)
    readv, writev = same_host._FNS

    def denied(*args):
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(same_host, "_FNS", (denied, writev))
    dst = bytearray(4096)
    buf.read_into(dst).get(timeout=30)
    assert dst == bytes(pattern(4096, 2).numpy())
    assert choose_transport(buf.handle).name == "tcp"  # remembered for this peer
    assert "EPERM" in next(iter(tr._denied.values()))
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "same_host")
    monkeypatch.setattr(tr, "_denied", {})
    with pytest.raises(TransportUnavailableError, match="EPERM"):
        buf.read_into(dst).get(timeout=30)


def test_ptrace_rules(monkeypatch):
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        monkeypatch.setattr(same_host, "ptrace_scope", lambda: None)
        assert same_host.ptrace_allows(os.getppid())[0]
        monkeypatch.setattr(same_host, "ptrace_scope", lambda: 1)
        monkeypatch.setattr(same_host, "_has_cap_sys_ptrace", lambda: False)
        assert same_host.ptrace_allows(child.pid) == (True, "")  # a descendant
        ok, why = same_host.ptrace_allows(os.getppid())  # an ancestor
        assert not ok and "ptrace_scope=1" in why
        monkeypatch.setattr(same_host, "ptrace_scope", lambda: 3)
        assert not same_host.ptrace_allows(child.pid)[0]
        assert same_host.ptrace_allows(os.getpid())[0]  # ourselves, always
    finally:
        child.stdin.close()
        child.wait(10)


def test_ptrace_denial_predicted_before_trying_uses_tcp(owners, monkeypatch):
    monkeypatch.setattr(tr, "_denied", {})
    monkeypatch.setattr(tr, "_allowed", set())
    monkeypatch.setattr(same_host, "ptrace_allows", lambda pid: (False, "scope says no"))
    buf = owners.slice(gpus=0).make.call_one("scope", 256, 4).get(timeout=30)
    assert choose_transport(buf.handle).name == "tcp"
    dst = bytearray(256)
    buf.read_into(dst).get(timeout=30)
    assert dst == bytes(pattern(256, 4).numpy())


# -- ibverbs: detection and fallback (no RDMA device here) ------------------------------


def test_ibverbs_is_detected_absent_and_never_chosen(owners):
    ok, why = ibverbs.status()
    assert not is_ibverbs_available() and not ok
    assert "pyverbs" in why or "RDMA device" in why
    buf = owners.slice(gpus=0).make.call_one("ibv", 64).get(timeout=30)
    assert buf.handle.rkey == 0  # the owner registered it with no device
    assert choose_transport(buf.handle).name != "ibverbs"


def test_ibverbs_detection_says_what_is_missing(monkeypatch):
    ibverbs.status.cache_clear()
    try:
        monkeypatch.setattr(ibverbs, "import_pyverbs", lambda: None)
        assert ibverbs.status() == (
            False,
            "pyverbs is not importable (Debian: apt-get install python3-pyverbs)",
        )
        ibverbs.status.cache_clear()
        monkeypatch.setattr(ibverbs, "import_pyverbs", lambda: object())
        monkeypatch.setattr(ibverbs.os.path, "isdir", lambda path: False)
        ok, why = ibverbs.status()
        assert not ok and "no ib modules" in why
    finally:
        monkeypatch.undo()
        ibverbs.status.cache_clear()
    assert ibverbs.status()[0] is False  # and back to the truth about this machine


def test_ibverbs_failure_falls_back(owners, monkeypatch):
    monkeypatch.setattr(tr, "_denied", {})
    monkeypatch.setattr(ibverbs, "status", lambda: (True, ""))
    buf = owners.slice(gpus=0).make.call_one("ibvfail", 512, 6).get(timeout=30)
    pretend = RDMABuffer._from_handle(dataclasses.replace(buf.handle, rkey=1234))
    assert choose_transport(pretend.handle).name == "ibverbs"
    dst = bytearray(512)
    pretend.read_into(dst).get(timeout=30)  # ibverbs has no device: denied, then same_host
    assert dst == bytes(pattern(512, 6).numpy())
    assert choose_transport(pretend.handle).name == "same_host"


def test_system_pyverbs_is_loaded_when_its_abi_matches():
    if not os.path.isdir(ibverbs.SYSTEM_PYVERBS):
        pytest.skip("python3-pyverbs is not installed")
    pv = ibverbs.import_pyverbs()
    assert pv is not None and pv.enums.IBV_WR_RDMA_READ is not None


def test_loading_pyverbs_leaves_the_root_logger_as_it_was(tmp_path):
    # Debian's pyverbs calls logging.basicConfig when it loads; a client that had not set
    # up logging would start printing INFO records (found by a third party's benchmark:
    # a bulk payload loaded pyverbs, then "disconnected from the broker" printed at exit)
    if not os.path.isdir(ibverbs.SYSTEM_PYVERBS):
        pytest.skip("python3-pyverbs is not installed")
    rc, out, err = run_client(
        tmp_path,
        """
        import logging
        from monarch.rdma.transports import ibverbs
        pv = ibverbs.import_pyverbs()
        root = logging.getLogger()
        print(pv is not None, root.handlers, logging.getLevelName(root.level))
        """,
    )
    assert rc == 0 and out.split() == ["True", "[]", "WARNING"], out + err


def test_queue_pair_attributes_and_work_requests_build_without_a_device():
    pv = ibverbs.import_pyverbs()
    if pv is None:
        pytest.skip("pyverbs is not importable")
    gid = "fe80:0000:0000:0000:0000:0000:0000:0001"
    local = {"qpn": 7, "psn": 100, "lid": 1, "gid": gid, "mtu": pv.enums.IBV_MTU_1024}
    remote = {"qpn": 9, "psn": 200, "lid": 2, "gid": gid, "mtu": pv.enums.IBV_MTU_1024}
    attr = ibverbs.rts_attributes(pv, local, remote, port=1, gid_index=0)
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (9, 200, 100)
    assert attr.ah_attr.dlid == 2 and attr.ah_attr.dgid == gid
    for op in ("read", "write", "fetch_add", "compare_and_swap"):
        ibverbs.work_request(pv, op, 0x1000, 8, 5, 6, 0x2000, 1, 2)


def test_queue_pair_exchange_goes_over_nats(owners):
    from monarch.core.process_runtime import runtime
    from monarch.rdma import control

    class FakeVerbs:
        def accept(self, request):
            return {"qpn": request["qpn"] + 1, "psn": 5, "lid": 0, "gid": "g", "mtu": 3}

    rt = runtime()
    control.serve_queue_pairs(rt, FakeVerbs())
    buf = RDMABuffer(bytearray(8))
    try:
        answer = control.exchange(buf.handle, {"op": "connect", "qpn": 41})
        assert answer["qpn"] == 42
    finally:
        buf.drop()


# -- CUDA ------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA here")
def test_cuda_buffers_and_cuda_destinations(owners):
    t = pattern(1 << 20, 8).cuda()
    buf = RDMABuffer(t)
    try:
        assert buf.transport == "tcp"
        got = owners.slice(gpus=0).read.call_one(buf, 10, 1000).get(timeout=30)
        assert got == bytes(pattern(1 << 20, 8)[10:1010].numpy())
        owners.slice(gpus=1).write.call_one(buf, b"\x07" * 8, 0).get(timeout=30)
        assert t[:8].cpu().tolist() == [7] * 8
        remote = owners.slice(gpus=0).make.call_one("gpu-dst", 4096, 1).get(timeout=30)
        dst = torch.zeros(4096, dtype=torch.uint8, device="cuda")
        remote.read_into(dst).get(timeout=30)
        assert torch.equal(dst.cpu(), pattern(4096, 1))
        remote.write_from(torch.full((16,), 3, dtype=torch.uint8, device="cuda")).get(timeout=30)
        assert (
            owners.slice(gpus=0).contents.call_one("gpu-dst").get(timeout=30)[:16].tolist()
            == [3] * 16
        )
    finally:
        buf.drop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA here")
def test_cuda_memory_owned_by_a_proc_is_read_and_written_from_cpu_and_cuda(owners, monkeypatch):
    # the proc at gpus=0 sees the machine's first GPU as cuda:0
    buf = owners.slice(gpus=0).make.call_one("gpu-src", 3 << 20, 5, "cuda:0").get(timeout=30)
    try:
        assert buf.transport == "tcp"  # process_vm_readv cannot reach GPU memory
        expected = pattern(3 << 20, 5)
        on_cpu = torch.zeros(3 << 20, dtype=torch.uint8)
        buf.read_into(on_cpu).get(timeout=30)
        assert torch.equal(on_cpu, expected)
        on_gpu = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        buf.read_into(on_gpu, offset=1 << 20).get(timeout=30)
        assert torch.equal(on_gpu.cpu(), expected[1 << 20 : 2 << 20])
        buf.write_from(torch.full((5000,), 4, dtype=torch.uint8, device="cuda"), offset=7).get(
            timeout=30
        )
        buf.write_from(b"\x02" * 10, offset=0).get(timeout=30)
        after = owners.slice(gpus=0).contents.call_one("gpu-src").get(timeout=30)
        expected[7:5007] = 4
        expected[:10] = 2
        assert torch.equal(after, expected)
        monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "same_host")
        with pytest.raises(TransportUnavailableError, match="cuda:0 memory"):
            buf.read_into(on_cpu).get(timeout=30)
    finally:
        owners.slice(gpus=0).drop.call_one("gpu-src").get(timeout=30)
