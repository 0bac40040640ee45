"""``monarch.utils``: the helper TorchForge's provisioner imports (``setup_env_for_distributed``).

Monarch shipped this module until 0.3 and then removed it in favour of
:func:`monarch.spmd.setup_torch_elastic_env_async`; TorchForge (written for
torchmonarch 0.1.x) still imports it, so it is kept here as a public
function with Monarch's signature and its deprecation warning.
"""

from __future__ import annotations

import warnings

from monarch.actor import ProcMesh
from monarch.spmd import setup_torch_elastic_env_async
from monarch.tools.network import AddrType

__all__ = ["setup_env_for_distributed"]


async def setup_env_for_distributed(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ... on every proc of the mesh.

    Deprecated: the same as awaiting
    :func:`monarch.spmd.setup_torch_elastic_env_async` (which picks the
    mesh's first proc as master when neither address nor port is given, and
    raises ``ValueError`` when only one of them is).
    """
    warnings.warn(
        "setup_env_for_distributed is deprecated; use monarch.spmd.setup_torch_elastic_env_async",
        DeprecationWarning,
        stacklevel=2,
    )
    await setup_torch_elastic_env_async(proc_mesh, master_addr, master_port, use_ipaddr)
