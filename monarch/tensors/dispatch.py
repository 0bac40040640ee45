"""From a torch call on handles to an op sent to the procs.

Every torch function called with a :class:`~monarch.tensors.tensor.Tensor`
(or a factory function inside ``procs.activate()``) arrives here:

1. Metadata questions (``shape``, ``dtype``, ``device``, ``requires_grad``,
   ``dim()``...) are answered from the handle's meta tensor; nothing is sent.
2. Questions about values (``item()``, ``bool(t)``, ``tolist()``...) raise
   ``TypeError`` pointing at ``monarch.inspect``: the client has no values.
3. Anything else runs once on the meta tensors, here, to learn its outputs'
   shapes and dtypes (and to raise shape errors at the caller, before anything
   is sent; repeated ops hit a cache, see :mod:`propagation`); outputs get new reference ids (an in-place op returns the handle
   it was given), and the op goes to the procs, fire-and-forget, in order.

The grad mode (``torch.no_grad()``) at the call travels with each op, so
procs record autograd exactly where the client's meta tensors do: autograd
runs on the procs, on their local tensors, and ``t.grad`` is a handle to them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._device

from monarch.actors.meshes.mesh_ops import state_of, view_of
from monarch.tensors import propagation, tree
from monarch.tensors.controller import controller_for
from monarch.tensors.errors import MeshError
from monarch.tensors.tensor import Tensor, meta_like, owner_of
from monarch.tensors.wire import Lit, Ref, func_spec, literal

T = torch.Tensor
CONSTRUCTORS = frozenset(torch.utils._device._device_constructors())


def _device_of(args: tuple, kwargs: dict) -> Any:
    return args[0]._device


def _value_error(func: Any) -> Any:
    def raise_(args: tuple, kwargs: dict) -> Any:
        name = getattr(func, "__name__", str(func))
        raise TypeError(
            f"{name}() needs the value of a monarch.Tensor, which lives on the procs of "
            f"{args[0]._mesh!r}: fetch it with monarch.inspect(t, **coords) or "
            "monarch.fetch_shard(t, **coords).get()"
        )

    return raise_


def _from_meta(func: Any) -> Any:
    def answer(args: tuple, kwargs: dict) -> Any:
        margs = tuple(a._meta if isinstance(a, Tensor) else a for a in args)
        with torch._C.DisableTorchFunction():
            return func(*margs, **kwargs)

    return answer


def _attrs(owner: Any, names: str) -> list[Any]:
    """The named functions, properties as their getter (skipping any this torch lacks)."""
    out = []
    for name in names.split():
        value = getattr(owner, name, None)
        if value is not None:
            out.append(value.__get__ if type(value).__name__ == "getset_descriptor" else value)
    return out


_META_FUNCS = _attrs(
    T,
    "shape size dim ndim ndimension dtype numel nelement requires_grad is_leaf stride "
    "element_size layout is_contiguous is_floating_point is_complex __len__ is_sparse "
    "is_quantized grad_fn itemsize nbytes storage_offset is_signed retains_grad _version "
    "output_nr _is_view is_inference",
)
_VALUE_FUNCS = _attrs(
    T,
    "item tolist numpy __bool__ __int__ __float__ __index__ __complex__ __array__ data_ptr "
    "untyped_storage storage __reduce_ex__ __deepcopy__ __contains__ __dlpack__ is_nonzero",
) + [torch.equal, torch.allclose]

LOCAL: dict[Any, Any] = {f: _from_meta(f) for f in _META_FUNCS}
LOCAL.update({f: _value_error(f) for f in _VALUE_FUNCS})
LOCAL.update(
    {
        T.device.__get__: _device_of,
        T.is_cuda.__get__: lambda a, k: a[0]._device.type == "cuda",
        T.is_cpu.__get__: lambda a, k: a[0]._device.type == "cpu",
        T.is_meta.__get__: lambda a, k: False,
        T.get_device: lambda a, k: a[0]._device.index if a[0]._device.type != "cpu" else -1,
        T.__repr__: lambda a, k: a[0]._describe(),
        T.__format__: lambda a, k: a[0]._describe(),
        T.__hash__: lambda a, k: id(a[0]),
    }
)


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """A torch call with at least one handle among its arguments."""
    try:
        local = LOCAL.get(func)
    except TypeError:  # an unhashable callable
        local = None
    if local is not None:
        return local(args, kwargs)
    return run_op(func, args, kwargs)


def dispatch_factory(mesh: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """A torch factory function (``torch.zeros``...) inside ``mesh.activate()``."""
    return run_op(func, args, kwargs, mesh=mesh)


class Walk:
    """Splits arguments into their meta version (run here) and wire version (sent)."""

    def __init__(self, allow_local: bool = False) -> None:
        self.allow_local = allow_local
        self.mesh: Any = None
        self.handles: list[Tensor] = []

    def __call__(self, obj: Any) -> tuple[Any, Any]:
        t = type(obj)
        if t is int or t is float or t is bool or t is str or obj is None:
            return obj, obj
        if isinstance(obj, Tensor):
            return self._handle(obj)
        if t is tuple or t is list:
            pairs = [self(v) for v in obj]
            return t(p[0] for p in pairs), t(p[1] for p in pairs)
        if t is dict:
            pairs = {k: self(v) for k, v in obj.items()}
            return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
        if isinstance(obj, torch.Tensor):
            if not self.allow_local:
                raise MeshError(
                    "a local torch.Tensor was mixed with monarch.Tensors (which live on procs): "
                    "create it inside procs.activate() (e.g. torch.tensor(data)), send it with "
                    "monarch.tensors.distribute(t, procs, placements), or compute locally inside "
                    "`with monarch.no_mesh.activate():`"
                )
            return meta_like(obj), obj
        if t is slice:
            parts = [self(v) for v in (obj.start, obj.stop, obj.step)]
            return slice(*(p[0] for p in parts)), Lit("slice", [p[1] for p in parts])
        lit = literal(obj)
        if lit is not None:
            return obj, lit
        return obj, obj

    def _handle(self, h: Tensor) -> tuple[Any, Any]:
        if h._ref is None:
            raise MeshError(f"{h._describe()} was dropped (t.drop()) and cannot be used")
        if self.mesh is None:
            self.mesh = h._mesh
        elif h._mesh is not self.mesh and not _same_mesh(h._mesh, self.mesh):
            raise MeshError(
                f"monarch.Tensors on different meshes were used together ({self.mesh!r} and "
                f"{h._mesh!r}): move one with monarch.to_mesh(t, mesh) first"
            )
        self.handles.append(h)
        return h._meta, Ref(h._ref)


def _same_mesh(a: Any, b: Any) -> bool:
    return state_of(a) is state_of(b) and view_of(a) == view_of(b)


def _target_device(func: Any, w: Walk, args: tuple, kwargs: dict) -> Any:
    """Where the result lives on the procs (meta tensors all say 'meta')."""
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    if w.handles:
        if func is T.to:
            if len(w.handles) > 1:  # t.to(other): other's device and dtype
                return w.handles[1]._device
            parsed = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            return parsed if parsed is not None else w.handles[0]._device
        if func is T.cuda:
            index = args[1] if len(args) > 1 else kwargs.get("device")
            return torch.device("cuda", index) if isinstance(index, int) else torch.device("cuda")
        if func is T.cpu:
            return torch.device("cpu")
        return w.handles[0]._device
    return torch.device("cpu")


def _run_meta(func: Any, margs: tuple, mkwargs: dict, device: Any, w: Walk) -> Any:
    if "device" in mkwargs or (not w.handles and func in CONSTRUCTORS):
        mkwargs = {**mkwargs, "device": "meta"}
    moving = func is T.to or func is T.cuda or func is T.cpu
    with torch._C.DisableTorchFunction():
        try:
            if moving:  # the device change happens on the procs; here only dtype may change
                src = margs[0]
                dtype = None
                if func is T.to:
                    if len(w.handles) > 1:
                        dtype = w.handles[1]._meta.dtype
                    else:
                        dtype = torch._C._nn._parse_to(*margs[1:], **mkwargs)[1]
                out = src.to(dtype=dtype or src.dtype, copy=bool(mkwargs.get("copy", False)))
                if out is src and device != w.handles[0]._device:
                    out = src.clone()
                return out
            return propagation.run(func, margs, mkwargs)
        except NotImplementedError as e:
            raise NotImplementedError(
                f"{_name(func)} cannot run on monarch.Tensors: the client cannot work out its "
                f"result's shape without the data ({e}). Do it inside a @monarch.remote function "
                "with propagate=... describing the result"
            ) from None


def _name(func: Any) -> str:
    try:
        return func_spec(func)[2]
    except Exception:
        return getattr(func, "__name__", repr(func))


def run_op(func: Any, args: tuple, kwargs: dict, mesh: Any = None) -> Any:
    """Propagate metadata here, then send ``func`` to the procs of the handles' mesh."""
    w = Walk(allow_local=_allows_local(func, mesh))
    margs, wargs = w(args)
    mkwargs, wkwargs = w(kwargs)
    mesh = w.mesh if w.mesh is not None else mesh
    ctl = controller_for(mesh)
    ctl.check_alive()
    device = _target_device(func, w, args, kwargs)
    out = _run_meta(func, margs, mkwargs, device, w)
    leaves, spec = tree.flatten(out)
    refs: list[int] = []
    fresh: list[tuple[int, torch.Tensor, int]] = []  # (leaf index, meta, ref)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            continue
        if leaf.device.type != "meta":
            leaf = leaves[i] = meta_like(leaf)
        h = owner_of(leaf)
        if h is not None and h._ref is not None and _same_mesh(h._mesh, mesh):
            refs.append(h._ref)  # an in-place op: the procs return the same local tensor
            leaves[i] = h
        else:
            ref = ctl.new_ref()
            refs.append(ref)
            fresh.append((i, leaf, ref))
    if not refs and out is not None:
        return out  # a question about metadata that the meta tensors answered
    ctl.op(view_of(mesh), func, wargs, wkwargs, refs, torch.is_grad_enabled())
    for i, meta, ref in fresh:
        leaves[i] = Tensor(meta, mesh, ctl, ref, device)
    return tree.unflatten(leaves, spec)


def _allows_local(func: Any, mesh: Any) -> bool:
    """Local tensors may be the data of a factory call (``torch.tensor(local)``), nothing else."""
    return mesh is not None and func in CONSTRUCTORS
