"""examples/data_parallel.py: data-parallel training equals single-process training."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data_parallel.py"


def _example():
    spec = importlib.util.spec_from_file_location("data_parallel_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_parallel_matches_single_process_training(procs):
    ex = _example()
    x, y = ex.make_data(n=64)
    params = ex.init_params()
    flat = procs.flatten("gpus")  # the 2x2 mesh as 4 data-parallel ranks
    replicas = ex.train_data_parallel(flat, x, y, params, steps=20, lr=0.1)
    reference = ex.train_single(x, y, params, steps=20, lr=0.1)
    assert len(replicas) == 4
    for replica in replicas:
        for got, want in zip(replica, reference):
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)
    # training moved the weights, so the comparison is not vacuous
    assert not torch.allclose(reference[0], params[0])
