"""``HostMesh`` and ``this_host()``: where procs are started.

``this_host()`` is the machine the calling code runs on, as a mesh with an
empty extent, so ``this_host().spawn_procs(per_host={"gpus": 4})`` gives a
proc mesh of extent ``{'gpus': 4}``. On one machine with no host agent the
client starts the procs itself as child processes. A host mesh of registered
host agents (``attach_to_workers``, :mod:`monarch.hosts.attach`) has extent
``{'hosts': H}`` and starts its procs through those agents.
"""

from __future__ import annotations

import math
from typing import Any

from monarch.actors.future import Future
from monarch.actors.launcher import LocalLauncher
from monarch.actors.mesh_ops import MeshShapeOps
from monarch.actors.proc_mesh import ProcMesh, ProcMeshState
from monarch.actors.runtime import runtime
from monarch.actors.shape import Extent, View
from monarch.broker import subjects


class HostMesh(MeshShapeOps):
    """A mesh of machines that can run procs."""

    def __init__(self, view: View, hosts: list[Any] | None = None) -> None:
        self._view = view
        self._hosts = hosts  # host agents (HostInfo) by base rank; None: this machine

    def _new_with_view(self, view: View) -> HostMesh:
        return HostMesh(view, self._hosts)

    @property
    def hosts(self) -> list[Any]:
        """The host agents of this (sliced) mesh, in rank order; empty for ``this_host()``."""
        return [self._hosts[r] for r in self._view.ranks] if self._hosts is not None else []

    @property
    def initialized(self) -> Future[bool]:
        """Done at once: the hosts were found before this mesh was made."""
        fut: Future[bool] = Future()
        fut._set_result(True)
        return fut

    def spawn_procs(
        self, per_host: dict[str, int] | None = None, name: str = "procs", **_: Any
    ) -> ProcMesh:
        """Start ``prod(per_host)`` procs on each host; returns at once.

        The proc mesh's extent is the host mesh's followed by ``per_host``.
        Use ``.initialized`` (or simply spawn actors and call them) to wait
        until they are up; a proc that fails to start makes those raise
        :class:`~monarch.actors.errors.ProcStartError`.
        """
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise TypeError(f"per_host[{label!r}] must be an int, got {size!r}")
        subjects.check_token(name, "proc mesh name")
        host_extent = self._view.extent
        extent = Extent(
            host_extent.labels + list(per_host), host_extent.sizes + list(per_host.values())
        )
        rt = runtime()
        if self._hosts is None:
            launcher: Any = LocalLauncher(rt.loop)
        else:
            from monarch.hosts.launcher import AgentLauncher

            launcher = AgentLauncher(rt, self.hosts, math.prod(per_host.values()))
        state = ProcMeshState(rt, name, extent, launcher)
        rt.on_close(state.shutdown)
        rt.run_coro(_start_quietly(state))
        from monarch.actors.proc_mesh import _owned_by_caller

        _owned_by_caller(state)
        return ProcMesh(state, View.full(extent))

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def __repr__(self) -> str:
        names = f" on {', '.join(h.name for h in self.hosts)}" if self._hosts is not None else ""
        return f"<HostMesh {self._view.extent!r}{names}>"


async def _start_quietly(state: ProcMeshState) -> None:
    try:
        await state.start()
    except BaseException:
        pass  # kept in state.ready; raised to whoever uses the mesh


_THIS_HOST = HostMesh(View.full(Extent([], [])))


def this_host() -> HostMesh:
    """The host the calling code runs on."""
    return _THIS_HOST
