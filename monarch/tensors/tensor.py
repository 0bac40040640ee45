"""``monarch.Tensor``: a handle to one local tensor per proc of a proc mesh.

The handle is a ``torch.Tensor`` subclass with no storage. It keeps a *meta*
tensor (shape, dtype, strides, autograd state, no data) so that metadata
answers locally, and a reference id under which every proc of its mesh keeps
its own local tensor. Torch calls on handles are intercepted through
``__torch_function__`` (see :mod:`monarch.tensors.dispatch`); nothing here
ever touches tensor data on the client.

When a handle is garbage collected its reference is released: the procs drop
their tensors with the next message the client sends them (see
:meth:`Controller.release`), so remote memory follows client-side lifetimes.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from monarch.actors.meshes.mesh_ops import view_of
from monarch.broker.bodies.ext import register_ext

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh
    from monarch.tensors.controller import Controller
    from monarch.tensors.moving import MeshSliceTensor

TENSOR_EXT = 50


class Tensor(torch.Tensor):
    """A distributed tensor: one local tensor per proc of ``mesh``, all of the same shape and dtype.

    Create them inside ``with procs.activate():`` (torch factory functions and
    operations then produce handles), with :func:`monarch.tensors.distribute`,
    from ``@monarch.remote`` functions or ``endpoint.rref(...)``. Operations
    are sent to the procs in order without waiting; read a value back with
    :func:`monarch.fetch_shard` or :func:`monarch.inspect`.
    """

    _meta: torch.Tensor
    _ref: int | None
    _mesh: ProcMesh
    _ctl: Controller
    _device: torch.device
    _placements: tuple | None
    _finalizer: weakref.finalize

    @staticmethod
    def __new__(
        cls, meta: torch.Tensor, mesh: ProcMesh, ctl: Controller, ref: int, device: torch.device
    ) -> Tensor:
        with torch._C.DisableTorchFunction():
            r = torch.Tensor._make_wrapper_subclass(
                cls,
                meta.size(),
                strides=meta.stride(),
                storage_offset=meta.storage_offset(),
                dtype=meta.dtype,
                layout=meta.layout,
                device=device,
                requires_grad=False,
            )
        r._meta = meta
        r._ref = ref
        r._mesh = mesh
        r._ctl = ctl
        r._device = device
        r._placements = None
        meta._monarch_handle = weakref.ref(r)
        r._finalizer = weakref.finalize(r, ctl.release, view_of(mesh), ref)
        r._finalizer.atexit = False
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.dispatch import dispatch

        return dispatch(func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        raise RuntimeError(
            f"{func} reached a monarch.Tensor below torch's Python API, where the tensor engine "
            "cannot see it; please report this with the code that triggered it"
        )

    # -- the engine's own API -------------------------------------------------------

    @property
    def mesh(self) -> ProcMesh:
        """The proc mesh (or slice of one) whose procs hold this tensor."""
        return self._mesh

    @property
    def dropped(self) -> bool:
        return self._ref is None

    def drop(self) -> None:
        """Free the procs' copies now instead of when this handle is garbage collected."""
        if self._ref is not None:
            self._ref = None
            self._finalizer()

    def reduce(
        self,
        dims: str | Sequence[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: ProcMesh | None = None,
    ) -> Tensor:
        """Reduce across mesh dimensions; see :func:`monarch.tensors.collectives.reduce`."""
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.collectives import reduce

        return reduce(self, dims, reduction, scatter, mesh)

    def reduce_(
        self,
        dims: str | Sequence[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: ProcMesh | None = None,
    ) -> Tensor:
        """In-place :meth:`reduce` (the result has this tensor's shape); returns ``self``."""
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.collectives import reduce

        return reduce(self, dims, reduction, scatter, mesh, inplace=True)

    def slice_mesh(self, **coords: int | slice) -> MeshSliceTensor:
        """This tensor on a slice of its mesh (``.to_mesh(other)`` then moves it)."""
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.moving import MeshSliceTensor

        return MeshSliceTensor(self, self._mesh.slice(**coords))

    def to_mesh(self, mesh: ProcMesh) -> Tensor:
        """A copy of this tensor on ``mesh``; see :func:`monarch.to_mesh`."""
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.moving import MeshSliceTensor

        return MeshSliceTensor(self, self._mesh).to_mesh(mesh)

    def full_tensor(self, placements: Sequence[Any] | None = None) -> torch.Tensor:
        """Gather the shards into one local tensor (placements default to ``distribute``'s)."""
        # Imported when called: this module defines Tensor, which that one builds on (it imports this one).
        from monarch.tensors.sharding import full_tensor

        return full_tensor(self, placements)

    def _describe(self) -> str:
        m = self._meta
        extent = view_of(self._mesh).extent
        grad = ", requires_grad=True" if m.requires_grad else ""
        return (
            f"monarch.Tensor(mesh={extent!r}, shape={tuple(m.shape)}, dtype={m.dtype}, "
            f"device={self._device}{grad})"
        )


def meta_empty(shape: Any, dtype: torch.dtype, requires_grad: bool = False) -> torch.Tensor:
    """A meta tensor, made with torch functions off (inside ``activate()`` a factory call
    would otherwise make a remote tensor)."""
    with torch._C.DisableTorchFunction():
        meta = torch.empty(shape, dtype=dtype, device="meta")
        return meta.requires_grad_() if requires_grad else meta


def meta_like(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunction():
        return torch.empty_like(t, device="meta")


def owner_of(meta: torch.Tensor) -> Tensor | None:
    """The live handle whose meta tensor ``meta`` is, if any."""
    ref = meta.__dict__.get("_monarch_handle")
    return ref() if ref is not None else None


def _refuse(obj: Any) -> Any:
    raise TypeError(
        "a monarch.Tensor is a handle to tensors that live on procs and cannot be sent as a "
        "value: fetch it first (monarch.inspect / monarch.fetch_shard), or pass it to "
        "endpoint.rref(...) or a @monarch.remote function, which run where it lives"
    )


register_ext(TENSOR_EXT, Tensor, _refuse, _refuse)
