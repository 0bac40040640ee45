"""A plain torchrun-style data-parallel training script: nothing in it knows about Monarch.

Run it either way, unchanged:

    torchrun --nproc-per-node 4 examples/spmd_ddp.py --out /tmp/params-{rank}.pt
    python examples/spmd_launch.py            # the same, on 4 procs of a Monarch mesh

or alone (``python examples/spmd_ddp.py``) for the single-process reference:
with no ``RANK`` in the environment it trains one process on every sample.

Each rank reads its own shard of one fixed data set (``DistributedSampler``
without shuffling, so step ``s`` of all ranks together covers the same
``--global-batch`` samples a single process sees at step ``s``);
``DistributedDataParallel`` averages the gradients over ``gloo``. So the 4-rank
run ends with the single-process run's parameters, up to float rounding.
``--out`` (``{rank}`` is replaced) saves each rank's final parameters.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(samples: int, seed: int) -> TensorDataset:
    """A noisy linear regression problem, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # every rank starts from the same weights (DDP checks it)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="save final parameters here ({rank} is replaced)")
    args = parser.parse_args()

    distributed = "RANK" in os.environ  # set by torchrun, and by monarch.spmd.SPMDActor
    if distributed:
        dist.init_process_group("gloo")  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by {world} ranks")

    data = make_dataset(args.global_batch * args.steps, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=sampler)
    model = make_model(args.seed)
    if distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP: gradients averaged over all ranks here
        opt.step()
        print(f"rank {rank}/{world} step {step} local loss {loss.item():.4f}", flush=True)

    if args.out:
        params = model.module if distributed else model
        torch.save(params.state_dict(), args.out.format(rank=rank))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
