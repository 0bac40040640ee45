"""The pool of pre-faulted buffers: reuse only what nothing refers to, within its limit."""

from __future__ import annotations

import pytest
import torch

from monarch.actor import Actor, endpoint, this_host
from monarch.broker.bodies import buffers
from monarch.broker.bodies.buffers import MIN_POOLED, BufferPool

MiB = 1 << 20


def test_a_released_buffer_is_handed_out_again():
    pool = BufferPool(64 * MiB)
    first = pool.take(4 * MiB)
    first[:4] = b"abcd"
    del first
    again = pool.take(3 * MiB)  # within a factor of two: the same mapping
    assert pool.reused == 1 and len(again) == 3 * MiB and bytes(again[:4]) == b"abcd"


def test_a_buffer_still_in_use_is_never_handed_out():
    pool = BufferPool(64 * MiB)
    body = pool.take(4 * MiB)
    tensor = torch.frombuffer(body, dtype=torch.uint8)  # the tensor keeps the buffer
    del body
    other = pool.take(4 * MiB)
    assert pool.reused == 0
    other[:] = b"\x01" * len(other)
    assert int(tensor.sum()) == 0  # untouched by the new user
    del other, tensor
    pool.take(4 * MiB)
    assert pool.reused == 1


def test_the_pool_keeps_no_more_than_its_limit_and_not_small_or_far_sizes():
    pool = BufferPool(8 * MiB)
    held = [pool.take(4 * MiB) for _ in range(3)]  # the third is over the limit: not kept
    assert len(pool._maps) == 2
    del held
    assert pool.idle_bytes() == 8 * MiB
    pool.take(MIN_POOLED - 1)
    pool.take(MiB)  # a quarter of the pooled size: a fresh mapping, not a pooled 4 MiB one
    assert pool.reused == 0
    assert BufferPool(0).take(4 * MiB).nbytes == 4 * MiB  # limit 0: no pooling at all


def test_limit_setting_is_checked(monkeypatch):
    monkeypatch.setenv("MONARCH_BUFFER_POOL_MB", "lots")
    with pytest.raises(ValueError, match="MONARCH_BUFFER_POOL_MB"):
        BufferPool()
    monkeypatch.setenv("MONARCH_BUFFER_POOL_MB", "16")
    assert BufferPool()._limit == 16 * MiB


class Summer(Actor):
    @endpoint
    def total(self, t) -> float:
        return float(t.sum())

    @endpoint
    def reused(self) -> int:
        return buffers.pool().reused


def test_big_arguments_reuse_buffers_on_both_sides_and_arrive_intact(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        summer = procs.spawn("summer", Summer)
        before = buffers.pool().reused
        for i in range(1, 5):
            x = torch.full((4 * MiB,), float(i))  # 16 MiB: out of band
            assert summer.total.call_one(x).get(timeout=60) == 4 * MiB * i
        assert buffers.pool().reused - before >= 2  # the sender's bodies
        assert summer.reused.call_one().get(timeout=30) >= 2  # the receiver's fetches
    finally:
        procs.stop().get(timeout=30)


def test_copy_into_copies_big_and_small_parts_and_refuses_a_read_only_target():
    big = bytes(range(256)) * (8 * 4096)  # 8 MiB: copied without the GIL
    small = b"head"
    out = buffers.new_mapping(len(small) + len(big))
    view = memoryview(out)
    buffers.copy_into(view, 0, memoryview(small))
    buffers.copy_into(view, len(small), memoryview(big))
    assert view[:4] == small and view[4:] == big
    with pytest.raises(ValueError, match="writable"):
        buffers.copy_into(memoryview(bytes(len(big))), 0, memoryview(big))
    with pytest.raises(ValueError, match="room"):
        buffers.copy_into(view, 8, memoryview(big))
    view.release()
