"""The tensor engine, seeding and timing with CUDA tensors on the procs (needs a GPU).

Two procs laid out as ``{'hosts': 2, 'gpus': 1}``: both are at ``gpus`` 0, so
the launcher gives both ``CUDA_VISIBLE_DEVICES=0`` and they share one GPU,
which makes these tests run on a one-GPU machine. NCCL refuses two ranks on
one GPU, so a CUDA reduce between them must fail clearly at the caller; the
two-GPU NCCL reduce itself is ``test_collectives.test_cuda_tensors_reduce_over_nccl``.
"""

from __future__ import annotations

import os

import pytest
import torch

import monarch
from monarch.builtins.random import (
    get_rng_state_all_cuda_remote,
    manual_seed_cuda_remote,
)
from monarch.tensors import RemoteTensorError
from monarch.timer import ExecutionTimer
from tests.helpers import proc_mesh_fixture
from tests.tensors.tensor_helpers import rank_value, values

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

gpu_procs = proc_mesh_fixture(
    {"hosts": 2, "gpus": 1}, name="cudaprocs", scope="module", wait_ready=True
)


@monarch.remote(propagate=lambda: torch.zeros((), dtype=torch.long))
def visible_gpus() -> torch.Tensor:
    return torch.tensor(torch.cuda.device_count())


@monarch.remote(propagate=lambda x: torch.zeros((), dtype=torch.long))
def device_index(x: torch.Tensor) -> torch.Tensor:
    """Where ``x`` really lives on the proc (-1 for the CPU)."""
    return torch.tensor(x.device.index if x.is_cuda else -1)


def test_cuda_tensors_are_made_computed_and_fetched(gpu_procs):
    with gpu_procs.activate():
        # The launcher gives each proc its gpus coordinate's GPU, unless the client's
        # own CUDA_VISIBLE_DEVICES already says which GPUs the job has.
        seen = 1 if "CUDA_VISIBLE_DEVICES" not in os.environ else torch.cuda.device_count()
        assert values(visible_gpus(), gpu_procs) == [seen, seen]
        x = torch.ones(4, device="cuda") * rank_value().cuda()
        assert x.device.type == "cuda"
        y = (x @ torch.eye(4, device="cuda")) + 1
        assert values(device_index(y), gpu_procs) == [0, 0]
        assert values(y, gpu_procs) == [[2.0] * 4, [3.0] * 4]
        back = y.cpu()
        assert back.device.type == "cpu"
        assert values(device_index(back), gpu_procs) == [-1, -1]
        fetched = monarch.fetch_shard(y, {"hosts": 1, "gpus": 0}).get(timeout=60)
        assert fetched.device.type == "cpu" and fetched.tolist() == [3.0] * 4


def test_cuda_autograd_on_the_procs(gpu_procs):
    with gpu_procs.activate():
        w = torch.full((3,), 2.0, device="cuda", requires_grad=True)
        loss = (w * rank_value().cuda()).sum()
        loss.backward()
        assert values(w.grad, gpu_procs) == [[1.0] * 3, [2.0] * 3]


def test_cuda_seeding_draws_the_same_numbers_on_every_proc(gpu_procs):
    with gpu_procs.activate():
        manual_seed_cuda_remote(7)
        a = torch.rand(5, device="cuda")
        states = get_rng_state_all_cuda_remote()
        manual_seed_cuda_remote(7)
        b = torch.rand(5, device="cuda")
        first, second = values(a, gpu_procs), values(b, gpu_procs)
        assert first[0] == first[1] == second[0] == second[1]
        shards = [
            monarch.fetch_shard(states, {"hosts": h, "gpus": 0}).get(timeout=60) for h in (0, 1)
        ]
        assert len(shards[0]) == 1 and torch.equal(shards[0][0], shards[1][0])


def test_cuda_reduce_between_ranks_sharing_a_gpu_fails_at_the_caller(gpu_procs):
    with gpu_procs.activate():
        t = torch.ones(4, device="cuda") * rank_value().cuda()
        total = t.reduce("hosts", "sum")
        with pytest.raises(RemoteTensorError, match=r"reduce\(\['hosts'\], 'sum'\) failed"):
            monarch.fetch_shard(total, {"hosts": 0, "gpus": 0}).get(timeout=120)
        # the procs live on and still compute on the GPU
        assert values(t + 1, gpu_procs) == [[2.0] * 4, [3.0] * 4]


def test_execution_timer_times_gpu_work_with_cuda_events():
    ExecutionTimer.reset()
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    for _ in range(3):
        with ExecutionTimer.time("matmul"):
            for _ in range(20):
                a = torch.tanh(a @ a)
    stats = ExecutionTimer.summary()["matmul"]
    assert stats["count"] == 3 and stats["min_ms"] > 0.0
    assert ExecutionTimer.get_latest_measurement("matmul") > 0.0
    ExecutionTimer.reset()
