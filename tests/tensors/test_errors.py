"""A failed remote op poisons what depends on it; the error surfaces at the fetch, naming it."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch.tensors import RemoteTensorError
from tests.tensors.tensor_helpers import (
    boom,
    index_out_of_range_on,
    rank_value,
    values,
    wrong_shape,
)


def test_error_names_the_operation_and_rank(procs):
    with procs.activate():
        table = torch.arange(8.0)
        picked = torch.index_select(table, 0, index_out_of_range_on(2))
        assert monarch.inspect(picked, hosts=0, gpus=0).tolist() == [0.0]  # rank 0 is fine
        with pytest.raises(RemoteTensorError) as info:
            monarch.inspect(picked, hosts=1, gpus=0)
    err = info.value
    assert str(err).startswith("torch.index_select failed on rank 2: IndexError")
    assert err.op == "torch.index_select" and err.rank == 2
    assert "IndexError: index out of range" in err.traceback


def test_poison_propagates_to_everything_computed_from_it(procs):
    with procs.activate():
        picked = torch.index_select(torch.arange(8.0), 0, index_out_of_range_on(3))
        derived = (picked + 1).sum() * rank_value()
        again = torch.cat([derived.reshape(1), torch.ones(1)])
        for t in (derived, again):
            with pytest.raises(RemoteTensorError, match="torch.index_select failed on rank 3"):
                monarch.inspect(t, hosts=1, gpus=1)
        # the procs keep working, poisoned or not
        assert values(torch.ones(1) * 2, procs) == [[2.0]] * 4
        assert monarch.inspect(again, hosts=0, gpus=1).tolist() == [2.0, 1.0]  # (0 + 1) * 2


def test_remote_function_error_and_wrong_propagation(procs):
    with procs.activate():
        x = torch.ones(2)
        with pytest.raises(
            RemoteTensorError, match=r"tensor_helpers.boom failed on rank 0: ValueError: boom"
        ):
            monarch.inspect(boom(x))
        with pytest.raises(RemoteTensorError, match=r"shape \[4\].*said shape \[3\]"):
            monarch.inspect(wrong_shape() + 1)


def test_poisoned_input_fails_a_collective_on_every_member_without_hanging(procs):
    with procs.activate():
        bad = torch.index_select(torch.arange(4.0), 0, index_out_of_range_on(1))
        total = bad.reduce("gpus", "sum")
        with pytest.raises(RemoteTensorError, match="failed on rank 1: IndexError"):
            monarch.inspect(total, hosts=0, gpus=1)  # its own error
        with pytest.raises(
            RemoteTensorError,
            match=r"reduce\(\['gpus'\], 'sum'\) failed on rank 0: its input on rank 1 is poisoned",
        ):
            monarch.inspect(total, hosts=0, gpus=0)
        # the other group (hosts=1) was not affected, and collectives still work afterwards
        assert monarch.inspect(total, hosts=1, gpus=0).tolist() == [0.0]
        assert values(rank_value().reduce("gpus", "sum"), procs) == [3.0, 3.0, 7.0, 7.0]


def test_poison_travels_with_to_mesh(procs, procs2):
    with procs.activate():
        bad = torch.index_select(torch.arange(4.0), 0, index_out_of_range_on(2))
        moved = bad.slice_mesh(hosts=1).to_mesh(procs2)
    with pytest.raises(RemoteTensorError, match="torch.index_select failed on rank 2"):
        monarch.inspect(moved, gpus=0)
    assert monarch.inspect(moved, gpus=1).tolist() == [0.0]
