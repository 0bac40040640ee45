"""``ValueMesh``: the results of a call, one per actor, shaped like the mesh called."""

from __future__ import annotations

import pprint
import textwrap
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Point, View

T = TypeVar("T")


class ValueMesh(MeshShapeOps, Generic[T]):
    """Values indexed by the points of a mesh.

    Iterating yields ``(Point, value)`` pairs in rank order, like ``items()``;
    ``values()`` yields the values alone; ``item(**coords)`` picks one value.
    """

    def __init__(self, view: View, values: Sequence[T]) -> None:
        if len(values) != len(view):
            raise ValueError(f"{len(values)} values for a mesh of {len(view)}")
        self._view = view
        self._values = list(values)

    def _new_with_view(self, view: View) -> ValueMesh[T]:
        by_base = dict(zip(self._view.ranks, self._values))
        return ValueMesh(view, [by_base[r] for r in view.ranks])

    def item(self, **coords: int) -> T:
        labels = self._view.extent.labels
        if set(coords) != set(labels):
            raise KeyError(f"item() needs exactly the coordinates {labels}, got {sorted(coords)}")
        sizes = self._view.extent.sizes
        for label, size in zip(labels, sizes):
            if not 0 <= coords[label] < size:
                raise IndexError(f"{label}={coords[label]} out of range for size {size}")
        return self._values[self._view.extent.rank_of([coords[label] for label in labels])]

    def get(self, rank: int) -> T:
        """The value at linear ``rank`` (0 to ``len - 1``), as Monarch's; ValueError outside."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < len(self._values):
            raise ValueError(f"index {rank} out of range (len={len(self._values)})")
        return self._values[rank]

    def items(self) -> Iterator[tuple[Point, T]]:
        extent = self._view.extent
        for rank, value in enumerate(self._values):
            yield Point(rank, extent), value

    def values(self) -> Iterator[T]:
        return iter(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ValueMesh)
            and self._view.extent == other._view.extent
            and self._values == other._values
        )

    def __class_getitem__(cls, item: object) -> type:
        """``ValueMesh[int]`` is ValueMesh itself at run time, as in Monarch."""
        return cls

    def __repr__(self) -> str:
        # As Monarch prints it: the extent, then the (point, value) pairs, pretty-printed.
        body = textwrap.indent(pprint.pformat(tuple(self.items())), "  ")
        return f"ValueMesh({self._view.extent!r}):\n{body}"
