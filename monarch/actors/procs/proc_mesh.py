"""``ProcMesh``: a mesh of OS processes that host actors.

The owner side of a set of procs: it starts them (through a launcher, see
:mod:`monarch.actors.procs.launcher`), waits until each reports ready, spawns actor
meshes on them, learns at once when one exits (its reaper thread), and stops
them. Every proc mesh is stopped when the client exits, so none outlives it.

A ``ProcMesh`` is also a reference that travels: as an endpoint argument or
return value, alone or inside any picklable value. Where it lands it spawns
actors on the same procs (those actors are owned by whoever spawned them) and
hears of their deaths; only the owner may stop it (see
:mod:`monarch.actors.procs.proc_mesh_ref`). This module is the user API; the
owner's state machine is :mod:`monarch.actors.procs.proc_mesh_state`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from monarch.actors.calls.actor import check_actor_class, class_ref
from monarch.actors.calls.actor_mesh import ActorMesh
from monarch.actors.calls.context import (
    actor_context,
    context,
    sender_id,
    set_proc_mesh_decoder,
    set_this_proc,
)
from monarch.actors.calls.endpoint import endpoints_of
from monarch.actors.calls.mesh_state import MeshState, spawn_error
from monarch.actors.errors import (
    MeshStoppedError,
)
from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.process_state import actor_process
from monarch.actors.procs import mesh_table
from monarch.actors.procs.log_collection import LogMode
from monarch.actors.procs.proc_mesh_ref import (
    _PROC_MESH_EXT,
    ProcMeshRef,
    _encode_proc_mesh,
    _hosts_of,
    _spawn_reference,
    decode_reference,
)
from monarch.actors.procs.proc_mesh_state import LocalProcMeshState, ProcMeshState
from monarch.broker.bodies.codec import PicklingForbiddenError
from monarch.broker.bodies.ext import register_ext
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.rdma.bulk import encode_body

log = logging.getLogger(__name__)
A = TypeVar("A")


def owned_by_caller(mesh: Any) -> None:
    """Inside an actor, what it spawns is stopped before the actor cleans up."""
    ctx = actor_context()
    if ctx is not None:
        owned = ctx.actor_instance.owned
        # forget meshes already stopped, so an actor that respawns does not pile them up
        owned[:] = [o for o in owned if getattr(o, "stopped", None) is None]
        owned.append(mesh)


class ProcMesh(MeshShapeOps):
    """Processes laid out on a mesh; spawn actors on them with :meth:`spawn`."""

    def __init__(self, state: ProcMeshState, view: View) -> None:
        self._state = state
        self._view = view

    def _new_with_view(self, view: View) -> ProcMesh:
        return ProcMesh(self._state, view)

    @property
    def initialized(self) -> Future[bool]:
        """Completes (True) once every proc reported ready; raises if one failed to start."""
        st = self._state

        async def wait() -> bool:
            await asyncio.shield(st.ready)
            return True

        return Future(st.rt.run_coro(wait()))

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Create one ``Class`` actor per proc; returns at once, messages queue until ready.

        ``__init__`` arguments are checked here (``TypeError``); a failing
        ``__init__`` makes calls on the mesh raise :class:`SpawnError`.
        """
        return self._spawn(name, Class, args, kwargs, {})

    def per_proc(self, **dims: int) -> PerProc:
        """Several actors of one mesh in each proc: ``procs.per_proc(workers=4).spawn(...)``.

        Our extension (Monarch 0.7 places one actor per proc per mesh, so N
        actors on P procs are N/P meshes there). The actor mesh has this proc
        mesh's dimensions and then ``dims`` (each a new dimension name and its
        size; the last varies fastest): the actor at rank ``i * k + j`` (``k``
        the product of the sizes) is the ``j``-th of the proc at position ``i``.
        Each is an actor of its own (mailbox, thread or task, supervision,
        failure); a call to the whole mesh is answered by each proc's actors
        in one NATS message where they answer within one turn of its loop
        (async endpoints do; :mod:`monarch.actors.hosting.reply`), so a
        gather's messages grow with procs, not actors (docs/scale.md).
        """
        labels = self._view.extent.labels
        if not dims:
            raise TypeError("per_proc() needs at least one dimension, e.g. per_proc(workers=4)")
        for label, size in dims.items():
            if label in labels:
                raise ValueError(f"per_proc: {label!r} is already a dimension of {self!r}")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"per_proc: {label}={size!r} must be a whole number >= 1")
        return PerProc(self, dict(dims))

    def _spawn(
        self, name: str, Class: type[A], args: tuple, kwargs: dict, dims: dict[str, int]
    ) -> ActorMesh[A]:
        subjects.check_token(name, "actor mesh name")
        cls = check_actor_class(Class)
        clashes = sorted(n for n in endpoints_of(cls) if hasattr(ActorMesh, n))
        if clashes:
            raise ValueError(
                f"{cls.__name__} has endpoint(s) {clashes} named like ActorMesh attributes, so "
                "mesh.<name> could not reach them: rename the endpoint(s)"
            )
        st = self._state
        if st.start_error is not None and st.stopped is None:  # say why, not just "stopped"
            raise spawn_error(name, 0, st.start_error)
        if st.stopping or st.stopped is not None:
            raise MeshStoppedError(f"`ProcMesh` has already been stopped ({st.name!r})")
        import inspect

        try:
            inspect.signature(cls).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{cls.__name__}(): {e}") from None
        except ValueError:
            pass  # no signature available (builtins): let __init__ decide
        view = self._view
        per_proc = math.prod(dims.values()) if dims else 1
        extent = Extent([*view.extent.labels, *dims], [*view.extent.sizes, *dims.values()])
        mesh_uid = subjects.new_uid()
        spec = {
            "name": name,
            "uid": mesh_uid,
            "cls": class_ref(cls),
            "args": list(args),
            "kwargs": kwargs,
            "labels": extent.labels,
            "sizes": extent.sizes,
            "owner": [st.rt.proc_uid, sender_id()],
            # context().actor_instance.proc_mesh in the actors: this mesh, as a reference
            # made now (spawn returns at once; the procs need not be up yet)
            "proc_mesh": _spawn_reference(self),
            # context().actor_instance.creator (and the names in str(instance)): who spawns
            "creator": context().actor_instance.creator_chain(),
        }
        if dims:  # k actors of this mesh per proc, the last len(dims) dimensions
            spec["per_proc"] = [per_proc, len(dims)]
        if not isinstance(spec["cls"], str) and not st.rt.settings.pickle:
            raise PicklingForbiddenError(
                f"actor class {cls.__qualname__} is defined in {cls.__module__} (not importable "
                "by procs), so it would travel by cloudpickle, which MONARCH_PICKLE=0 forbids: "
                "move it to an importable module or set MONARCH_PICKLE=1"
            )
        # big __init__ arguments stay here and travel out of band, once per proc
        body = encode_body(spec, readers=len(self._view))
        if not isinstance(body, bytes):
            body = bytes(body)
        mesh_state = MeshState(st.rt, name, mesh_uid, cls, cls.__name__, extent)
        mesh_state.owner_proc, mesh_state.owner_actor = st.rt.proc_uid, sender_id()
        owned_by_caller(mesh_state)
        proc_ranks = list(view.ranks)
        actor_procs = [pr for pr in proc_ranks for _ in range(per_proc)]  # per actor rank

        def register() -> None:
            st.actor_meshes.append((mesh_state, actor_procs))
            task = st.rt.loop.create_task(st.spawn_actors(mesh_state, proc_ranks, body, per_proc))
            st.spawning[task] = mesh_state
            task.add_done_callback(lambda done: st.spawning.pop(done, None))

        st.rt.call_soon(register)
        return ActorMesh(mesh_state, View.full(extent))

    def sync_workspace(
        self, workspace: Any, conda: bool = False, auto_reload: bool = False
    ) -> None:
        """Not on a proc mesh, as in Monarch 0.7: use ``HostMesh.sync_workspace``."""
        raise NotImplementedError(
            "sync_workspace is not implemented for ProcMesh. Use HostMesh.sync_workspace instead."
        )

    def logging_option(
        self,
        stream_to_client: bool = False,
        aggregate_window_sec: int | None = None,
        level: int = logging.INFO,
    ) -> Future[None]:
        """How the procs' stdout, stderr and log records reach this client (as in Monarch).

        Lines print here prefixed with actor and rank; with a window, identical
        lines from many ranks print once as ``[N similar log lines] text``
        (a window without ``stream_to_client=True`` is a ``RuntimeError``, as in
        Monarch). Records below ``level`` are dropped; ``stream_to_client=False``
        keeps output on each proc's own streams (for procs on this machine, the
        client's terminal). The defaults are Monarch 0.7's; a new proc mesh
        starts streaming to the client, each line as it arrives. Applies to the
        whole proc mesh; blocks until its procs have applied it. See
        :mod:`monarch.actors.procs.log_collection`.
        Returns a done future: Monarch's is a coroutine (``await pm.logging_option(...)``),
        and a script written for it awaits the result.
        """
        st = self._state
        st.logs.set_mode(LogMode(stream_to_client, aggregate_window_sec, level), st.ready)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def activate(self) -> Any:
        """Tensor engine: ``with procs.activate():`` makes torch calls run on these procs.

        Imported lazily so that the actor API does not import torch
        (see :mod:`monarch.tensors.mode`).
        """
        # A door into the tensor engine, a layer above (pyproject's import contract
        # names it): imported when used, so torch stays off the actor API's path.
        from monarch.tensors.mode import activate

        return activate(self)

    def stop(self) -> Future[None]:
        """Stop every actor and process of this mesh; completes when they are gone."""
        st = self._state
        if isinstance(st, ProcMeshRef):  # refused (not owned here); the mesh stays usable
            return Future(st.rt.run_coro(st.stop()))
        if st.stopped is not None:
            return st.stopped
        for hook in st.before_stop:
            hook()
        st.stopped = Future(st.rt.run_coro(st.stop()))
        return st.stopped

    async def __aenter__(self) -> ProcMesh:
        await self.initialized
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop().get()

    def rank_tensor(self, dim: str | Sequence[str]) -> Any:
        """Tensor engine: a distributed scalar (``torch.long``) holding each proc's rank.

        For one dimension, each proc's coordinate along it in this (sliced)
        mesh; for several, the row-major rank over them in the order given.
        Runs on the tensor engine's workers (spawned on first use, as by
        :meth:`activate`). Raises ``KeyError`` for a dimension this mesh lacks.
        """
        dims = [dim] if isinstance(dim, str) else list(dim)
        extent = self._view.extent
        for d in dims:
            if d not in extent.labels:
                raise KeyError(f"{self!r} does not have dimension {d!r}")
        at = [extent.labels.index(d) for d in dims]
        by_base = [0] * self._state.extent.nelements  # the value for each proc, by base rank
        for i, base_rank in enumerate(self._view.ranks):
            coords = extent.coords(i)
            for j in at:
                by_base[base_rank] = by_base[base_rank] * extent.sizes[j] + coords[j]
        # torch only now, through the tensor engine's door (named in pyproject's
        # import contract), kept off the actor API's import path
        import torch

        # A door into the tensor engine (named in pyproject's import contract): imported when used.
        from monarch.tensors.remote import remote

        fn = remote(
            f"{__name__}._rank_on_worker",
            propagate=lambda _table: torch.zeros((), dtype=torch.long),
        )
        with self.activate():
            return fn(by_base)

    def rank_tensors(self) -> dict[str, Any]:
        """Tensor engine: :meth:`rank_tensor` for each dimension of this mesh, by name."""
        return {d: self.rank_tensor(d) for d in self._view.extent.labels}

    def __reduce__(self) -> tuple:
        """Pickle as a reference, so a proc mesh travels inside any picklable value."""
        return (_decode_proc_mesh, (_encode_proc_mesh(self),))

    @property
    def host_mesh(self) -> Any:
        """The host of this proc mesh's one proc, as a ``HostMesh`` (a reference).

        As in Monarch 0.7, only for a proc mesh of one proc (a slice will do);
        a larger one raises ``NotImplementedError``. Spawning procs on it
        starts them on the same machine (through the same host agent).
        """
        if len(self._view) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        st = self._state
        hosts = _hosts_of(st)
        if hosts is None:
            raise NotImplementedError(f"proc mesh {st.name!r} does not know its host mesh")
        return hosts._host_at(self._view.ranks[0] // st.procs_per_host)

    def to_table(self) -> str:
        """A text table of where each proc runs: ``H.gpu[L]``, proc L of host H (Monarch 0.7).

        Built from what this mesh knows (see :mod:`monarch.actors.procs.mesh_table`);
        unlike Monarch's it needs no tensor engine, torch or tabulate.
        """
        return mesh_table.proc_table(
            self._view.extent, self._view.ranks, self._state.procs_per_host
        )

    @classmethod
    def from_host_mesh(
        cls,
        host_mesh: Any,
        hy_proc_mesh: Any = None,
        region: Any = None,
        setup: Callable[[], Any] | None = None,
        _attach_controller_controller: bool = True,
    ) -> ProcMesh:
        """Procs on every host of ``host_mesh``: its ``spawn_procs``, in Monarch 0.7's words.

        In Monarch this wraps a proc mesh its Rust layer already started
        (``hy_proc_mesh``); here there is none to wrap, so ``hy_proc_mesh``
        must be None and the procs are started now. ``region`` gives their
        dimensions (the host mesh's first, as Monarch's region, or only the
        per-host ones); ``setup`` runs on each proc before its first actor
        (``spawn_procs(bootstrap=...)``).
        """
        del _attach_controller_controller  # ours are always the caller's (it owns them)
        if hy_proc_mesh is not None:
            raise NotImplementedError(
                "ProcMesh.from_host_mesh: there is no Rust proc mesh to wrap here; pass "
                "hy_proc_mesh=None and the procs' dimensions as region"
            )
        per_host = mesh_table.per_host_of(host_mesh.extent, region)
        return host_mesh.spawn_procs(per_host=per_host, bootstrap=setup)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._state.name!r} {self._view.extent!r}>"


