"""Getting values back: ``fetch_shard``, ``inspect``, ``show``.

A fetch is a call to one proc's worker, queued in the op stream, so it sees
the result of every op sent before it and nothing after. Each proc holds its
own local tensor, so a fetch names the proc by its mesh coordinates; none
means coordinate 0 everywhere (what you want after an all-reduce).
"""

from __future__ import annotations

from typing import Any, TypeVar

from monarch.actors.meshes.mesh_ops import state_of, view_of
from monarch.core.future import Future
from monarch.tensors import tree
from monarch.tensors.controller import controller_for
from monarch.tensors.errors import MeshError, RemoteTensorError
from monarch.tensors.tensor import Tensor

T = TypeVar("T")


def _rank(mesh: Any, coords: dict[str, int] | None) -> int:
    extent = view_of(mesh).extent
    if not coords:
        return view_of(mesh).ranks[0]
    unknown = set(coords) - set(extent.labels)
    if unknown:
        raise KeyError(f"no dimension(s) {sorted(unknown)} in mesh {extent!r}")
    missing = [d for d in extent.labels if d not in coords]
    if missing:
        raise ValueError(f"coordinates {missing} missing: a shard is named by all of {extent!r}")
    for d in extent.labels:
        if not 0 <= coords[d] < extent[d]:
            raise IndexError(f"{d}={coords[d]} out of range for mesh {extent!r}")
    return view_of(mesh).ranks[extent.rank_of([coords[d] for d in extent.labels])]


def fetch_shard(obj: T, shard: dict[str, int] | None = None, **kwargs: int) -> Future[T]:
    """A future of ``obj`` with every ``monarch.Tensor`` in it replaced by one proc's local tensor.

    ``obj`` may be a tensor or a structure of them (tuple, list, dict); all
    must live on one mesh. The proc is named by ``shard`` and/or keyword
    coordinates (all of the mesh's dimensions), default coordinate 0 of every
    dimension. Tensors come back on CPU. If a tensor is poisoned the future
    raises :class:`RemoteTensorError` naming the operation that failed.
    """
    coords = dict(shard or {})
    coords.update(kwargs)
    leaves, spec = tree.flatten(obj)
    handles = [v for v in leaves if isinstance(v, Tensor)]
    if not handles:
        return Future.from_value(obj)
    mesh = handles[0]._mesh
    for h in handles:
        if h._ref is None:
            raise MeshError(f"{h._describe()} was dropped (t.drop()) and cannot be fetched")
        if state_of(h._mesh) is not state_of(mesh) or view_of(h._mesh) != view_of(mesh):
            raise MeshError("fetch_shard(): all tensors must live on the same mesh")
    ctl = controller_for(mesh)
    ctl.check_alive()
    inner = ctl.call(_rank(mesh, coords), "fetch", [h._ref for h in handles])
    out: Future[T] = Future()

    def done(f: Future) -> None:
        try:
            status, value = f.get()
        except BaseException as e:
            out.set_exception(e)
            return
        if status == "err":
            message, op, rank, tb = value
            out.set_exception(RemoteTensorError(message, op=op, rank=rank, traceback=tb))
            return
        it = iter(value)
        out.set_result(
            tree.unflatten([next(it) if isinstance(v, Tensor) else v for v in leaves], spec)
        )

    inner.add_callback(done)
    return out


def inspect(obj: T, shard: dict[str, int] | None = None, **kwargs: int) -> T:
    """``fetch_shard(obj, shard, **kwargs).get()``: the value, blocking."""
    return fetch_shard(obj, shard, **kwargs).get()


def show(obj: T, shard: dict[str, int] | None = None, **kwargs: int) -> T:
    """Print the value of ``obj`` on one proc (see :func:`inspect`) and return it."""
    value = inspect(obj, shard, **kwargs)
    print(value)
    return value
