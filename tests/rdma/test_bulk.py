"""Big messages: arguments and replies over the broker's max_payload travel out of band."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from monarch.broker.bodies.codec import dumps, loads
from monarch.core.process_runtime import runtime
from monarch.rdma import BufferDroppedError, bulk
from monarch.rdma.owner import current_owner, local_owner
from tests.rdma.rdma_actors import AsyncSummary, checksum, pattern


def _bulk_entries() -> int:
    owner = current_owner()
    return (
        0 if owner is None else sum(e.readers is not None for e in owner.registry._entries.values())
    )


def test_reference_prefix_cannot_start_any_other_body(nats_url):
    body = bulk.offload(b"x" * (bulk.threshold() + 1), readers=1, ttl=60)
    assert body[:4] == bulk.PREFIX and len(body) < 300
    for value in ([1, 2], (1, 2), {"a": 1}, b"x" * 10, [bytearray(3), 1], torch.zeros(3)):
        assert not bulk.is_reference(dumps(value))
    assert bulk.fetch(body) == b"x" * (bulk.threshold() + 1)
    small = dumps([1, 2, 3])
    assert bulk.offload(small, readers=1, ttl=60) is small
    assert bulk.fetch(small) is small


def test_references_stay_msgpack_when_the_wire_is_json(nats_url, monkeypatch):
    from monarch.settings import settings

    monkeypatch.setenv("MONARCH_WIRE", "json")
    settings.cache_clear()
    try:
        body = dumps((b"q" * (bulk.threshold() + 1), {"k": 1}))
        ref = bulk.offload(body, readers=1, ttl=60)
        assert ref[:4] == bulk.PREFIX
        assert loads(bulk.fetch(ref)) == (b"q" * (bulk.threshold() + 1), {"k": 1})
    finally:
        monkeypatch.undo()
        settings.cache_clear()


def test_released_after_its_readers_or_its_time_to_live(nats_url):
    data = b"y" * (bulk.threshold() + 10)
    body = bulk.offload(data, readers=2, ttl=60)
    assert bulk.fetch(body) == data and bulk.fetch(body) == data
    with pytest.raises(BufferDroppedError):
        bulk.fetch(body)
    body = bulk.offload(data, readers=None, ttl=0.01)
    local_owner().registry.sweep(time.monotonic() + 1)  # what the server's loop does each second
    with pytest.raises(BufferDroppedError):
        bulk.fetch(body)


def test_fetch_async_runs_off_the_loop(nats_url):
    data = b"z" * (bulk.threshold() + 10)
    body = bulk.offload(data, readers=1, ttl=60)

    async def main():
        return await bulk.fetch_async(body), await bulk.fetch_async(b"plain")

    assert asyncio.run(main()) == (data, b"plain")


def test_tensor_argument_over_max_payload(procs, owners, transport):
    n = 3 * runtime().max_payload + 123
    t = pattern(n, 9)
    picks = [0, 1, n // 2, n - 1]
    vm = owners.summary.call(t, picks).get(timeout=60)  # one body, fetched by both
    for numel, total, sampled in vm.values():
        assert numel == n and total == checksum(t) and sampled == [int(t[i]) for i in picks]
    asum = procs.slice(gpus=1).spawn("asum", AsyncSummary)
    numel, total = asum.asummary.call_one(t).get(timeout=60)  # an async endpoint
    assert (numel, total) == (n, checksum(t))
    assert _bulk_entries() == 0  # every reader acknowledged: nothing held any more


def test_reply_over_max_payload(owners, transport):
    n = 2 * runtime().max_payload + 7
    got = owners.slice(gpus=0).big.call_one(n, 4).get(timeout=60)
    assert torch.equal(got, pattern(n, 4))
    vm = owners.big.call(1000, 1).get(timeout=60)  # small replies are untouched
    assert all(torch.equal(v, pattern(1000, 1)) for v in vm.values())


def test_threshold_is_configurable(owners, monkeypatch):
    monkeypatch.setenv("MONARCH_BULK_THRESHOLD", "1000")
    t = pattern(5000)
    assert len(bulk.offload(dumps(t), readers=1, ttl=60)) < 300
    numel, total, _ = owners.slice(gpus=0).summary.call_one(t, []).get(timeout=30)
    assert (numel, total) == (5000, checksum(t))


@pytest.mark.timeout(240)
@pytest.mark.alone  # a 1 GiB tensor, copied: the machine's memory to itself
def test_one_gib_tensor_argument(owners):
    n = 1 << 30
    try:
        t = torch.empty(n, dtype=torch.uint8)
    except RuntimeError:
        pytest.skip("not enough memory for a 1 GiB tensor")
    block = pattern(1 << 26)
    for i in range(n // block.numel()):  # 16 blocks, each the pattern plus its index
        torch.add(block, i, out=t[i * block.numel() : (i + 1) * block.numel()])
    picks = [0, 1, 12345, (1 << 26) + 3, n // 2 + 17, n - 1]
    expected = checksum(t)
    start = time.monotonic()
    numel, total, sampled = owners.slice(gpus=0).summary.call_one(t, picks).get(timeout=180)
    assert numel == n
    assert sampled == [int(t[i]) for i in picks]
    assert total == expected
    print(f"1 GiB argument: {time.monotonic() - start:.2f} s")


def test_big_port_values_and_init_arguments_travel_out_of_band(nats_url):
    """Everything over max_payload goes out of band: port messages and spawn arguments too."""
    from monarch.actor import Channel, this_host
    from tests.rdma.rdma_actors import BigInit

    big = b"p" * (3 << 20)
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = pm.spawn("bigin", BigInit, big)  # 3 MiB __init__ argument
        assert list(mesh.init_len.call().get(timeout=60).values()) == [len(big)] * 2
        port, receiver = Channel.open()
        mesh.send_big.broadcast(port, 2 << 20)
        mesh.send_small.broadcast(port)
        got = sorted(len(receiver.recv().get(timeout=60)) for _ in range(4))
        assert got == [1, 1, 2 << 20, 2 << 20]
    finally:
        pm.stop().get(timeout=60)
