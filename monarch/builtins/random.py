"""Seeding and RNG state of the procs of a mesh, as remote functions (Monarch's ``monarch.builtins.random``).

They run on every proc of the active mesh, in order with the tensor ops
around them, so ``set_manual_seed_remote(0); torch.rand(3)`` draws the same
numbers on every proc (and again after the same seed). Functions without a
result pass ``propagate`` returning None, so calling them costs no round trip;
those returning RNG state ask the first proc for its shape once.
"""

from __future__ import annotations

import torch

from monarch.tensors.remote import remote


def _nothing(*args: object, **kwargs: object) -> None:
    return None


@remote(propagate=_nothing)
def set_manual_seed_remote(seed: int, process_idx: int = 0) -> None:
    """``torch.manual_seed(seed ^ process_idx)`` on every proc (pass a per-proc index to differ)."""
    torch.manual_seed(seed ^ process_idx)


@remote(propagate="inspect")
def get_rng_state_remote() -> torch.Tensor:
    """Each proc's ``torch.get_rng_state()`` (a uint8 tensor per proc)."""
    return torch.get_rng_state()


@remote(propagate=_nothing)
def set_rng_state_remote(new_state: torch.Tensor) -> None:
    """``torch.set_rng_state`` on every proc, each with its own shard of ``new_state``."""
    torch.set_rng_state(new_state)


@remote(propagate=_nothing)
def seed_remote() -> None:
    """``torch.seed()`` on every proc: a fresh non-deterministic seed each."""
    torch.seed()


@remote(propagate=_nothing)
def random_seed_remote() -> None:
    """``torch.random.seed()`` on every proc."""
    torch.random.seed()


@remote(propagate=_nothing)
def manual_seed_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed(seed)`` on every proc (its current CUDA device)."""
    torch.cuda.manual_seed(seed)


@remote(propagate=_nothing)
def manual_seed_all_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed_all(seed)`` on every proc (all its CUDA devices)."""
    torch.cuda.manual_seed_all(seed)


@remote(propagate="inspect")
def get_rng_state_all_cuda_remote() -> list[torch.Tensor]:
    """Each proc's ``torch.cuda.get_rng_state_all()``."""
    return torch.cuda.get_rng_state_all()


@remote(propagate=_nothing)
def set_rng_state_all_cuda_remote(states: list[torch.Tensor]) -> None:
    """``torch.cuda.set_rng_state_all`` on every proc."""
    torch.cuda.set_rng_state_all(states)
