"""The tensor engine: distributed tensors on proc meshes, every control message over NATS.

``with procs.activate():`` makes torch calls produce :class:`Tensor` handles,
one local tensor per proc; ops are recorded and sent to the procs in order,
without a round trip each. Read values back with :func:`fetch_shard` /
:func:`inspect`, reduce across mesh dimensions with :meth:`Tensor.reduce`,
run your own code where the tensors live with :func:`remote` or
``endpoint.rref(...)``, move tensors with :func:`to_mesh` /
:func:`slice_mesh`, and shard local data with :func:`distribute`.

Module map: :mod:`tensor` (the handle), :mod:`mode` (``activate``/``no_mesh``),
:mod:`dispatch` and :mod:`propagation` (torch call -> op), :mod:`controller`
(the client's ordered op stream), :mod:`worker`/:mod:`executor` (the proc
side), :mod:`collectives`, :mod:`remote`, :mod:`fetch`, :mod:`moving`,
:mod:`sharding`, :mod:`wire` (how ops travel), :mod:`errors`.

The names below load on first use, so importing this package (or
``monarch.actor``) does not import torch; using them does.

Layer: above :mod:`monarch.actors` (the engine's workers are actors), beside
:mod:`monarch.hosts`; the actor layer reaches it only through its two doors.
"""

from importlib import import_module as _import_module
from typing import Any

# Loaded on first use: procs import monarch.tensors.worker on their event loop, where
# importing torch (which every module below does) would stall heartbeats.
_lazy = {
    "REDUCTIONS": "monarch.tensors.collectives",
    "coalescing": "monarch.tensors.coalescing",
    "RemoteTensorError": "monarch.tensors.errors",
    "MeshError": "monarch.tensors.errors",
    "fetch_shard": "monarch.tensors.fetch",
    "inspect": "monarch.tensors.fetch",
    "show": "monarch.tensors.fetch",
    "activate": "monarch.tensors.mode",
    "get_active_mesh": "monarch.tensors.mode",
    "no_mesh": "monarch.tensors.mode",
    "MeshSliceTensor": "monarch.tensors.moving",
    "slice_mesh": "monarch.tensors.moving",
    "to_mesh": "monarch.tensors.moving",
    "Remote": "monarch.tensors.remote",
    "remote": "monarch.tensors.remote",
    "Replicate": "monarch.tensors.sharding",
    "Shard": "monarch.tensors.sharding",
    "distribute": "monarch.tensors.sharding",
    "full_tensor": "monarch.tensors.sharding",
    "Stream": "monarch.tensors.streams",
    "get_active_stream": "monarch.tensors.streams",
    "Tensor": "monarch.tensors.tensor",
}


def __getattr__(name: str) -> Any:
    module = _lazy.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch.tensors' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def reduce(
    tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None
) -> Any:
    """:meth:`Tensor.reduce` for every tensor in ``tensors`` (a tensor or a structure of them)."""
    # Imported when called: the package's __init__ runs before each of its modules, which build on these.
    from monarch.tensors import tree
    from monarch.tensors.tensor import Tensor

    leaves, spec = tree.flatten(tensors)
    return tree.unflatten(
        [v.reduce(dims, reduction, scatter, mesh) if isinstance(v, Tensor) else v for v in leaves],
        spec,
    )


def reduce_(
    tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None
) -> Any:
    """:meth:`Tensor.reduce_` for every tensor in ``tensors``."""
    # Imported when called: the package's __init__ runs before each of its modules, which build on these.
    from monarch.tensors import tree
    from monarch.tensors.tensor import Tensor

    leaves, spec = tree.flatten(tensors)
    return tree.unflatten(
        [v.reduce_(dims, reduction, scatter, mesh) if isinstance(v, Tensor) else v for v in leaves],
        spec,
    )


def worker_stats(mesh: Any) -> Any:
    """A future of a ValueMesh of what each proc's worker holds: ``{refs, bytes, poisoned}``.

    Ordered with the op stream (handles dropped before the call are freed by
    then). For tests and debugging memory.
    """
    # Imported when called: the package's __init__ runs before each of its modules, which build on these.
    from monarch.tensors.controller import controller_for

    return controller_for(mesh).call_all("stats")


__all__ = [
    "REDUCTIONS",
    "MeshError",
    "MeshSliceTensor",
    "Remote",
    "RemoteTensorError",
    "Replicate",
    "Shard",
    "Tensor",
    "activate",
    "distribute",
    "fetch_shard",
    "full_tensor",
    "get_active_mesh",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
    "worker_stats",
]
