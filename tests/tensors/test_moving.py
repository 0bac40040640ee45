"""Moving tensors between meshes, sharding local data across procs, and freeing remote memory."""

from __future__ import annotations

import gc

import pytest
import torch

import monarch
from monarch.tensors import Replicate, Shard, distribute, worker_stats
from tests.tensors.tensor_helpers import rank_value, values


def test_to_mesh_between_proc_meshes_and_back(procs, procs2):
    with procs.activate():
        r = rank_value()
        moved = r.slice_mesh(hosts=1).to_mesh(procs2)
    assert moved.mesh is procs2
    assert values(moved, procs2) == [3.0, 4.0]
    with procs2.activate():
        doubled = moved * 2
        back = monarch.to_mesh(doubled, procs.slice(hosts=0))
    assert values(back, procs.slice(hosts=0)) == [6.0, 8.0]


def test_to_mesh_within_a_mesh_and_broadcast(procs):
    with procs.activate():
        r = rank_value()
        swapped = r.slice_mesh(hosts=0).to_mesh(procs.slice(hosts=1))
        assert values(swapped, procs.slice(hosts=1)) == [1.0, 2.0]
        # dimensions the destination has in addition are broadcast
        everywhere = monarch.slice_mesh(r, hosts=1, gpus=0).to_mesh(procs)
        assert values(everywhere, procs) == [3.0] * 4
        per_host = r.slice_mesh(gpus=1).to_mesh(procs)  # gpus is broadcast
        assert values(per_host, procs) == [2.0, 2.0, 4.0, 4.0]
        same = r.to_mesh(procs)  # each proc keeps its own
        assert values(same, procs) == [1.0, 2.0, 3.0, 4.0]


def test_to_mesh_checks_dimensions(procs, procs2):
    with procs.activate():
        r = rank_value()
        with pytest.raises(ValueError, match="lacks dimensions"):
            r.to_mesh(procs2)
        with pytest.raises(ValueError, match="size"):
            r.slice_mesh(hosts=0, gpus=slice(0, 1)).to_mesh(procs2)


def test_distribute_and_full_tensor_round_trip(procs):
    full = torch.arange(48.0).reshape(4, 12)
    d = distribute(full, procs, [Shard(0), Shard(1)])
    assert d.shape == (2, 6)
    assert monarch.inspect(d, hosts=1, gpus=1).tolist() == full[2:, 6:].tolist()
    assert torch.equal(d.full_tensor(), full)
    rep = distribute(full, procs, [Replicate(), Shard(1)])
    assert rep.shape == (4, 6)
    assert monarch.inspect(rep, hosts=1, gpus=0).tolist() == full[:, :6].tolist()
    assert torch.equal(rep.full_tensor(), full)
    nested = distribute(full, procs, [Shard(1), Shard(1)])  # 12 columns -> 2 -> 2x2
    assert monarch.inspect(nested, hosts=0, gpus=1).tolist() == full[:, 3:6].tolist()
    assert torch.equal(monarch.tensors.full_tensor(nested, [Shard(1), Shard(1)]), full)
    with procs.activate():
        summed = (d * 2).reduce(["hosts", "gpus"], "sum")  # sharded data takes ops like any other
        assert torch.allclose(
            monarch.inspect(summed),
            2 * sum(full.chunk(2)[i].chunk(2, 1)[j] for i in range(2) for j in range(2)),
        )


def test_distribute_checks_placements(procs):
    with pytest.raises(ValueError, match="evenly"):
        distribute(torch.ones(3, 4), procs, [Shard(0), Replicate()])
    with pytest.raises(ValueError, match="placements"):
        distribute(torch.ones(4), procs, [Shard(0)])
    with pytest.raises(ValueError, match="distribute"):
        with procs.activate():
            torch.ones(2).full_tensor()


def test_worker_memory_is_freed_when_handles_are_dropped(procs):
    gc.collect()
    with procs.activate():
        torch.ones(1)  # make sure earlier deletions reached the workers
        before = list(worker_stats(procs).get(timeout=30).values())
        big = [torch.ones(256, 256) * i for i in range(8)]  # 256 KiB each, per proc
        during = list(worker_stats(procs).get(timeout=30).values())
        for b, d in zip(before, during):
            assert d["refs"] >= b["refs"] + 8 and d["bytes"] >= b["bytes"] + 8 * 256 * 1024
        del big
        gc.collect()
        after = list(worker_stats(procs).get(timeout=30).values())
        assert [a["bytes"] for a in after] == [b["bytes"] for b in before]
        assert [a["refs"] for a in after] == [b["refs"] for b in before]
