"""Running user code where tensors live: ``@monarch.remote`` and ``endpoint.rref(...)``.

``@monarch.remote`` turns a function into one that runs on every proc of a
mesh, on the procs' local tensors, and returns handles to what it returned
(the handles carry no client-side autograd history).
The client must know the results' shapes and dtypes without running it on
data; in order of preference:

* ``propagate=fn``: ``fn`` gets meta tensors and returns meta tensors shaped
  like the real results (``propagate=lambda x: x`` for "same as the input");
* no ``propagate``: a *trial run* of the function itself here on meta tensors
  (factories inside make meta tensors). Functions with side effects outside
  torch (prints, files, seeding) should pass ``propagate`` instead;
* when the trial raises, or with ``propagate="inspect"`` or a function given
  by its import path (``remote("mypkg.mod.fn")``), one round trip: the first
  proc runs it and answers the results' shapes and dtypes.

Procs check their results against what the client expects; a mismatch
poisons the results with an error that says so.

``endpoint.rref(*args)`` (on an actor mesh spawned on the same procs) does
the same for an actor endpoint: each proc's worker calls its own actor, in
that actor's turn, and keeps the result. The endpoint's ``propagate`` is used
if it has one, otherwise one round trip.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from monarch.actors.meshes.mesh_ops import state_of, view_of
from monarch.tensors import config, tree
from monarch.tensors.controller import Controller, controller_for
from monarch.tensors.dispatch import Walk
from monarch.tensors.errors import RemoteTensorError
from monarch.tensors.mode import active_mesh, meta_trial
from monarch.tensors.tensor import Tensor, meta_empty, meta_like
from monarch.tensors.wire import func_spec

R = TypeVar("R")


class Remote(Generic[R]):
    """A function that runs on the procs of a mesh; call it like the function itself."""

    def __init__(self, impl: Callable[..., R] | str, propagate: Callable[..., Any] | str | None):
        if not callable(impl) and not isinstance(impl, str):
            raise TypeError(f"remote() takes a function or its import path, not {impl!r}")
        self._impl = impl
        self._propagate = propagate
        if callable(impl):
            functools.update_wrapper(self, impl)  # type: ignore[arg-type]

    @property
    def _monarch_remote_impl(self) -> Callable[..., R] | str:
        """What procs run (they resolve the wrapper by its import path, then unwrap it)."""
        return self._impl

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.rref(*args, **kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> R:
        """Run on every proc of the arguments' mesh (or the active mesh); handles to the results."""
        w = Walk()
        margs, wargs = w(args)
        mkwargs, wkwargs = w(kwargs)
        mesh = _mesh_of(w)
        ctl = controller_for(mesh)
        ctl.check_alive()
        fid = ctl.func_id(self)
        grad = torch.is_grad_enabled()

        def entry(results: Any, expect: Any) -> tuple:
            return ("op", fid, wargs, wkwargs, results, grad, expect)

        prop = self._propagate
        name = func_spec(self)[2]
        margs, mkwargs = _fresh(margs), _fresh(mkwargs)  # user code must not touch the handles'
        if callable(prop):
            with meta_trial():
                out = prop(*margs, **mkwargs)
            return _send(ctl, mesh, out, entry, w)
        if prop is None and callable(self._impl):
            try:
                with meta_trial():
                    out = self._impl(*margs, **mkwargs)
            except Exception:
                return _round_trip(ctl, mesh, entry, name)
            return _send(ctl, mesh, out, entry, w)
        return _round_trip(ctl, mesh, entry, name)

    def __repr__(self) -> str:
        return f"<monarch.remote {getattr(self._impl, '__qualname__', self._impl)}>"


def remote(function: Any = None, *, propagate: Any = None) -> Any:
    """``@remote`` / ``@remote(propagate=...)`` / ``remote("pkg.mod.fn", propagate=...)``."""
    if function is None:
        return functools.partial(remote, propagate=propagate)
    return Remote(function, propagate)


def _fresh(obj: Any) -> Any:
    """Copies of the meta tensors in ``obj`` (same metadata) for a propagate or trial run."""
    leaves, spec = tree.flatten(obj)
    out = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            copy = meta_like(v)
            v = copy.requires_grad_() if v.requires_grad and copy.is_floating_point() else copy
        out.append(v)
    return tree.unflatten(out, spec)


def _mesh_of(w: Walk) -> Any:
    mesh = w.mesh if w.mesh is not None else active_mesh()
    if mesh is None:
        raise ValueError(
            "a remote call needs a proc mesh: call it inside `with procs.activate():` or pass "
            "monarch.Tensors"
        )
    return mesh


