"""Tensor.reduce over mesh dimensions: every reduction, several dims, scatter, in place, mesh=."""

from __future__ import annotations

import pytest
import torch

import monarch
from tests.tensors.tensor_helpers import rank_value, values

# procs is {'hosts': 2, 'gpus': 2}; rank_value() is rank + 1: 1, 2 on hosts=0 and 3, 4 on hosts=1


@pytest.mark.parametrize(
    "reduction, expected",
    [
        ("sum", [3.0, 3.0, 7.0, 7.0]),
        ("avg", [1.5, 1.5, 3.5, 3.5]),
        ("max", [2.0, 2.0, 4.0, 4.0]),
        ("min", [1.0, 1.0, 3.0, 3.0]),
        ("product", [2.0, 2.0, 12.0, 12.0]),
        ("stack", [[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]]),
    ],
)
def test_every_reduction_over_one_dimension(procs, reduction, expected):
    with procs.activate():
        r = rank_value()
        out = r.reduce("gpus", reduction)
        assert out.shape == ((2,) if reduction == "stack" else ())
        assert values(out, procs) == expected
        assert values(r, procs) == [1.0, 2.0, 3.0, 4.0]  # the input is untouched


def test_several_dimensions_and_their_order(procs):
    with procs.activate():
        r = rank_value()
        assert values(r.reduce("hosts", "sum"), procs) == [4.0, 6.0, 4.0, 6.0]
        assert values(r.reduce(["hosts", "gpus"], "sum"), procs) == [10.0] * 4
        assert values(monarch.reduce(r, (), "max"), procs) == [4.0] * 4  # () means all dims
        # stack order follows the dims as given: row-major over (gpus, hosts) here
        stacked = r.reduce(["gpus", "hosts"], "stack")
        assert values(stacked, procs) == [[1.0, 3.0, 2.0, 4.0]] * 4
        assert values(r.reduce(["hosts", "gpus"], "stack"), procs) == [[1.0, 2.0, 3.0, 4.0]] * 4


def test_scatter_is_reduce_scatter_and_stack_scatter_is_all_to_all(procs):
    with procs.activate():
        r = rank_value()
        parts = torch.stack([r, r * 10])  # shape [2]: one part per proc along gpus
        rs = parts.reduce("gpus", "sum", scatter=True)
        assert rs.shape == ()
        assert values(rs, procs) == [3.0, 30.0, 7.0, 70.0]
        a2a = parts.reduce("gpus", "stack", scatter=True)
        assert a2a.shape == (2,)
        assert values(a2a, procs) == [[1.0, 2.0], [10.0, 20.0], [3.0, 4.0], [30.0, 40.0]]
        with pytest.raises(TypeError, match="leading dimension"):
            r.reduce("gpus", "sum", scatter=True)


def test_reduce_in_place_and_onto_a_slice(procs):
    with procs.activate():
        x = rank_value().long() * torch.ones(2, dtype=torch.int64)
        same = x.reduce_("gpus", "avg")
        assert same is x
        assert values(x, procs) == [[1, 1], [1, 1], [3, 3], [3, 3]]  # integer avg floors
        first = rank_value().reduce("gpus", "sum", mesh=procs.slice(gpus=0))
        assert first.mesh.extent == {"hosts": 2}
        assert values(first, first.mesh) == [3.0, 7.0]


def test_reduce_on_a_sliced_mesh_uses_a_group_of_its_procs(procs):
    part = procs.slice(hosts=1)
    with part.activate():
        r = rank_value()
        assert values(r.reduce("gpus", "sum"), part) == [7.0, 7.0]
        assert values(r.reduce("gpus", "stack"), part) == [[3.0, 4.0]] * 2


def test_bad_reduce_arguments_raise_at_the_caller(procs):
    with procs.activate():
        r = rank_value()
        with pytest.raises(KeyError):
            r.reduce("racks")
        with pytest.raises(ValueError, match="twice"):
            r.reduce(["gpus", "gpus"])
        with pytest.raises(ValueError, match="not supported"):
            r.reduce("gpus", "median")


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs CUDA and 2 GPUs (NCCL does not put two ranks on one GPU)",
)
def test_cuda_tensors_reduce_over_nccl(procs2):
    # procs2 is {'gpus': 2}: the launcher gives each proc its own GPU as cuda:0
    with procs2.activate():
        t = torch.ones(4, device="cuda") * rank_value().cuda()
        assert t.device.type == "cuda"
        total = t.reduce("gpus", "sum")
        assert total.device.type == "cuda"
        assert values(total, procs2) == [[3.0] * 4] * 2
        assert values(t.reduce("gpus", "stack"), procs2) == [[[1.0] * 4, [2.0] * 4]] * 2


def test_procs_that_cannot_run_nccl_join_the_world_with_gloo(nats_url, monkeypatch):
    # Rank 0 names NCCL for CUDA tensors; a proc without a GPU (here: every proc when
    # torch has no CUDA, or the one at gpus=1 on a one-GPU machine) cannot make an NCCL
    # group, so it joins with gloo alone instead of leaving its peers waiting.
    from monarch.actor import this_host

    monkeypatch.setenv("MONARCH_TENSOR_BACKEND", "cpu:gloo,cuda:nccl")
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="nonccl")
    try:
        with pm.activate():
            r = rank_value()
            assert values(r.reduce("gpus", "sum"), pm) == [3.0, 3.0]
            assert values(r.reduce("gpus", "stack"), pm) == [[1.0, 2.0]] * 2
    finally:
        pm.stop().get(timeout=60)
