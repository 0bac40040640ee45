"""Extents, points and views: the geometry shared by proc, actor and value meshes.

A mesh is a view onto a *base* mesh (the one the processes or actors were
created with). :class:`View` keeps the view's own labels and sizes plus, for
each of its ranks, the rank in the base mesh; every shape operation
(``slice``, ``flatten``, ``rename``, ``split``) makes a new view, so any chain
of them stays exact. Publishing turns a view back into the fewest subjects
that name exactly its members (:meth:`View.subject_tokens`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from monarch.broker.vocabulary.subjects import WILDCARD


class Extent(Mapping[str, int]):
    """Labelled sizes of a mesh, e.g. ``{'hosts': 2, 'gpus': 4}``."""

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels, sizes = tuple(labels), tuple(int(s) for s in sizes)
        if len(labels) != len(sizes):
            raise ValueError(f"{len(labels)} labels but {len(sizes)} sizes")
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate dimension names in {labels}")
        for label, size in zip(labels, sizes):
            if not isinstance(label, str) or not label.isidentifier():
                raise ValueError(f"dimension name {label!r} must be a Python identifier")
            if size < 1:
                raise ValueError(f"dimension {label!r} has size {size}; sizes must be >= 1")
        self._labels, self._sizes = labels, sizes

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        return math.prod(self._sizes)

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        # Monarch's form, labels unquoted: {hosts: 2, gpus: 4}
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(self._labels, self._sizes)) + "}"

    def point(self, rank: int) -> Point:
        return Point(rank, self)

    def coords(self, rank: int) -> list[int]:
        """Row-major coordinates of ``rank`` (the last dimension varies fastest)."""
        if not 0 <= rank < self.nelements:
            raise IndexError(f"rank {rank} out of range for extent {self!r}")
        out = []
        for size in reversed(self._sizes):
            rank, c = divmod(rank, size)
            out.append(c)
        return out[::-1]

    def rank_of(self, coords: Sequence[int]) -> int:
        rank = 0
        for c, size in zip(coords, self._sizes):
            rank = rank * size + c
        return rank


class Point(Mapping[str, int]):
    """One member's coordinates within an extent; prints like ``{'hosts': 0/2, 'gpus': 1/4}``."""

    __slots__ = ("_rank", "_extent", "_coords")

    def __init__(self, rank: int, extent: Extent) -> None:
        self._rank = rank
        self._extent = extent
        self._coords = extent.coords(rank)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def size(self, label: str) -> int:
        """The size of dimension ``label`` of this point's extent, as Monarch's; ValueError if none."""
        try:
            return self._extent._sizes[self._extent._labels.index(label)]
        except ValueError:
            raise ValueError(f"Dimension {label!r} not found") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._rank == other._rank and self._extent == other._extent
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __repr__(self) -> str:
        parts = (
            f"'{k}': {c}/{s}"
            for k, c, s in zip(self._extent._labels, self._coords, self._extent._sizes)
        )
        return "{" + ", ".join(parts) + "}"


