"""Remote functions and actors for the tensor engine tests (importable by procs)."""

from __future__ import annotations

import torch

import monarch
from monarch.actor import Actor, current_rank, endpoint


@monarch.remote(propagate=lambda: torch.zeros(()))
def rank_value() -> torch.Tensor:
    """This proc's rank in its proc mesh, plus one (so that products are not zero)."""
    return torch.tensor(float(current_rank().rank + 1))


@monarch.remote(propagate=lambda rank: torch.zeros(1, dtype=torch.long))
def index_out_of_range_on(rank: int) -> torch.Tensor:
    """A valid index (0) everywhere except on ``rank``."""
    return torch.tensor([100 if current_rank().rank == rank else 0])


@monarch.remote(propagate=lambda x: x)
def boom(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom")


@monarch.remote(propagate=lambda: torch.zeros(3))
def wrong_shape() -> torch.Tensor:
    return torch.zeros(4)


@monarch.remote
def scale_and_shift(x: torch.Tensor, a: float, b: float = 0.0) -> torch.Tensor:
    """No propagate: the client learns the result's shape by a trial run on meta tensors."""
    return x * a + b


@monarch.remote
def positive_part(x: torch.Tensor) -> torch.Tensor:
    """Data-dependent shape: the trial run fails, so the client asks a proc (one round trip)."""
    return x[x > 0]


@monarch.remote
def seeded_pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2, generator=g), torch.arange(3)


@monarch.remote(propagate=lambda path, x: None)
def write_file(path: str, x: torch.Tensor) -> None:
    """A side effect on the proc (the tests and procs share a machine)."""
    with open(path, "w") as f:
        f.write(str(x.tolist()))


def values(t, mesh) -> list:
    """Every proc's value of ``t``, in rank order of ``mesh`` (as Python lists or numbers)."""
    extent = mesh._view.extent
    futures = [
        monarch.fetch_shard(t, dict(zip(extent.labels, extent.coords(i))))
        for i in range(extent.nelements)
    ]
    return [f.get(timeout=60).tolist() for f in futures]


class Scaler(Actor):
    """Holds a per-proc weight; its endpoints compute on tensors the tensor engine passes in."""

    def __init__(self) -> None:
        self.w = torch.full((2,), float(current_rank().rank))

    @endpoint(propagate=lambda x: torch.zeros(2))
    def scaled(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x.sum()

    @endpoint
    def weights(self) -> torch.Tensor:
        return self.w + 1

    @endpoint(propagate=lambda: torch.zeros(1))
    def fails(self) -> torch.Tensor:
        raise RuntimeError("nope")
