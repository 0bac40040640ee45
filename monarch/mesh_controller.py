"""Alias for Monarch's ``monarch.mesh_controller`` (see docs/compatibility.md).

Monarch 0.7's ``spawn_tensor_engine(proc_mesh)`` starts a tensor-engine
controller on the procs and gives back a ``DeviceMesh`` to activate, which
``exit()`` ends. Ours needs no separate controller process: every proc mesh is
already a device mesh (``with procs.activate():`` runs torch calls on its
procs, see :mod:`monarch.tensors.mode`), its engine started on first use. So
the ``DeviceMesh`` here is a view of the same procs whose ``exit()`` ends that
engine (its workers and their ``torch.distributed`` world) and keeps the procs,
so the same procs may start another.
"""

from __future__ import annotations

from typing import Any

from monarch.actor import ProcMesh
from monarch.tensors import config
from monarch.tensors.controller import end_engine

__all__ = ["DeviceMesh", "spawn_tensor_engine"]


class DeviceMesh(ProcMesh):
    """The procs of a proc mesh as the tensor engine's device mesh (Monarch's ``DeviceMesh``)."""

    _exited = False

    def activate(self) -> Any:
        """``with dm.activate():`` runs torch calls on these procs (until :meth:`exit`)."""
        if self._exited:
            raise RuntimeError("this DeviceMesh has exited: spawn_tensor_engine(procs) again")
        return super().activate()

    def exit(self, destroy_pg: bool = True, error: BaseException | None = None) -> None:
        """End the tensor engine on these procs; the procs keep running.

        Ops already issued are sent first; then the engine's workers stop, each
        leaving its ``torch.distributed`` world (``destroy_pg``: Monarch's
        argument, always done here). ``error`` is accepted as in Monarch and
        not sent anywhere: the procs are not failed by it. Calling it again
        does nothing.
        """
        del destroy_pg, error
        if self._exited:
            return
        self._exited = True
        end_engine(self, config.timeout())


def spawn_tensor_engine(proc_mesh: ProcMesh) -> DeviceMesh:
    """The device mesh of ``proc_mesh`` for the tensor engine (the same procs)."""
    if not isinstance(proc_mesh, ProcMesh):
        raise TypeError(f"spawn_tensor_engine takes a ProcMesh, not {type(proc_mesh).__name__}")
    return DeviceMesh(proc_mesh._state, proc_mesh._view)