class View:
    """A view's extent plus, per view rank, the member's rank in the base mesh."""

    __slots__ = ("extent", "base", "ranks", "_tokens")

    def __init__(self, extent: Extent, base: Extent, ranks: Sequence[int]) -> None:
        if len(ranks) != extent.nelements:
            raise ValueError(f"{len(ranks)} ranks for extent {extent!r}")
        self.extent = extent
        self.base = base
        self.ranks = tuple(ranks)
        self._tokens: list[list[str]] | None = None

    @classmethod
    def full(cls, extent: Extent) -> View:
        return cls(extent, extent, range(extent.nelements))

    def __len__(self) -> int:
        return len(self.ranks)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, View)
            and self.extent == other.extent
            and self.base == other.base
            and self.ranks == other.ranks
        )

    def __hash__(self) -> int:
        return hash((self.extent, self.base, self.ranks))

    # -- shape operations -------------------------------------------------

    def slice(self, **selectors: int | slice) -> View:
        """An int drops its dimension; a slice keeps it (possibly shorter)."""
        labels, sizes = self.extent.labels, self.extent.sizes
        per_dim: list[range | int] = [range(s) for s in sizes]
        for label, sel in selectors.items():
            if label not in labels:
                raise KeyError(f"no dimension {label!r} in mesh with dimensions {labels}")
            i = labels.index(label)
            if isinstance(sel, bool) or not isinstance(sel, (int, slice)):
                raise TypeError(f"slice {label}= takes an int or a slice, not {sel!r}")
            try:
                per_dim[i] = range(sizes[i])[sel]
            except IndexError:
                raise IndexError(
                    f"index {sel} out of range for dimension {label!r} of size {sizes[i]}"
                ) from None
            if isinstance(per_dim[i], range) and len(per_dim[i]) == 0:
                raise ValueError(f"slice {sel} of dimension {label!r} selects nothing")
        new_labels, new_sizes = [], []
        for label, d in zip(labels, per_dim):
            if isinstance(d, range):
                new_labels.append(label)
                new_sizes.append(len(d))
        axes = [d if isinstance(d, range) else (d,) for d in per_dim]
        ranks = [self.ranks[self.extent.rank_of(c)] for c in itertools.product(*axes)]
        return View(Extent(new_labels, new_sizes), self.base, ranks)

    def flatten(self, name: str) -> View:
        return View(Extent([name], [len(self.ranks)]), self.base, self.ranks)

    def rename(self, **names: str) -> View:
        labels = self.extent.labels
        for old in names:
            if old not in labels:
                raise KeyError(f"no dimension {old!r} in mesh with dimensions {labels}")
        new = [names.get(label, label) for label in labels]
        return View(Extent(new, self.extent.sizes), self.base, self.ranks)

    def split(self, **kwargs: Sequence[str] | Mapping[str, int] | int) -> View:
        """Split dimensions into several, as Monarch's ``MeshTrait.split``.

        ``split(hosts=("dp", "pp"), gpus=("tp", "cp"), pp=16, cp=2)``: an existing
        dimension becomes the named ones (outermost first); a new dimension's size is
        given as an integer, and one per split dimension may be left out, to be
        inferred. ``split(gpus={"node": 2, "local": -1})`` (names to sizes, -1 inferred)
        says the same in one argument. Row-major order is kept, so ranks do not move.
        """
        labels = self.extent.labels
        into: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}  # of new dimensions, as given
        for key, value in kwargs.items():
            if key not in labels:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(
                        f"{key!r} is not an existing dim. Expected an integer size "
                        f"constraint on a new dim (dimensions: {labels})"
                    )
                sizes[key] = value
                continue
            if isinstance(value, (list, tuple)) and value and all(type(v) is tuple for v in value):
                value = dict(value)  # (name, size) pairs
            if isinstance(value, Mapping):
                into[key] = list(value)
                sizes.update((k, v) for k, v in value.items() if v != -1)
            elif isinstance(value, (str, int)) or not isinstance(value, Sequence):
                raise ValueError(
                    f"split({key}=...) expects a sequence of dimension names, got {value!r}"
                )
            else:
                into[key] = list(value)
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"size of dimension {name!r} must be a positive int, got {size!r}")
        new_labels: list[str] = []
        new_sizes: list[int] = []
        for label, size in zip(labels, self.extent.sizes):
            names = into.get(label, [label])
            known, unknown = 1, None
            for name in names:
                if name in sizes:
                    known *= sizes[name]
                elif unknown is None:
                    unknown = name
                else:
                    raise ValueError(
                        f"cannot infer the sizes of both {unknown!r} and {name!r} from "
                        f"dimension {label!r}: give one, e.g. {name}=2"
                    )
            if unknown is not None and size % known == 0:
                sizes[unknown] = size // known
            elif unknown is not None or known != size:
                given = tuple(sizes.get(n, "?") for n in names)
                raise ValueError(
                    f"dimension {label!r} of size {size} is not evenly divided by "
                    f"{tuple(names)!r} with sizes {given!r}"
                )
            for name in names:
                if name in new_labels:
                    raise ValueError(f"duplicate dimension name {name!r}")
                new_labels.append(name)
                new_sizes.append(sizes.pop(name))
        if sizes:
            raise ValueError(f"unused size constraints: {tuple(sizes)}")
        return View(Extent(new_labels, new_sizes), self.base, self.ranks)

    # -- addressing -------------------------------------------------------

    def subject_tokens(self) -> list[list[str]]:
        """The fewest token lists (one per publish) that reach exactly this view.

        If the members form a product of per-dimension coordinate sets (every
        slice does), each dimension becomes ``_`` when whole, and is otherwise
        enumerated; other shapes fall back to one publish per member.
        """
        if self._tokens is None:  # a view never changes: compute once
            self._tokens = self._compute_tokens()
        return self._tokens

    def _compute_tokens(self) -> list[list[str]]:
        base = self.base
        coords = [base.coords(r) for r in self.ranks]
        per_dim = [sorted({c[i] for c in coords}) for i in range(len(base))]
        if math.prod(len(p) for p in per_dim) == len(set(self.ranks)):
            axes = [
                [WILDCARD] if len(vals) == size else [str(v) for v in vals]
                for vals, size in zip(per_dim, base.sizes)
            ]
            return [list(t) for t in itertools.product(*axes)]
        return [[str(v) for v in c] for c in sorted({tuple(c) for c in coords})]
