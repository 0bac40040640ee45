"""Running an op on meta tensors, with a cache for the common cases.

The client learns an op's result shapes by running it on meta tensors. For
elementwise ops torch does that in Python (``torch._refs``): ~50 us, most of
an op's cost on the client. But a result's metadata is a pure function of
the op, its non-tensor arguments and its inputs' metadata, so the second
``x + 1`` on a same-shaped ``x`` can reuse the first one's answer.

Only safe cases are cached: no input requires grad (autograd must record the
real meta graph), every result is an input (in-place) or a fresh non-view
tensor, the run changed no input's metadata (``resize_``, ``t_``, setters
are never cached), and every argument is a plain value. Anything else runs
for real every time.
"""

from __future__ import annotations

from typing import Any

import torch

from monarch.tensors import tree

_MAX_ENTRIES = 4096
_cache: dict[Any, tuple[list, Any]] = {}
_never: set[Any] = set()
_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)


class _NoCache(Exception):
    pass


def _key(obj: Any, tensors: list[torch.Tensor]) -> Any:
    t = type(obj)
    if t in _SIMPLE or t is torch.memory_format:
        return (t, obj)
    if t is torch.Tensor:
        if obj.requires_grad:
            raise _NoCache
        tensors.append(obj)
        return (tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype)
    if t is tuple or t is list or t is torch.Size:
        return (t, tuple(_key(v, tensors) for v in obj))
    if t is dict:
        return (t, tuple((k, _key(v, tensors)) for k, v in obj.items()))
    if t is slice:
        return (t, _key(obj.start, tensors), _key(obj.stop, tensors), _key(obj.step, tensors))
    if obj is Ellipsis:
        return (t,)
    raise _NoCache


def _snapshot(tensors: list[torch.Tensor]) -> list[tuple]:
    return [(t.shape, t.stride(), t.storage_offset(), t.dtype, t.requires_grad) for t in tensors]


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on meta tensors (torch function off), or its cached result."""
    with torch._C.DisableTorchFunction():
        tensors: list[torch.Tensor] = []
        key = None
        if func not in _never and type(func).__name__ != "method-wrapper":
            try:
                key = (func, _key(args, tensors), _key(kwargs, tensors), torch.get_default_dtype())
                hit = _cache.get(key)
            except (_NoCache, TypeError):
                key, hit = None, None
            if hit is not None:
                return _replay(hit, tensors)
        before = _snapshot(tensors) if key is not None else None
        out = func(*args, **kwargs)
        if key is not None:
            if _snapshot(tensors) != before:
                _never.add(func)
            else:
                template = _template(out, tensors)
                if template is not None:
                    if len(_cache) >= _MAX_ENTRIES:
                        _cache.clear()
                    _cache[key] = template
        return out


def _template(out: Any, inputs: list[torch.Tensor]) -> tuple[list, Any] | None:
    leaves, spec = tree.flatten(out)
    items: list = []
    fresh = False
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            index = next((i for i, t in enumerate(inputs) if t is leaf), None)
            if index is not None:
                items.append(("in", index))
            elif leaf._is_view() or leaf.storage_offset() or type(leaf) is not torch.Tensor:
                return None
            else:
                items.append(
                    ("new", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.requires_grad)
                )
                fresh = True
        elif type(leaf) in _SIMPLE:
            items.append(("value", leaf))
        else:
            return None
    if not fresh and not any(i[0] == "in" for i in items):
        return None  # no tensor out: a side effect or a question, run it for real
    return items, spec


def _replay(template: tuple[list, Any], inputs: list[torch.Tensor]) -> Any:
    items, spec = template
    leaves = []
    for item in items:
        if item[0] == "in":
            leaves.append(inputs[item[1]])
        elif item[0] == "new":
            _, shape, stride, dtype, requires_grad = item
            meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            leaves.append(meta.requires_grad_() if requires_grad else meta)
        else:
            leaves.append(item[1])
    return tree.unflatten(leaves, spec)
