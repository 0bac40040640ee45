"""A minimal pytree: tensors inside tuples, lists, dicts and named tuples.

Client and procs must flatten an op's result the same way so that the i-th
tensor leaf on a proc gets the i-th reference the client allocated; this
module is what both sides use. It is much cheaper than ``torch.utils._pytree``
for the small argument lists ops have, and knows the same containers
(``torch.return_types`` structseqs included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Spec = Any  # opaque: what unflatten needs


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _is_structseq(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "n_fields")


def flatten(obj: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], Spec]:
    """Leaves (non-container values) in order, and the spec to rebuild ``obj``."""
    leaves: list[Any] = []
    spec = _flatten(obj, leaves, is_leaf)
    return leaves, spec


def _flatten(obj: Any, leaves: list, is_leaf: Callable[[Any], bool] | None) -> Spec:
    if is_leaf is not None and is_leaf(obj):
        leaves.append(obj)
        return None
    t = type(obj)
    if t is tuple or t is list or _is_namedtuple(obj) or _is_structseq(obj):
        return (t, [_flatten(v, leaves, is_leaf) for v in obj])
    if t is dict:
        return (dict, list(obj), [_flatten(v, leaves, is_leaf) for v in obj.values()])
    leaves.append(obj)
    return None


def unflatten(leaves: list[Any], spec: Spec) -> Any:
    it = iter(leaves)
    return _unflatten(it, spec)


def _unflatten(it: Any, spec: Spec) -> Any:
    if spec is None:
        return next(it)
    t = spec[0]
    if t is dict:
        return {k: _unflatten(it, s) for k, s in zip(spec[1], spec[2])}
    items = [_unflatten(it, s) for s in spec[1]]
    if t is tuple or t is list:
        return t(items)
    if hasattr(t, "_fields"):  # namedtuple
        return t(*items)
    return t(items)  # structseq (torch.return_types.*)


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """The tensors in ``obj``, in flatten order."""
    leaves, _ = flatten(obj)
    return [v for v in leaves if isinstance(v, torch.Tensor)]
