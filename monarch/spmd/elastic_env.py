"""Setting torch elastic's environment across a proc mesh, for controllers that drive
``torch.distributed`` from their own actors rather than from a script.
"""

from __future__ import annotations

from monarch.actor import ActorMesh, ProcMesh
from monarch.spmd.actor import SPMDActor
from monarch.tools.network import AddrType

SPMD_MESH_NAME = "_SPMDActor"
"""The actor mesh name Monarch 0.7 gives the SPMDActor these functions spawn."""


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "Either both master_addr and master_port must be specified or neither must be "
            f"specified (got master_addr={master_addr!r}, master_port={master_port!r})"
        )


def _first(proc_mesh: ProcMesh) -> dict[str, int]:
    """The selector of the mesh's first proc (every coordinate 0): the master."""
    return dict.fromkeys(proc_mesh.extent.labels, 0)


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Spawn an :class:`SPMDActor` on every proc and set ``RANK``, ``WORLD_SIZE``, ... there.

    Without ``master_addr``/``master_port`` the first proc's host and a free
    port on it become the master (its host name, or its IP of the family
    ``use_ipaddr`` names). Blocks until every proc has its environment; after
    that, actors spawned on ``proc_mesh`` can call
    ``torch.distributed.init_process_group()`` with no arguments. Raises
    ``ValueError`` when only one of ``master_addr``/``master_port`` is given.
    """
    actors, master_addr, master_port = spawn_with_master(
        proc_mesh, master_addr, master_port, use_ipaddr
    )
    actors.setup_env.call(master_addr, master_port).get()


def spawn_with_master(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> tuple[ActorMesh[SPMDActor], str, int]:
    """An :class:`SPMDActor` on every proc, and the master: the one given, or else the
    first proc's host (name, or IP of ``use_ipaddr``'s family) and a free port there."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn(SPMD_MESH_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = (
            actors.slice(**_first(proc_mesh)).get_host_port.call_one(use_ipaddr).get()
        )
    return actors, master_addr, master_port  # type: ignore[return-value]


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for async code: awaits instead of blocking."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn(SPMD_MESH_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = await actors.slice(**_first(proc_mesh)).get_host_port.call_one(
            use_ipaddr
        )
    await actors.setup_env.call(master_addr, master_port)
