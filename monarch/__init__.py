"""Monarch over NATS.

``monarch.actor`` is the actor API. The tensor engine's names (``monarch.Tensor``,
``monarch.remote``, ``monarch.fetch_shard``, ``monarch.inspect``, ...) and the
rest of Monarch's top-level names are loaded on first use, as in Monarch, so
that ``import monarch.actor`` does not import torch. Names this build does
not provide (``OpaqueRef``, ``world_mesh``, ...) import, and raise
``NotImplementedError`` saying why when used (:mod:`monarch.unsupported`).
"""

from importlib import import_module as _import_module
from typing import Any

_public_api = {
    "Tensor": "monarch.tensors.tensor",
    "RemoteTensorError": "monarch.tensors.errors",
    "remote": "monarch.tensors.remote",
    "fetch_shard": "monarch.tensors.fetch",
    "inspect": "monarch.tensors.fetch",
    "show": "monarch.tensors.fetch",
    "reduce": "monarch.tensors",
    "reduce_": "monarch.tensors",
    "to_mesh": "monarch.tensors.moving",
    "slice_mesh": "monarch.tensors.moving",
    "no_mesh": "monarch.tensors.mode",
    "get_active_mesh": "monarch.tensors.mode",
    "coalescing": "monarch.tensors.coalescing",
    "Future": "monarch.core.future",
    "Extent": "monarch.actors.meshes.shape",
    "NDSlice": "monarch.actors.meshes.ndslice",
    "Shape": "monarch.actors.meshes.ndslice",
    "configure": "monarch.config",
    "configured": "monarch.config",
    "get_global_config": "monarch.config",
    "get_runtime_config": "monarch.config",
    "clear_runtime_config": "monarch.config",
    "Selection": "monarch.unsupported",
    "Stream": "monarch.tensors.streams",
    "get_active_stream": "monarch.tensors.streams",
    "OpaqueRef": "monarch.unsupported",
    "call_on_shard_and_fetch": "monarch.unsupported",
    "world_mesh": "monarch.unsupported",
    "grad_generator": "monarch.unsupported",
    "grad_function": "monarch.unsupported",
    "RemoteProcessGroup": "monarch.unsupported",
    "Simulator": "monarch.unsupported",
    "set_meta": "monarch.unsupported",
    "mast_reserve": "monarch.unsupported",
}
# Names that are modules of this package (``monarch.timer.ExecutionTimer``).
_submodules = {"timer": "monarch.timer", "builtins": "monarch.builtins"}

__all__ = sorted([*_public_api, *_submodules])


def __getattr__(name: str) -> Any:
    if name in _submodules:
        value = _import_module(_submodules[name])
    elif name in _public_api:
        value = getattr(_import_module(_public_api[name]), name)
    else:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_public_api, *_submodules])
