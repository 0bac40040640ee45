"""RDMAAction: batches across owners, and 8-byte atomics done by the owner under a lock."""

from __future__ import annotations

import struct

import pytest
import torch

from monarch.rdma import RDMAAction, RDMABuffer
from tests.rdma.rdma_actors import pattern


def test_batch_of_reads_and_writes_on_several_owners(owners, transport):
    a = owners.slice(gpus=0).make.call_one("act-a", 8192, 1).get(timeout=30)
    b = owners.slice(gpus=1).make.call_one("act-b", 8192, 2).get(timeout=30)
    da, db = bytearray(100), torch.zeros(200, dtype=torch.uint8)
    action = (
        RDMAAction()
        .read_remote(a, da, offset=50)
        .read_remote(b, db, offset=0)
        .write_remote(a, b"\xaa" * 10, offset=0)
        .write_remote(b, bytearray(b"\xbb" * 5), offset=8000)
    )
    assert action.submit().get(timeout=30) is None  # as in Monarch (no atomics: no results)
    assert da == bytes(pattern(8192, 1)[50:150].numpy())
    assert torch.equal(db, pattern(8192, 2)[:200])
    assert (
        owners.slice(gpus=0).contents.call_one("act-a").get(timeout=30)[:10].tolist() == [0xAA] * 10
    )
    assert (
        owners.slice(gpus=1).contents.call_one("act-b").get(timeout=30)[8000:8005].tolist()
        == [0xBB] * 5
    )
    # An action can be submitted again.
    da[:] = bytes(100)
    action.submit().get(timeout=30)
    assert da[:10] == bytes(pattern(8192, 1)[50:60].numpy())


def test_atomics_semantics(owners, transport):
    buf = owners.slice(gpus=0).make.call_one("atom", 64).get(timeout=30)
    RDMAAction().write_remote(buf, struct.pack("<QQ", 10, 2**64 - 1)).submit().get(timeout=30)
    old = torch.zeros(8, dtype=torch.uint8)
    results = (
        RDMAAction()
        .fetch_add(buf, 0, 5)  # 10 -> 15
        .compare_and_swap(buf, 0, 99, 1)  # 15 != 99: unchanged
        .compare_and_swap(buf, 0, 15, 7)  # 15 -> 7
        .fetch_add(buf, 8, 3)  # wraps: 2**64 - 1 -> 2
        .fetch_add(buf, 0, -1, dst=old)  # 7 -> 6, old value also into dst
        .submit()
        .get(timeout=30)
    )
    assert results == [10, 15, 15, 2**64 - 1, 7]
    assert struct.unpack("<Q", old.numpy().tobytes())[0] == 7
    words = owners.slice(gpus=0).contents.call_one("atom").get(timeout=30)[:16].numpy().tobytes()
    assert struct.unpack("<QQ", words) == (6, 2)


def test_monarch_style_atomic_arguments(nats_url):
    t = torch.zeros(8, dtype=torch.uint8)
    buf = RDMABuffer(t)
    dst = bytearray(8)
    assert RDMAAction().fetch_add(buf, dst, 4).submit().get(timeout=30) == [0]
    assert RDMAAction().compare_and_swap(buf, dst, 4, 9).submit().get(timeout=30) == [4]
    assert dst == struct.pack("<Q", 4) and t.numpy().tobytes() == struct.pack("<Q", 9)
    buf.drop()


def test_concurrent_fetch_add_from_many_processes_is_atomic(owners, transport):
    t = torch.zeros(8, dtype=torch.uint8)
    buf = RDMABuffer(t)
    try:
        futs = [owners.add_many.call(buf, 40) for _ in range(2)]  # 2 calls x 2 procs x 40
        local = [RDMAAction().fetch_add(buf, 0, 1).submit() for _ in range(40)]
        seen = [v for f in futs for vm in [f.get(timeout=60)] for vs in vm.values() for v in vs]
        seen += [f.get(timeout=60)[0] for f in local]
        assert sorted(seen) == list(range(200))  # every old value exactly once
        assert struct.unpack("<Q", t.numpy().tobytes())[0] == 200
    finally:
        buf.drop()


def test_bad_atomics_and_overlaps_fail_when_added(nats_url):
    buf = RDMABuffer(bytearray(64))
    with pytest.raises(ValueError, match="aligned"):
        RDMAAction().fetch_add(buf, 4, 1)
    with pytest.raises(ValueError, match="outside"):
        RDMAAction().compare_and_swap(buf, 64, 0, 1)
    with pytest.raises(TypeError):
        RDMAAction().fetch_add(buf, 0, 1.5)
    local = bytearray(32)
    view = memoryview(local)
    with pytest.raises(ValueError, match="overlaps"):
        RDMAAction().read_remote(buf, view[:16], 0).read_remote(buf, view[8:24], 0)
    RDMAAction().write_remote(buf, view[:16]).write_remote(buf, view[8:24])  # both only read it
    with pytest.raises(ValueError, match="^write_from: "):  # named as called
        RDMAAction().write_from(buf, bytearray(65))
    with pytest.raises(ValueError, match="^write_remote: "):
        RDMAAction().write_remote(buf, bytearray(65))
    with pytest.raises(TypeError, match=r"^write_from\(src, dst\): the buffer must be"):
        RDMAAction().write_from(bytearray(1), buf)
    assert len(RDMAAction().read_remote(buf, view[:8], 0).read_remote(buf, view[8:16], 0)) == 2
    assert RDMAAction().submit().get(timeout=5) is None
    buf.drop()
