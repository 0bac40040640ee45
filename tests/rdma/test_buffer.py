"""RDMABuffer's API in one process: what it accepts, ranges, drop, handles as values."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import pytest
import torch

from monarch.broker.bodies.codec import dumps, loads
from monarch.rdma import (
    BufferDroppedError,
    RDMABuffer,
    ReadOnlyBufferError,
    get_rdma_backend,
    get_rdma_transport,
)
from monarch.rdma.owner import current_owner
from tests.rdma.rdma_actors import pattern


@pytest.fixture
def local(nats_url):
    t = pattern(1 << 16)
    buf = RDMABuffer(t)
    yield t, buf
    buf.drop()


def test_accepts_uint8_tensors_memoryviews_bytearrays_and_bytes(nats_url):
    for data in (pattern(10), bytearray(10), memoryview(bytearray(10)), b"0123456789"):
        buf = RDMABuffer(data)
        assert buf.size() == 10
        buf.drop()
    sliced = pattern(100)[10:30]  # a contiguous view with a storage offset
    buf = RDMABuffer(sliced)
    dst = bytearray(20)
    buf.read_into(dst).get(timeout=30)
    assert bytes(dst) == bytes(sliced.numpy())
    buf.drop()


def test_size_zero_is_a_value_error(nats_url):
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(bytearray())


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(4, 4, dtype=torch.uint8),  # not 1-D
        torch.zeros(16, dtype=torch.uint8)[::2],  # not contiguous
        memoryview(bytearray(16)).cast("I"),  # not bytes
    ],
    ids=["2d", "strided", "memoryview-of-ints"],
)
def test_wrong_layouts_are_type_errors_that_say_what_to_do(nats_url, bad):
    with pytest.raises(TypeError, match=r"t\.view\(torch\.uint8\)\.flatten\(\)"):
        RDMABuffer(bad)


def test_other_types_are_type_errors(nats_url):
    with pytest.raises(TypeError, match="torch.Tensor, memoryview, bytearray or bytes"):
        RDMABuffer([1, 2, 3])


def test_size_owner_and_backend(local):
    t, buf = local
    assert buf.size() == t.numel()
    assert buf.owner == current_owner().rt.proc_uid
    assert buf.transport == "same_host" and get_rdma_transport() == "same_host"
    assert buf.backend == "tcp" and get_rdma_backend() == "tcp"  # Monarch's name for a fallback


def test_read_and_write_with_offsets(local):
    t, buf = local
    dst = torch.zeros(100, dtype=torch.uint8)
    buf.read_into(dst, offset=1000).get(timeout=30)
    assert torch.equal(dst, t[1000:1100])
    buf.write_from(b"\xff" * 10, offset=5).get(timeout=30)
    assert t[5:15].tolist() == [255] * 10 and t[4] != 255 and t[15] != 255


def test_await_works(local):
    t, buf = local

    async def main():
        dst = bytearray(16)
        await buf.read_into(dst, offset=16)
        return bytes(dst)

    assert asyncio.run(main()) == bytes(t[16:32].numpy())


@pytest.mark.parametrize(
    "offset,n", [(-1, 4), (0, (1 << 16) + 1), ((1 << 16) - 3, 4), (1 << 17, 1)]
)
def test_out_of_range_is_a_value_error_before_anything_moves(local, offset, n):
    t, buf = local
    before = t.clone()
    with pytest.raises(ValueError, match="outside"):
        buf.read_into(bytearray(n), offset=offset)
    with pytest.raises(ValueError, match="outside"):
        buf.write_from(bytes(n), offset=offset)
    assert torch.equal(t, before)


def test_offset_must_be_an_int(local):
    with pytest.raises(TypeError, match="offset"):
        local[1].read_into(bytearray(1), offset=1.0)


def test_read_into_read_only_memory_is_a_type_error(local):
    with pytest.raises(TypeError, match="read-only"):
        local[1].read_into(b"1234")


def test_a_buffer_over_bytes_is_read_only(nats_url):
    buf = RDMABuffer(b"immutable")
    with pytest.raises(ReadOnlyBufferError):
        buf.write_from(b"x")
    dst = bytearray(9)
    buf.read_into(dst).get(timeout=30)
    assert dst == b"immutable"
    buf.drop()


@pytest.mark.parametrize("transport", ["same_host", "tcp"])
def test_dropped_buffer_fails_every_later_transfer(nats_url, monkeypatch, transport):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    buf = RDMABuffer(bytearray(b"abcdef"))
    copy = pickle.loads(pickle.dumps(buf))
    buf.drop().get(timeout=30)
    buf.drop().get(timeout=30)  # twice is harmless
    for b in (buf, copy):
        with pytest.raises(BufferDroppedError, match="dropped"):
            b.read_into(bytearray(6)).get(timeout=30)
        with pytest.raises(BufferDroppedError):
            b.write_from(b"zz").get(timeout=30)


def test_handles_round_trip_through_codec_and_pickle(local):
    _, buf = local
    for again in (loads(dumps({"b": buf}))["b"], pickle.loads(pickle.dumps(buf))):
        assert isinstance(again, RDMABuffer)
        assert again == buf and again.size() == buf.size() and again.owner == buf.owner
    body = dumps(buf)
    assert len(body) < 300  # a handle, not the bytes


@pytest.mark.parametrize("transport", ["same_host", "tcp"])
def test_access_key_is_required(local, monkeypatch, transport):
    monkeypatch.setenv("MONARCH_RDMA_TRANSPORT", transport)
    _, buf = local
    forged = RDMABuffer._from_handle(dataclasses.replace(buf.handle, key=b"\0" * 16))
    with pytest.raises(BufferDroppedError):
        forged.read_into(bytearray(4), offset=0).get(timeout=30)
