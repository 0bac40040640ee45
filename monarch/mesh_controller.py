"""Alias for Monarch's ``monarch.mesh_controller`` (see docs/compatibility.md).

Monarch 0.7's ``spawn_tensor_engine(proc_mesh)`` starts a tensor-engine
controller on the procs and gives back a ``DeviceMesh`` to activate. Ours needs
no separate controller: every proc mesh is already a device mesh
(``with procs.activate():`` runs torch calls on its procs, see
:mod:`monarch.tensors.mode`), so this gives back the proc mesh itself.
"""

from __future__ import annotations

from monarch.actor import ProcMesh

__all__ = ["spawn_tensor_engine"]


def spawn_tensor_engine(proc_mesh: ProcMesh) -> ProcMesh:
    """The device mesh of ``proc_mesh`` for the tensor engine: ``proc_mesh`` itself."""
    if not isinstance(proc_mesh, ProcMesh):
        raise TypeError(f"spawn_tensor_engine takes a ProcMesh, not {type(proc_mesh).__name__}")
    return proc_mesh
