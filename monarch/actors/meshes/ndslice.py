"""Monarch's ``NDSlice`` and ``Shape``: strided views of ranks, with labelled dimensions.

``monarch.NDSlice(offset=, sizes=, strides=)`` names the ranks
``offset + sum(c_i * strides_i)`` for every coordinate ``c`` within
``sizes``, in row-major order of ``c``; ``monarch.Shape(labels, ndslice)``
gives each dimension a name. They are plain values (hashable, picklable,
comparable), as in Monarch; the meshes themselves use
:class:`monarch.actors.meshes.shape.View`, which this module does not change.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, overload

from monarch.actors.meshes.shape import Extent


class NDSlice:
    """Ranks ``offset + c . strides`` for every ``c`` in ``sizes``, in row-major order."""

    __slots__ = ("_offset", "_sizes", "_strides")

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        if len(sizes) != len(strides):
            raise ValueError(f"sizes {list(sizes)} and strides {list(strides)} differ in length")
        if offset < 0 or any(s < 0 for s in sizes) or any(s < 0 for s in strides):
            raise ValueError("offset, sizes and strides must not be negative")
        self._offset = int(offset)
        self._sizes = tuple(int(s) for s in sizes)
        self._strides = tuple(int(s) for s in strides)

    @classmethod
    def new_row_major(cls, sizes: Sequence[int]) -> NDSlice:
        """The dense slice over ``sizes`` starting at rank 0 (last dimension contiguous)."""
        strides, step = [], 1
        for size in reversed(sizes):
            strides.insert(0, step)
            step *= size
        return cls(offset=0, sizes=sizes, strides=strides)

    @staticmethod
    def from_list(ranks: Sequence[int]) -> list[NDSlice]:
        """One-dimensional slices covering sorted ``ranks``, one per run of consecutive ranks."""
        out: list[NDSlice] = []
        for _, run in itertools.groupby(
            enumerate(sorted(set(ranks))), key=lambda pair: pair[1] - pair[0]
        ):
            members = [r for _, r in run]
            out.append(NDSlice(offset=members[0], sizes=[len(members)], strides=[1]))
        return out

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        return list(self._strides)

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    def __len__(self) -> int:
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def nditem(self, coords: Sequence[int]) -> int:
        """The rank at ``coords``; ValueError when they are outside the slice."""
        if len(coords) != self.ndim or any(
            not 0 <= c < s for c, s in zip(coords, self._sizes, strict=False)
        ):
            raise ValueError(f"coordinates {list(coords)} are outside sizes {self.sizes}")
        return self._offset + sum(c * s for c, s in zip(coords, self._strides, strict=True))

    def get(self, index: int) -> int:
        """The rank at row-major position ``index``; ValueError when out of range."""
        if not 0 <= index < len(self):
            raise ValueError(f"index {index} out of range {len(self)}")
        coords = []
        for size in reversed(self._sizes):
            index, c = divmod(index, size)
            coords.insert(0, c)
        return self.nditem(coords)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return tuple(self.get(i) for i in range(*index.indices(len(self))))
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range {len(self)}")
        return self.get(index)

    def __iter__(self) -> Iterator[int]:
        return (self.get(i) for i in range(len(self)))

    def coordinates(self, rank: int) -> list[int]:
        """The coordinates of ``rank``; ValueError when the slice does not hold it."""
        # Largest stride first: exact for the non-overlapping slices meshes use;
        # anything else (overlapping strides) falls back to a search.
        rest, coords = rank - self._offset, [0] * self.ndim
        for d in sorted(range(self.ndim), key=lambda d: -self._strides[d]):
            stride = self._strides[d]
            c = min(max(rest // stride if stride else 0, 0), self._sizes[d] - 1)
            coords[d] = c
            rest -= c * stride
        if rest == 0 and len(self) and self.nditem(coords) == rank:
            return coords
        for c in itertools.product(*(range(s) for s in self._sizes)):
            if self.nditem(c) == rank:
                return list(c)
        raise ValueError(f"rank {rank} is not in {self!r}")

    def index(self, rank: int) -> int:
        """The row-major position of ``rank``; ValueError when the slice does not hold it."""
        coords = self.coordinates(rank)
        pos = 0
        for c, size in zip(coords, self._sizes, strict=True):
            pos = pos * size + c
        return pos

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NDSlice) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self._offset, self._sizes, self._strides)

    def __reduce__(self) -> Any:
        return (_ndslice, self._key())

    def __repr__(self) -> str:
        return f"NDSlice(offset={self._offset}, sizes={self.sizes}, strides={self.strides})"


def _ndslice(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> NDSlice:
    return NDSlice(offset=offset, sizes=sizes, strides=strides)


class Shape:
    """An :class:`NDSlice` whose dimensions have labels (``Shape(["hosts", "gpus"], s)``)."""

    __slots__ = ("_labels", "_ndslice")

    def __init__(self, labels: Sequence[str], ndslice: NDSlice) -> None:
        if len(labels) != ndslice.ndim:
            raise ValueError(
                f"label slice dimension mismatch: {len(labels)} labels for {ndslice.ndim} dimensions"
            )
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate labels in {list(labels)}")
        self._labels = tuple(labels)
        self._ndslice = ndslice

    @classmethod
    def unity(cls) -> Shape:
        """The shape of one rank (rank 0) with no dimensions."""
        return cls([], NDSlice(offset=0, sizes=[], strides=[]))

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def ndslice(self) -> NDSlice:
        return self._ndslice

    @property
    def extent(self) -> Extent:
        return Extent(self.labels, self._ndslice.sizes)

    def ranks(self) -> list[int]:
        return list(self._ndslice)

    def __len__(self) -> int:
        return len(self._ndslice)

    def coordinates(self, rank: int) -> dict[str, int]:
        return dict(zip(self._labels, self._ndslice.coordinates(rank), strict=True))

    def at(self, label: str, index: int) -> Shape:
        """The shape with dimension ``label`` fixed at ``index`` (and removed)."""
        return self.index(**{label: index})

    def select(self, label: str, sel: int | slice) -> Shape:
        """The shape with dimension ``label`` narrowed to ``sel`` (the dimension stays)."""
        if isinstance(sel, int):
            sel = slice(sel, sel + 1)
        return self._narrow({label: sel}, drop=())

    def index(self, **selectors: int | slice) -> Shape:
        """Fix dimensions (an int removes the dimension) or narrow them (a slice keeps it)."""
        unknown = [k for k in selectors if k not in self._labels]
        if unknown:
            raise ValueError(f"invalid labels {unknown}; this shape has {self.labels}")
        ints = {k: v for k, v in selectors.items() if isinstance(v, int)}
        narrowed = {k: (slice(v, v + 1) if isinstance(v, int) else v) for k, v in selectors.items()}
        return self._narrow(narrowed, drop=tuple(ints))

    def _narrow(self, selectors: dict[str, slice], drop: tuple[str, ...]) -> Shape:
        offset = self._ndslice.offset
        labels, sizes, strides = [], [], []
        for label, size, stride in zip(
            self._labels, self._ndslice.sizes, self._ndslice.strides, strict=True
        ):
            sel = selectors.get(label)
            if sel is None:
                start, step, n = 0, 1, size
            else:
                if isinstance(sel, slice) and sel.start is not None and sel.start >= size:
                    raise IndexError(f"index {sel.start} out of range for {label!r} of size {size}")
                r = range(*sel.indices(size))
                start, step, n = r.start, r.step, len(r)
                if n == 0:
                    raise IndexError(f"empty selection {sel} of {label!r} (size {size})")
            offset += start * stride
            if label not in drop:
                labels.append(label)
                sizes.append(n)
                strides.append(stride * step)
        return Shape(labels, NDSlice(offset=offset, sizes=sizes, strides=strides))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Shape)
            and self._labels == other._labels
            and self._ndslice == other._ndslice
        )

    def __hash__(self) -> int:
        return hash((self._labels, self._ndslice))

    def __reduce__(self) -> Any:
        return (Shape, (self.labels, self._ndslice))

    def __repr__(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in zip(self._labels, self._ndslice.sizes, strict=True))
        return f"{{{dims}}}"
