"""``monarch.rdma`` answers as Monarch 0.7's does: what RDMABuffer takes, sizes, errors, names.

Each expectation was checked on the real torchmonarch 0.7.0 (CPU, no RDMA
device, so its tcp backend): any 1-D contiguous tensor, whatever its dtype,
and 1-D memoryviews of bytes are buffers, sizes are bytes, ``read_into``
copies the whole buffer into the head of a destination at least as big,
``write_from`` copies all of a source that fits into the head of the buffer,
everything awaits to None, and bad memory or sizes are ValueErrors raised by
the call itself.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import subprocess
import sys
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import monarch.rdma
from monarch.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from tests.rdma.compat_actors import CompatPeer, as_bytes, sample

ROOT = Path(__file__).resolve().parents[2]

# Monarch 0.7.0's monarch.rdma.__all__.
MONARCH_RDMA_NAMES = {
    "RDMAAction",
    "RDMABuffer",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
}

DTYPES = [
    name
    for name in (
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "bool",
        "complex64",
        "complex128",
    )
    if hasattr(torch, name)
]


@pytest.fixture(scope="module")
def peers(procs):
    return procs.spawn("compat", CompatPeer)


@pytest.fixture
def peer(peers):
    return peers.slice(gpus=0)


# -- what RDMABuffer takes ---------------------------------------------------------------


def test_public_names_include_monarchs():
    assert MONARCH_RDMA_NAMES <= set(monarch.rdma.__all__)
    for name in MONARCH_RDMA_NAMES:
        assert getattr(monarch.rdma, name) is not None
    for warning in (RDMAReadTransferWarning, RDMAWriteTransferWarning, RDMATcpFallbackWarning):
        assert issubclass(warning, Warning)


def test_one_d_contiguous_tensors_of_every_dtype_are_buffers_sized_in_bytes(nats_url):
    for name in DTYPES:
        t = sample(name, 37)
        buf = RDMABuffer(t)
        try:
            assert buf.size() == 37 * t.element_size(), name
            dst = torch.zeros(37, dtype=t.dtype)
            assert buf.read_into(dst).get(timeout=30) is None
            assert as_bytes(dst) == as_bytes(t), name
        finally:
            buf.drop()


def test_every_dtype_round_trips_between_processes(peer, nats_url, transport):
    for i, name in enumerate(DTYPES):
        t = sample(name, 101, seed=i)
        buf = RDMABuffer(t)
        try:
            assert peer.read_bytes.call_one(buf, name, 101).get(timeout=30) == as_bytes(t), name
            peer.write_sample.call_one(buf, name, 101, i + 1).get(timeout=30)
            assert as_bytes(t) == as_bytes(sample(name, 101, seed=i + 1)), name
        finally:
            buf.drop()


def test_contiguous_views_and_slices_are_buffers_over_their_own_bytes(nats_url):
    base = torch.arange(60, dtype=torch.float32)
    grid = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    pixels = np.arange(32, dtype=np.uint8)
    cases = {
        "slice": base[10:30],
        "byte view": base.view(torch.uint8).flatten(),
        "split chunk": torch.split(base, 7)[3],
        "row of a 2-D tensor": grid[2],
        "flattened 2-D tensor": grid.view(-1),
        "requires grad": torch.ones(5, requires_grad=True),
        "memoryview of numpy bytes": memoryview(pixels),
        "memoryview of a bytearray": memoryview(bytearray(b"some bytes")),
        "read-only memoryview": memoryview(b"read only"),
    }
    for label, data in cases.items():
        expected = as_bytes(data) if isinstance(data, torch.Tensor) else bytes(data)
        buf = RDMABuffer(data)
        try:
            assert buf.size() == len(expected), label
            dst = bytearray(len(expected))
            buf.read_into(dst).get(timeout=30)
            assert bytes(dst) == expected, label
        finally:
            buf.drop()


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(4, 4),
        torch.zeros(1, 8),
        torch.zeros(2, 3, 4),
        torch.tensor(1.0),
        torch.zeros(16)[::2],
        torch.zeros(4, 3).t(),
        torch.zeros(1).expand(8),
        memoryview(bytearray(16)).cast("B", (4, 4)),
        memoryview(bytearray(16))[::2],
        memoryview(bytearray(16)).cast("I"),  # Monarch: RuntimeError "failed to acquire"
        [1, 2, 3],
    ],
    ids=[
        "2-D",
        "1xN",
        "3-D",
        "0-D",
        "strided",
        "transposed",
        "expanded",
        "2-D memoryview",
        "strided memoryview",
        "memoryview of ints",
        "list",
    ],
)
def test_what_monarch_refuses_is_a_value_error_that_says_what_to_do(nats_url, bad):
    with pytest.raises(ValueError, match=r"1-D|contiguous|plain bytes|must be a") as info:
        RDMABuffer(bad)
    assert isinstance(info.value, TypeError)  # also the usual Python error for a bad argument


def test_tensors_without_plain_memory_are_refused(nats_url):
    # Monarch registers a meta tensor's (absent) memory; here it is refused like other bad memory.
    with pytest.raises(ValueError, match="meta"):
        RDMABuffer(torch.zeros(8, device="meta"))
    with pytest.raises(ValueError, match="resolve_conj"):
        RDMABuffer(torch.zeros(4, dtype=torch.complex64).conj())


def test_size_zero_is_a_value_error(nats_url):
    for empty in (torch.empty(0), torch.zeros(5, 5)[5:, 5:].reshape(-1), memoryview(bytearray())):
        with pytest.raises(ValueError, match="size 0"):
            RDMABuffer(empty)


def test_a_buffer_keeps_its_tensors_storage_alive(nats_url):
    t = torch.full((100,), 42.0)
    storage = weakref.ref(t.untyped_storage())
    view = t.view(torch.uint8).flatten()
    buf = RDMABuffer(view)
    del t, view
    gc.collect()
    assert storage() is not None
    dst = torch.zeros(100)
    buf.read_into(dst).get(timeout=30)
    assert torch.equal(dst, torch.full((100,), 42.0))
    buf.drop()


# -- read_into / write_from: sizes, offsets, results ---------------------------------------


def test_read_into_a_bigger_destination_fills_its_head_only(peer, transport):
    buf = peer.make.call_one("head-read", [1.0, 2.0, 3.0, 4.0]).get(timeout=30)
    assert buf.size() == 16
    local = torch.full((8,), -1.0)
    assert buf.read_into(local).get(timeout=30) is None
    assert local.tolist() == [1.0, 2.0, 3.0, 4.0] + [-1.0] * 4
    mine = RDMABuffer(torch.tensor([5.0, 6.0]))
    try:
        assert peer.read_floats.call_one(mine, 4, -1.0).get(timeout=30) == [5.0, 6.0, -1.0, -1.0]
    finally:
        mine.drop()


def test_write_from_a_smaller_source_fills_the_head_of_the_buffer(peer, transport):
    buf = peer.make.call_one("head-write", [-1.0] * 8).get(timeout=30)
    assert buf.write_from(torch.tensor([5.0, 6.0, 7.0, 8.0])).get(timeout=30) is None
    assert peer.contents.call_one("head-write").get(timeout=30) == [5.0, 6.0, 7.0, 8.0] + [-1.0] * 4
    mine = torch.full((6,), -1.0)
    theirs = RDMABuffer(mine)
    try:
        assert peer.write_floats.call_one(theirs, [9.0, 9.5]).get(timeout=30) is None
        assert mine.tolist() == [9.0, 9.5] + [-1.0] * 4
    finally:
        theirs.drop()


def test_sizes_that_do_not_fit_are_value_errors_before_anything_moves(nats_url):
    t = torch.arange(25, dtype=torch.float32)
    buf = RDMABuffer(t)
    try:
        too_small = torch.full((24,), -1.0)
        with pytest.raises(ValueError, match=r"destination local memory size \(96\) must be >= "):
            buf.read_into(too_small)
        assert torch.equal(too_small, torch.full((24,), -1.0))
        with pytest.raises(ValueError, match=r"source local memory size \(104\)"):
            buf.write_from(torch.zeros(26))
        with pytest.raises(ValueError, match="contiguous"):
            buf.read_into(torch.zeros(50)[::2])
        with pytest.raises(ValueError, match="contiguous"):
            buf.write_from(torch.zeros(50)[::2])
        with pytest.raises(ValueError, match="1-D"):
            buf.read_into(torch.zeros(5, 5))
        with pytest.raises(ValueError, match=r"must be >= remote buffer size"):
            RDMAAction().read_remote(torch.zeros(24), buf)
        with pytest.raises(ValueError, match=r"source local memory size"):
            RDMAAction().write_remote(buf, torch.zeros(25 * 4 + 32, dtype=torch.uint8))
        assert torch.equal(t, torch.arange(25, dtype=torch.float32))
    finally:
        buf.drop()


def test_offsets_move_exactly_the_local_size_at_that_place(nats_url):
    t = torch.arange(10, dtype=torch.float32)
    buf = RDMABuffer(t)
    try:
        part = torch.zeros(3)
        buf.read_into(part, offset=4 * 4).get(timeout=30)
        assert part.tolist() == [4.0, 5.0, 6.0]
        buf.write_from(torch.tensor([-1.0, -2.0]), offset=8 * 4).get(timeout=30)
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -1.0, -2.0]
        head = torch.zeros(2)
        buf.read_into(head, offset=0).get(timeout=30)  # an offset: exactly len(dst) bytes
        assert head.tolist() == [0.0, 1.0]
        with pytest.raises(ValueError, match="outside"):
            buf.read_into(torch.zeros(3), offset=8 * 4)
        with pytest.raises(ValueError, match="outside"):
            buf.write_from(torch.zeros(1), offset=10 * 4)
    finally:
        buf.drop()


def test_timeouts_follow_monarchs_rules(nats_url):
    for method in (RDMABuffer.read_into, RDMABuffer.write_from, RDMAAction.submit):
        assert inspect.signature(method).parameters["timeout"].default == 60
    buf = RDMABuffer(torch.zeros(4))
    try:
        with pytest.raises(OverflowError):
            buf.read_into(torch.zeros(4), timeout=-1)
        with pytest.raises(OverflowError):
            buf.write_from(torch.zeros(4), timeout=-1)
        with pytest.raises(OverflowError):
            RDMAAction().read_remote(torch.zeros(4), buf).submit(timeout=-1)
        with pytest.raises(TypeError):
            buf.read_into(torch.zeros(4), 5)  # timeout is keyword-only, as in Monarch
    finally:
        buf.drop()


def test_every_public_operation_awaits_to_none_in_an_actor(peer):
    data = bytearray(b"rdma-public-path-a")
    buf = RDMABuffer(memoryview(data))
    try:
        assert peer.awaited_values.call_one(buf).get(timeout=60) == [None] * 6
        assert bytes(data) == b"rdma-public-path-a"[::-1]
    finally:
        buf.drop()


def test_rdma_action_takes_monarchs_argument_order(peers, peer, transport):
    a = peer.make.call_one("act-a", [65.0] * 100).get(timeout=30)
    b = peers.slice(gpus=1).make.call_one("act-b", [66.0] * 100).get(timeout=30)
    c = peer.make.call_one("act-c", [67.0] * 100).get(timeout=30)
    reader = peers.slice(gpus=1)
    got = reader.batch.call_one([a, c], [b], 100).get(timeout=60)
    assert got == [[65.0] * 100, [67.0] * 100]
    assert peers.slice(gpus=1).contents.call_one("act-b").get(timeout=30) == [7.0] * 100
    # Our order (buffer first) still works, with an offset for part of a buffer.
    part = torch.zeros(2)
    assert RDMAAction().read_remote(a, part, offset=4).submit().get(timeout=30) is None
    assert part.tolist() == [65.0, 65.0]


def test_rdma_action_takes_monarchs_keyword_names(nats_url):
    t = torch.arange(4, dtype=torch.float32)
    buf = RDMABuffer(t)
    try:
        got = torch.zeros(6)
        action = RDMAAction().read_remote(dst=got, src=buf)
        action.write_remote(dst=buf, src=torch.tensor([9.0]))
        assert action.submit(timeout=30).get(timeout=30) is None
        assert got.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]
        assert t.tolist() == [9.0, 1.0, 2.0, 3.0]
    finally:
        buf.drop()


# -- backend names -----------------------------------------------------------------------------


def test_backend_names_are_monarchs(nats_url, monkeypatch):
    monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
    expected = "ibverbs" if is_ibverbs_available() else "tcp"
    assert get_rdma_backend() == expected
    buf = RDMABuffer(bytearray(8))
    try:
        assert buf.backend == expected
        assert buf.transport in ("ibverbs", "same_host", "tcp")
        assert monarch.rdma.get_rdma_transport() in ("ibverbs", "same_host", "tcp")
        monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "tcp")
        assert get_rdma_backend() == "tcp" and buf.backend == "tcp" and buf.transport == "tcp"
        if not is_ibverbs_available():
            monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", "ibverbs")
            assert get_rdma_backend() == "none"
    finally:
        monkeypatch.delenv("MONARCH_RDMA_TRANSPORT", raising=False)
        buf.drop()


def test_without_rdma_hardware_rdma_allow_tcp_fallback_false_refuses_buffers_here_and_in_procs(
    nats_url,
):
    # Monarch's key: without ibverbs, get_rdma_backend() is "none" and RDMABuffer() raises
    # RuntimeError; procs started meanwhile inherit it; set back, buffers work again.
    if is_ibverbs_available():
        pytest.skip("this machine has RDMA hardware: the fallback is never needed")
    from monarch import configured
    from monarch.actor import this_host
    from tests.rdma.rdma_actors import BufferOwner

    refused = "RDMA is not available on this platform .*rdma_allow_tcp_fallback=True"
    with configured(rdma_allow_tcp_fallback=False) as config:
        assert config["rdma_allow_tcp_fallback"] is False
        assert get_rdma_backend() == "none"
        with pytest.raises(RuntimeError, match=refused):
            RDMABuffer(bytearray(8))
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        pm.initialized.get(timeout=60)  # started with the setting
    try:
        with pytest.raises(Exception, match=refused):
            pm.spawn("owner", BufferOwner).make.call_one("b", 8).get(timeout=60)
    finally:
        pm.stop().get(timeout=60)
    assert get_rdma_backend() == "tcp"
    RDMABuffer(bytearray(8)).drop()


def test_is_rdma_available_is_deprecated_and_means_ibverbs():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert is_rdma_available() is is_ibverbs_available()
    assert [w.category for w in caught] == [DeprecationWarning]


def test_byte_buffers_never_import_torch(nats_url):
    script = (
        "import json, sys\n"
        "from monarch.rdma import RDMABuffer\n"
        "data = bytearray(range(256))\n"
        "buf = RDMABuffer(memoryview(data))\n"
        "dst = bytearray(256)\n"
        "buf.read_into(memoryview(dst)).get(timeout=30)\n"
        "buf.drop().get(timeout=30)\n"
        "print(json.dumps([dst == data, 'torch' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
