"""A proc mesh as a reference: its wire format, and its state where it lands.

A ``ProcMesh`` travels as its own msgpack extension type (an endpoint argument
or return value, alone or inside any picklable value). Where it lands it is a
:class:`ProcMeshRef`: it spawns actors on the same procs and hears of their
deaths, but only the owner may stop it. The codec lives here, apart from the
owner's state machine, because it is the one place that knows the format; the
extension is registered by :mod:`monarch.actors.procs.proc_mesh`, which owns
the ``ProcMesh`` class.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from monarch.actors.errors import (
    ProcStartError,
    SupervisionError,
)
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.procs.launcher import ProcHandle
from monarch.actors.procs.proc_mesh_state import LocalProcMeshState, ProcMeshState, _while_spawning
from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime

if TYPE_CHECKING:
    from monarch.actors.procs.proc_mesh import ProcMesh

# This machine as a HostMesh (``this_host()``), handed in by the layer above
# (monarch.actors.procs.host_mesh) when it is imported: ``this_proc().host_mesh``
# of a reference that names none (see ``_hosts_of``).
_this_host: Any = None


def set_this_host(mesh: Any) -> None:
    global _this_host
    _this_host = mesh


class ProcMeshRef(ProcMeshState):
    """A proc mesh known from a reference that travelled here (it is owned elsewhere).

    It spawns actors on the same procs and watches their heartbeats, so calls
    to actors spawned from here fail when a proc is gone; stopping the procs
    is left to the owner.
    """

    def __init__(
        self, rt: Runtime, name: str, uid: str, extent: Extent, proc_uids: list[str]
    ) -> None:
        super().__init__(rt, name, extent, launcher=None)  # type: ignore[arg-type]
        self.uid = uid
        self.procs = [ProcHandle(u, r) for r, u in enumerate(proc_uids)]
        self.launched.set()
        self.settled.set()

    def start_watching(self) -> None:
        """On the loop: watch the procs' heartbeats, and be ready once we hear them (as
        an owner's mesh is, ``start()``): an actor spawned from here may make a proc
        import torch at its first call, and we must hear that announced."""
        self._watching = self.rt.loop.create_task(self._watch_then_ready())

    async def _watch_then_ready(self) -> None:
        try:
            await self._watch()
        finally:
            if not self.ready.done():
                self.ready.set_result(None)

    def _proc_lost(self, handle: ProcHandle, reason: str, why: str) -> None:
        """Calls to actors spawned from here on that proc fail from now on (SupervisionError).

        No failure is reported to their owners: from here an orderly stop by the
        proc mesh's owner and a crash look alike (the heartbeats end), and an
        orderly stop is no failure (as in Monarch). The owner hears of a crash.
        """
        if handle.lost:
            return
        handle.lost = True
        exc = SupervisionError(
            f"proc {handle.uid} (rank {handle.rank} of proc mesh {self.name!r}) is gone: {why}",
            actor_id=handle.uid,
            rank=handle.rank,
        )
        for wait in list(self.control_waits):
            wait.proc_lost(handle.uid, exc)
        for mesh_state, proc_ranks in self.actor_meshes:
            ranks = [i for i, pr in enumerate(proc_ranks) if pr == handle.rank]
            if ranks:
                mesh_state.mark_dead(ranks, _while_spawning(mesh_state, ranks, exc))

    async def stop(
        self, procs: list[ProcHandle] | None = None, spawn_wait: float | None = None
    ) -> None:
        raise ValueError(
            f"proc mesh {self.name!r} is not owned here (it was received as a reference); "
            "it must be stopped by its owner"
        )

    async def shutdown(self) -> None:
        return None  # the owner stops the procs

    async def kill(self) -> None:
        return None


# -- references travel as their own msgpack extension type ------------------------
#
# The ext at top level and inside msgpack containers; ``ProcMesh.__reduce__`` gives
# pickle the same fields (and ``_decode_proc_mesh``) for meshes inside other objects.

_PROC_MESH_EXT = 18
_known: weakref.WeakKeyDictionary[Runtime, weakref.WeakValueDictionary[str, ProcMeshState]]
_known = weakref.WeakKeyDictionary()  # per runtime: proc mesh uid -> its state here
_known_lock = threading.Lock()


def _remember(state: ProcMeshState) -> None:
    with _known_lock:
        _known.setdefault(state.rt, weakref.WeakValueDictionary())[state.uid] = state


def _encode_proc_mesh(mesh: ProcMesh) -> list:
    st, view = mesh._state, mesh._view
    if not st.settled.is_set():
        # Procs still starting: a reference must not reach anyone before they can
        # take spawn requests. Wait (bounded); a failed start travels as its error.
        if st.rt.on_loop_thread():  # an async endpoint: waiting here would stall the loop
            raise RuntimeError(
                f"proc mesh {st.name!r} is still starting: `await procs.initialized` before "
                "sending it from an async endpoint"
            )
        st.settled.wait(st.rt.settings.spawn_timeout)
    _remember(st)
    error = None
    if st.ready.done() and not st.ready.cancelled() and st.ready.exception() is not None:
        error = str(st.ready.exception())
    stopped = st.stopping or st.stopped is not None
    return _fields(st, view, [p.uid for p in st.procs], error, stopped)


def _fields(st: Any, view: View, proc_uids: list[str], error: str | None, stopped: bool) -> list:
    """A proc mesh reference on the wire (what :func:`_decode_proc_mesh` reads)."""
    return [
        st.name,
        st.uid,
        st.extent.labels,
        st.extent.sizes,
        view.extent.labels,
        view.extent.sizes,
        list(view.ranks),
        proc_uids,
        error,
        stopped,
        _hosts_of(st),  # a HostMesh travels as its own reference (or None)
        st.procs_per_host,
    ]


def _hosts_of(st: ProcMeshState) -> Any:
    """The HostMesh that started ``st``'s procs; for this_proc(), this machine."""
    if st.hosts is None and isinstance(st, LocalProcMeshState):
        return _this_host
    return st.hosts


def _spawn_reference(mesh: ProcMesh) -> list:
    """The reference fields of a mesh being spawned on, without waiting for its procs.

    A spawn reaches the procs only once they are all up, so the reference it
    carries describes a started mesh; its proc uids were chosen before launch.
    """
    st, view = mesh._state, mesh._view
    _remember(st)  # an actor in this process gets this very mesh back
    return _fields(st, view, st.proc_uids(), None, False)


def decode_reference(fields: list) -> tuple[ProcMeshState, View]:
    """The state (known here already, or a new :class:`ProcMeshRef`) and view of a reference."""
    name, uid, blabels, bsizes, vlabels, vsizes, ranks, proc_uids, error, stopped = fields[:10]
    hosts, per_host = fields[10:12] if len(fields) >= 12 else (None, 1)
    rt = runtime()
    base = Extent(blabels, bsizes)
    with _known_lock:
        st = _known.get(rt, {}).get(uid)
    if st is None:
        st = ProcMeshRef(rt, name, uid, base, proc_uids)
        st.hosts, st.procs_per_host = hosts, per_host
        st.stopping = bool(stopped)
        if error is not None:
            st.ready.set_exception(ProcStartError(f"proc mesh {name!r} failed to start: {error}"))
            st.ready.exception()  # retrieved: whoever spawns on it raises it
        elif stopped:
            st.ready.set_result(None)
        else:
            rt.call_soon(st.start_watching)
        _remember(st)
    return st, View(Extent(vlabels, vsizes), base, ranks)
