"""Monarch over NATS.

``monarch.actor`` is the actor API. The tensor engine's names (``monarch.Tensor``,
``monarch.remote``, ``monarch.fetch_shard``, ``monarch.inspect``, ...) are
loaded on first use, as in Monarch, so that ``import monarch.actor`` does not
import torch.
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
    "Future": "monarch.actors.future",
    "Extent": "monarch.actors.shape",
}

__all__ = sorted(_public_api)


def __getattr__(name: str) -> Any:
    module = _public_api.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_public_api])