def _send(ctl: Controller, mesh: Any, out: Any, entry: Callable[[Any, Any], tuple], w: Walk) -> Any:
    """Results described by ``out`` (meta tensors): new handles, and the op that fills them."""
    leaves, spec = tree.flatten(out)
    metas = [(i, meta_like(v)) for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    refs = [ctl.new_ref() for _ in metas]
    expect = [[list(m.shape), str(m.dtype)] for _, m in metas]
    device = w.handles[0]._device if w.handles else torch.device("cpu")
    ctl.send(view_of(mesh), entry(refs, expect))
    for (i, meta), ref in zip(metas, refs):
        leaves[i] = Tensor(meta, mesh, ctl, ref, device)
    return tree.unflatten(leaves, spec)


def _round_trip(ctl: Controller, mesh: Any, entry: Callable[[Any, Any], tuple], name: str) -> Any:
    """Run it, keep the whole result under one ref, ask the first proc what it is, unpack."""
    whole = ctl.new_ref()
    view = view_of(mesh)
    ctl.send(view, entry(whole, None))
    reply = ctl.call(view.ranks[0], "describe", whole).get(config.timeout())
    if reply[0] == "err":
        ctl.send(view, ("del", [whole]))
        message, op, rank, tb = reply[1]
        raise RemoteTensorError(message, op=op, rank=rank, traceback=tb)
    _, descs, spec = reply
    leaves: list[Any] = []
    refs: list[int] = []
    expect = []
    for d in descs:
        if d[0] != "T":
            leaves.append(d[1])
            continue
        _, shape, dtype, requires_grad, device = d
        dt = getattr(torch, dtype.removeprefix("torch."))
        meta = meta_empty(shape, dt, requires_grad and (dt.is_floating_point or dt.is_complex))
        ref = ctl.new_ref()
        refs.append(ref)
        expect.append([shape, dtype])
        leaves.append(Tensor(meta, mesh, ctl, ref, torch.device(device)))
    ctl.send(view, ("unpack", whole, refs, expect, name))
    return tree.unflatten(leaves, spec)


# -- actor endpoints ------------------------------------------------------------------


def actor_rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """``endpoint.rref(*args, **kwargs)``: see the module docstring."""
    prop = endpoint._prop
    if prop.explicit_response_port:
        raise ValueError(f"{endpoint.qualname} answers through a port and cannot be rref'd")
    endpoint._check(args, kwargs)
    w = Walk()
    margs, wargs = w(args)
    mkwargs, wkwargs = w(kwargs)
    mesh = _mesh_of(w)
    ctl = controller_for(mesh)
    ctl.check_alive()
    _check_colocated(ctl, endpoint, mesh)
    uid = state_of(endpoint.mesh).uid
    grad = torch.is_grad_enabled()

    name = f"{endpoint.qualname}.rref"

    def entry(results: Any, expect: Any) -> tuple:
        return ("actor", uid, prop.name, name, wargs, wkwargs, results, grad, expect)

    if callable(prop.propagate):
        with meta_trial():
            out = prop.propagate(*_fresh(margs), **_fresh(mkwargs))
        return _send(ctl, mesh, out, entry, w)
    return _round_trip(ctl, mesh, entry, name)


def _check_colocated(ctl: Controller, endpoint: Any, mesh: Any) -> None:
    """Every proc of ``mesh`` must host an actor of the endpoint's mesh."""
    st = state_of(endpoint.mesh)

    def hosted() -> list[int] | None:
        for mesh_state, proc_ranks in list(ctl.state.actor_meshes):
            if mesh_state is st:
                return proc_ranks
        return None

    proc_ranks = hosted()
    if proc_ranks is None:  # spawn() registers on the loop: let it catch up once
        done = threading.Event()
        ctl.rt.call_soon(done.set)
        done.wait(config.timeout())
        proc_ranks = hosted()
    if proc_ranks is None:
        raise ValueError(
            f"actor mesh {st.name!r} was not spawned on the procs of {mesh!r}: rref() runs the "
            "endpoint where the tensors live, so spawn the actors there (procs.spawn(...))"
        )
    covered = {proc_ranks[r] for r in view_of(endpoint.mesh).ranks}
    missing = sorted(set(view_of(mesh).ranks) - covered)
    if missing:
        raise ValueError(f"no actor of {st.name!r} on proc rank(s) {missing} of {mesh!r}")
