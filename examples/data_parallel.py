"""Data-parallel training of a small MLP on 4 procs with the tensor engine.

Every proc holds the same parameters and its own quarter of the data. Each
step, every proc computes the loss on its shard and backpropagates locally;
the gradients are averaged across procs with ``grad.reduce("gpus", "avg")``
and every proc applies the same SGD update, so the replicas stay identical.
With equal shards, the average of the per-shard gradients of a mean loss is
the full-batch gradient: the result matches training on all the data in one
process, which ``main()`` checks.

Run: ``python examples/data_parallel.py [--steps 50] [--lr 0.1]``
"""

from __future__ import annotations

import argparse

import torch

import monarch
from monarch.actor import ProcMesh, this_host
from monarch.tensors import Replicate, Shard, distribute


def make_data(n: int = 64, d_in: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A small regression problem (float64, so that the comparison is tight)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g, dtype=x.dtype)
    return x, y


def init_params(d_in: int = 4, hidden: int = 16, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(d_in, hidden, generator=g, dtype=torch.float64) * 0.5,
        torch.zeros(hidden, dtype=torch.float64),
        torch.randn(hidden, 1, generator=g, dtype=torch.float64) * 0.5,
        torch.zeros(1, dtype=torch.float64),
    ]


def forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    w1, b1, w2, b2 = params
    return torch.tanh(x @ w1 + b1) @ w2 + b2


def train_single(
    x: torch.Tensor, y: torch.Tensor, params: list[torch.Tensor], steps: int, lr: float
) -> list[torch.Tensor]:
    """Plain PyTorch in this process, on all the data: the reference."""
    ps = [p.clone().requires_grad_() for p in params]
    for _ in range(steps):
        loss = ((forward(ps, x) - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in ps:
                p -= lr * p.grad
                p.grad.zero_()
    return [p.detach() for p in ps]


def train_data_parallel(
    procs: ProcMesh,
    x: torch.Tensor,
    y: torch.Tensor,
    params: list[torch.Tensor],
    steps: int,
    lr: float,
    dim: str = "gpus",
) -> list[list[torch.Tensor]]:
    """The same training, data-parallel over ``procs`` (one mesh dimension, ``dim``).

    Returns every proc's final parameters (they should all be equal).
    """
    x_shards = distribute(x, procs, [Shard(0)])  # each proc its rows
    y_shards = distribute(y, procs, [Shard(0)])
    with procs.activate():
        ps = [distribute(p, procs, [Replicate()]).requires_grad_() for p in params]
        for _ in range(steps):
            loss = ((forward(ps, x_shards) - y_shards) ** 2).mean()
            loss.backward()  # on each proc, on its shard
            with torch.no_grad():
                for p in ps:
                    p -= lr * p.grad.reduce(dim, "avg")
                    p.grad.zero_()
        futures = [monarch.fetch_shard(ps, {dim: i}) for i in range(procs.size(dim))]
        return [f.get(timeout=120) for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--procs", type=int, default=4)
    args = parser.parse_args()

    x, y = make_data(n=16 * args.procs)
    params = init_params()
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    try:
        replicas = train_data_parallel(procs, x, y, params, args.steps, args.lr)
    finally:
        procs.stop().get()
    reference = train_single(x, y, params, args.steps, args.lr)
    worst = max(
        (a - b).abs().max().item() for replica in replicas for a, b in zip(replica, reference)
    )
    loss = ((forward(replicas[0], x) - y) ** 2).mean().item()
    print(f"{args.procs} procs, {args.steps} steps: final loss {loss:.5f}")
    print(f"largest difference from single-process training: {worst:.3g}")
    assert worst < 1e-9, "data-parallel training diverged from the single-process reference"


if __name__ == "__main__":
    main()
