"""Shape operations shared by proc, actor and value meshes.

Each mesh keeps a :class:`~monarch.actors.meshes.shape.View` in ``_view`` and knows
how to make a copy of itself over another view (``_new_with_view``); this mixin
gives all of them the same ``slice``/``flatten``/``rename``/``split`` and size
accessors, so the three behave alike.
"""

from __future__ import annotations

from typing import Any

from monarch.actors.meshes.shape import Extent, View


class MeshShapeOps:
    _view: View

    def _new_with_view(self, view: View) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def extent(self) -> Extent:
        return self._view.extent

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self._view.extent)

    @property
    def _labels(self) -> list[str]:
        """The dimension names (Monarch's ``MeshTrait._labels``, which its own docs use)."""
        return list(self._view.extent.labels)

    def __len__(self) -> int:
        """Number of members (hosts, procs, actors), as Monarch's ``len(mesh)``."""
        return len(self._view)

    def size(self, dim: str | list[str] | None = None) -> int:
        """Number of members, in total or along the given dimension(s)."""
        if dim is None:
            return self._view.extent.nelements
        dims = [dim] if isinstance(dim, str) else dim
        extent = self._view.extent
        total = 1
        for d in dims:
            if d not in extent:
                raise KeyError(f"no dimension {d!r} in mesh with dimensions {extent.labels}")
            total *= extent[d]
        return total

    def slice(self, **selectors: int | slice) -> Any:
        """A sub-mesh: ``dim=int`` drops that dimension, ``dim=slice`` keeps it."""
        return self._new_with_view(self._view.slice(**selectors))

    def flatten(self, name: str) -> Any:
        return self._new_with_view(self._view.flatten(name))

    def rename(self, **names: str) -> Any:
        return self._new_with_view(self._view.rename(**names))

    def split(self, **splits: Any) -> Any:
        return self._new_with_view(self._view.split(**splits))


def view_of(mesh: Any) -> View:
    """The view a proc or actor mesh covers (its extent, base and ranks).

    For layers above the actor runtime (the tensor engine): a function, not an
    attribute, since an actor mesh's attributes are its endpoints.
    """
    return mesh._view


def state_of(mesh: Any) -> Any:
    """The state every view of one proc or actor mesh shares (identity: the same mesh)."""
    return mesh._state