class PerProc:
    """``ProcMesh.per_proc(...)``: spawns meshes with several actors in each proc."""

    def __init__(self, procs: ProcMesh, dims: dict[str, int]) -> None:
        self._procs = procs
        self._dims = dims

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """As :meth:`ProcMesh.spawn`, with ``k`` actors per proc (see :meth:`ProcMesh.per_proc`)."""
        return self._procs._spawn(name, Class, args, kwargs, self._dims)

    def __repr__(self) -> str:
        return f"<per_proc {self._dims} of {self._procs!r}>"


def this_proc() -> ProcMesh:
    """The calling process as a proc mesh of one: ``this_proc().spawn(...)`` runs actors here."""
    rt = runtime()
    pm = actor_process(rt).this_proc_mesh
    if pm is None:
        holder: list[ProcMesh] = []
        done = threading.Event()

        def make() -> None:
            state = LocalProcMeshState(rt)
            rt.on_close(state.shutdown)
            holder.append(ProcMesh(state, View.full(state.extent)))
            done.set()

        rt.call_soon(make)
        if not rt.on_loop_thread():
            done.wait()
        pm = holder[0]
        actor_process(rt).this_proc_mesh = pm
    return pm


set_this_proc(this_proc)


def _rank_on_worker(by_base: list[int]) -> Any:
    """On each tensor-engine worker (one per proc, spawned on the whole mesh): its value."""
    import torch

    # the worker's own rank in the whole proc mesh (not the message's, which is the slice's)
    return torch.tensor(by_base[context().actor_instance.rank.rank], dtype=torch.long)


def _decode_proc_mesh(fields: list) -> ProcMesh:
    """A proc mesh reference from the wire (see :mod:`monarch.actors.procs.proc_mesh_ref`)."""
    return ProcMesh(*decode_reference(fields))


register_ext(_PROC_MESH_EXT, ProcMesh, _encode_proc_mesh, _decode_proc_mesh)
set_proc_mesh_decoder(_decode_proc_mesh)
