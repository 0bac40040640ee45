"""How ops travel: references to remote tensors, torch literals, and functions.

* :class:`Ref` stands for a remote tensor in an op's arguments: the proc
  replaces it with its local tensor. Ids are allocated by the client, one
  namespace per proc mesh.
* ``torch.dtype``, ``torch.device``, ``torch.Size``, ``slice`` and ``...``
  become a :class:`Lit` (codec ext 49) rather than a pickle, so ordinary ops
  need no pickling at all; procs decode them back to the torch objects.
* Functions travel once per proc mesh (see :mod:`monarch.tensors.controller`)
  as a dotted path when they are importable torch callables (verified: the
  path must resolve to the very same object), otherwise by cloudpickle (a
  user's ``@remote`` function from ``__main__`` travels by value).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import cloudpickle
import torch

from monarch.broker.bodies.ext import register_ext

REF_EXT = 48
LIT_EXT = 49


class Ref:
    """A remote tensor in an op message."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class Lit:
    """A torch literal on the wire: ``kind`` and a msgpack-able value."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any) -> None:
        self.kind = kind
        self.value = value


def literal(obj: Any) -> Lit | None:
    """``obj`` as a :class:`Lit` if it is one of the torch literals, else None."""
    t = type(obj)
    if t is torch.dtype:
        return Lit("dtype", str(obj).removeprefix("torch."))
    if t is torch.device:
        return Lit("device", str(obj))
    if t is torch.Size:
        return Lit("size", list(obj))
    if t is slice:
        return None  # handled by the caller: its parts may be tensors
    if obj is Ellipsis:
        return Lit("ellipsis", None)
    if t is torch.memory_format or t is torch.layout:
        return Lit("torchattr", str(obj).removeprefix("torch."))
    return None


def _decode_lit(fields: list) -> Any:
    kind, value = fields
    if kind == "dtype" or kind == "torchattr":
        return getattr(torch, value)
    if kind == "device":
        return torch.device(value)
    if kind == "size":
        return torch.Size(value)
    if kind == "slice":
        return slice(*value)
    if kind == "ellipsis":
        return Ellipsis
    raise ValueError(f"unknown tensor-engine literal {kind!r}")


register_ext(REF_EXT, Ref, lambda r: r.id, Ref)
register_ext(LIT_EXT, Lit, lambda lit: [lit.kind, lit.value], _decode_lit)


# -- functions ---------------------------------------------------------------------

_spec_lock = threading.Lock()
_specs: dict[Any, tuple[str, Any, str]] = {}
_tensor_attrs: dict[int, str] | None = None


def func_spec(func: Any) -> tuple[str, Any, str]:
    """``(kind, payload, display name)``: kind ``path`` (dotted) or ``pickle`` (bytes)."""
    try:
        return _specs[func]
    except (KeyError, TypeError):
        pass
    spec = _make_spec(func)
    try:
        with _spec_lock:
            _specs[func] = spec
    except TypeError:  # unhashable callable: not cached
        pass
    return spec


def _make_spec(func: Any) -> tuple[str, Any, str]:
    if isinstance(func, str):
        return ("path", func, func)
    # A @remote function: its module attribute is the Remote wrapper, which resolves back.
    impl = getattr(func, "_monarch_remote_impl", None)
    if isinstance(impl, str):
        return ("path", impl, impl)
    target = func if impl is None else impl
    for path in _candidate_paths(target):
        if path.startswith("__main__."):
            continue  # the procs' __main__ is not the client's: send such functions by value
        try:
            found = resolve_path(path)
            if found == target or (impl is not None and found is func):
                return ("path", path, display_name(path))
        except Exception:
            continue
    module = getattr(target, "__module__", None) or "?"
    name = f"{module}.{getattr(target, '__qualname__', repr(target))}"
    return ("pickle", cloudpickle.dumps(target), display_name(name))


def _candidate_paths(func: Any) -> list[str]:
    out = []
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", None)
    # A property's getter or setter: torch._C.TensorBase.grad.__get__
    objclass = getattr(owner, "__objclass__", None)
    if objclass is not None and name is not None:
        out.append(f"{objclass.__module__}.{objclass.__qualname__}.{owner.__name__}.{name}")
    objclass = getattr(func, "__objclass__", None)
    if objclass is not None and name is not None:
        out.append(f"{objclass.__module__}.{objclass.__qualname__}.{name}")
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if module and qualname:
        out.append(f"{module}.{qualname}")
    if module and name:
        out.append(f"{module}.{name}")
    if name is not None:
        out.append(f"torch.{name}")
    attr = _tensor_attr_name(func)
    if attr is not None:
        out.append(f"torch.Tensor.{attr}")
    return out


def _tensor_attr_name(func: Any) -> str | None:
    """The ``torch.Tensor`` attribute that is ``func`` (wrapped operators such as ``__pow__``)."""
    global _tensor_attrs
    if _tensor_attrs is None:
        found = {}
        for klass in (torch._C.TensorBase, torch.Tensor):
            for attr, value in vars(klass).items():
                if callable(value):
                    found[id(value)] = attr
        _tensor_attrs = found
    return _tensor_attrs.get(id(func))


_resolved: dict[str, Any] = {}


def resolve_path(path: str) -> Any:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    try:
        return _resolved[path]
    except KeyError:
        pass
    parts = path.split(".")
    obj = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        break
    else:
        raise ImportError(f"cannot resolve {path!r}")
    _resolved[path] = obj
    return obj


def resolve_func(kind: str, payload: Any) -> Any:
    fn = resolve_path(payload) if kind == "path" else cloudpickle.loads(payload)
    impl = getattr(fn, "_monarch_remote_impl", None)  # a @remote wrapper: run what it wraps
    if impl is not None:
        fn = resolve_path(impl) if isinstance(impl, str) else impl
    return fn


_PREFIXES = (
    ("torch._C.TensorBase.", "torch.Tensor."),
    ("torch._tensor.Tensor.", "torch.Tensor."),
    ("torch._C._VariableFunctions.", "torch."),
    ("torch._C._VariableFunctionsClass.", "torch."),
    ("torch._C._nn.", "torch.nn.functional."),
    ("torch._C._linalg.", "torch.linalg."),
    ("torch._C._fft.", "torch.fft."),
    ("torch._C._special.", "torch.special."),
)


def display_name(path: str) -> str:
    """How an operation is named in errors: ``torch.matmul``, ``torch.Tensor.add``."""
    for old, new in _PREFIXES:
        if path.startswith(old):
            path = new + path[len(old) :]
            break
    path = path.replace("torch.linalg.linalg_", "torch.linalg.")
    if path.endswith(".__get__"):
        return path[: -len(".__get__")]
    if path.endswith(".__set__"):
        return path[: -len(".__set__")] + " (set)"
    return path
