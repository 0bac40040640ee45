"""Sharding a local tensor across a proc mesh, and gathering it back.

In the spirit of ``torch.distributed.tensor`` (DTensor): one placement per
mesh dimension, :class:`Shard` ``(dim)`` splits the tensor's dimension
``dim`` evenly along that mesh dimension, :class:`Replicate` gives every proc
along it the same data. Several mesh dimensions may shard the same tensor
dimension: the split is nested, in mesh-dimension order, as in DTensor.

Every proc must hold a tensor of the same shape (the handle has one shape),
so sharded dimensions must divide evenly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from monarch.actors.meshes.mesh_ops import view_of
from monarch.tensors.controller import controller_for, single
from monarch.tensors.fetch import fetch_shard
from monarch.tensors.mode import no_mesh
from monarch.tensors.tensor import Tensor, meta_empty

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh


@dataclass(frozen=True)
class Shard:
    """Split tensor dimension ``dim`` evenly across a mesh dimension."""

    dim: int


@dataclass(frozen=True)
class Replicate:
    """Every proc along a mesh dimension holds the whole (remaining) tensor."""


Placement = Shard | Replicate


def _check(shape: Sequence[int], mesh: ProcMesh, placements: Sequence[Placement]) -> list[int]:
    extent = view_of(mesh).extent
    if len(placements) != len(extent):
        raise ValueError(
            f"{len(placements)} placements for a mesh of {len(extent)} dimensions {extent!r}"
        )
    shape = list(shape)
    for label, size, p in zip(extent.labels, extent.sizes, placements):
        if isinstance(p, Shard):
            d = p.dim if p.dim >= 0 else p.dim + len(shape)
            if not 0 <= d < len(shape):
                raise IndexError(f"Shard({p.dim}) on a tensor of {len(shape)} dimensions")
            if shape[d] % size:
                raise ValueError(
                    f"dimension {d} of size {shape[d]} does not split evenly across {label!r} "
                    f"({size} procs)"
                )
            shape[d] //= size
        elif not isinstance(p, Replicate):
            raise TypeError(f"placements are Shard(dim) or Replicate(), not {p!r}")
    return shape


def _piece(
    t: torch.Tensor, coords: Sequence[int], sizes: Sequence[int], placements
) -> torch.Tensor:
    for c, n, p in zip(coords, sizes, placements):
        if isinstance(p, Shard):
            t = t.chunk(n, dim=p.dim)[c]
    return t.contiguous()


def distribute(tensor: torch.Tensor, mesh: ProcMesh, placements: Sequence[Placement]) -> Tensor:
    """Send each proc of ``mesh`` its piece of the local ``tensor``; a handle to the pieces.

    One point message per proc, queued in the op stream (ordered with ops).
    The handle remembers ``placements`` for :meth:`Tensor.full_tensor`.
    """
    if isinstance(tensor, Tensor) or not isinstance(tensor, torch.Tensor):
        raise TypeError("distribute() takes a local torch.Tensor")
    placements = tuple(placements)
    local_shape = _check(tensor.shape, mesh, placements)
    ctl = controller_for(mesh)
    ctl.check_alive()
    view = view_of(mesh)
    extent = view.extent

    with torch.no_grad(), no_mesh.activate():
        data = tensor.detach()
        ref = ctl.new_ref()
        for i, base_rank in enumerate(view.ranks):
            piece = _piece(data, extent.coords(i), extent.sizes, placements)
            ctl.send(single(ctl.base, base_rank), ("put", ref, piece, str(tensor.device)))
        meta = meta_empty(local_shape, tensor.dtype)
    out = Tensor(meta, mesh, ctl, ref, tensor.device)
    out._placements = placements
    return out


def full_tensor(t: Tensor, placements: Sequence[Placement] | None = None) -> torch.Tensor:
    """The whole tensor, gathered from the procs holding its pieces (blocks).

    ``placements`` default to those ``distribute`` recorded; only procs at
    coordinate 0 of replicated dimensions are read.
    """
    placements = tuple(placements) if placements is not None else t._placements
    if placements is None:
        raise ValueError("full_tensor() needs placements: this tensor was not made by distribute()")
    extent = view_of(t._mesh).extent
    if len(placements) != len(extent):
        raise ValueError(f"{len(placements)} placements for a mesh of {len(extent)} dimensions")
    labels, sizes = extent.labels, extent.sizes
    wanted: dict[tuple[int, ...], object] = {}

    def visit(prefix: tuple[int, ...]) -> None:
        i = len(prefix)
        if i == len(sizes):
            wanted[prefix] = fetch_shard(t, dict(zip(labels, prefix)))
            return
        for c in range(sizes[i]) if isinstance(placements[i], Shard) else (0,):
            visit((*prefix, c))

    visit(())
    pieces = {k: f.get() for k, f in wanted.items()}  # type: ignore[attr-defined]

    def assemble(prefix: tuple[int, ...]) -> torch.Tensor:
        i = len(prefix)
        if i == len(sizes):
            return pieces[prefix]
        p = placements[i]
        if isinstance(p, Shard):
            return torch.cat([assemble((*prefix, c)) for c in range(sizes[i])], dim=p.dim)
        return assemble((*prefix, 0))

    with no_mesh.activate():
        return assemble(())
