"""User code where the tensors live: @monarch.remote functions and endpoint.rref()."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch.tensors import RemoteTensorError
from tests.tensors.tensor_helpers import (
    Scaler,
    positive_part,
    rank_value,
    scale_and_shift,
    seeded_pair,
    values,
)


def test_remote_function_with_propagate_runs_on_every_proc(procs):
    with procs.activate():
        r = rank_value()  # propagate=lambda: torch.zeros(())
        assert r.shape == () and r.dtype == torch.float32
        assert values(r, procs) == [1.0, 2.0, 3.0, 4.0]


def test_remote_function_without_propagate_uses_a_meta_trial_run(procs, round_trips):
    calls = round_trips
    with procs.activate():
        y = scale_and_shift(torch.ones(2, 3), 2.0, b=rank_value())
        assert y.shape == (2, 3) and calls == []  # known without asking the procs
        a, b = seeded_pair(7)
        assert (a.shape, b.shape, b.dtype) == ((2,), (3,), torch.int64)
        assert calls == []
        assert values(y, procs)[3] == [[6.0] * 3] * 2
        assert monarch.inspect(b).tolist() == [0, 1, 2]


def test_remote_function_with_data_dependent_shape_takes_one_round_trip(procs, round_trips):
    calls = round_trips
    with procs.activate():
        x = torch.tensor([-1.0, 2.0, -3.0, 4.0, 5.0])
        pos = positive_part(x)  # the trial run cannot know how many are positive
        assert calls == ["describe"]
        assert pos.shape == (3,)
        assert values(pos * 2, procs) == [[4.0, 8.0, 10.0]] * 4


def test_remote_by_import_path(procs):
    relu = monarch.remote("torch.nn.functional.relu", propagate=lambda x: x)
    relu_rt = monarch.remote("torch.nn.functional.relu")  # no propagate: one round trip
    with procs.activate():
        x = torch.tensor([-1.0, 2.0])
        assert monarch.inspect(relu(x)).tolist() == [0.0, 2.0]
        assert monarch.inspect(relu_rt(x) + 1).tolist() == [1.0, 3.0]


def test_remote_needs_a_mesh(procs):
    with pytest.raises(ValueError, match="activate"):
        rank_value()


def test_rref_calls_the_actor_on_each_proc_with_local_tensors(procs):
    scalers = procs.spawn("scalers", Scaler)
    with procs.activate():
        x = torch.ones(3) * rank_value()
        s = scalers.scaled.rref(x)  # the endpoint's propagate gives the shape
        assert s.shape == (2,)
        assert values(s, procs) == [[0.0] * 2, [6.0] * 2, [18.0] * 2, [36.0] * 2]
        w = scalers.weights.rref()  # no propagate: one round trip
        assert w.shape == (2,) and w.dtype == torch.float32
        assert values(w + 1, procs) == [[2.0] * 2, [3.0] * 2, [4.0] * 2, [5.0] * 2]
        bad = scalers.fails.rref() * 2
        with pytest.raises(RemoteTensorError, match="Scaler.fails.rref failed on rank 1: Runtime"):
            monarch.inspect(bad, hosts=0, gpus=1)
    scalers.stop().get(timeout=30)


def test_rref_needs_the_actors_on_the_same_procs(procs, procs2):
    elsewhere = procs2.spawn("elsewhere", Scaler)
    with procs.activate():
        with pytest.raises(ValueError, match="not spawned on the procs"):
            elsewhere.weights.rref()
    elsewhere.stop().get(timeout=30)
