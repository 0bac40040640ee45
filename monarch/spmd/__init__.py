"""Torchrun-style SPMD scripts on a proc mesh (``from monarch.spmd import SPMDActor``).

As in Monarch 0.7, this module only re-exports: :class:`SPMDActor` sets the
torch elastic environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...) in
each proc of a mesh and runs a training script there the way ``torchrun``
would; :func:`setup_torch_elastic_env` (and its ``_async`` twin) spawns it and
sets the environment, for controllers that call ``torch.distributed`` from
their own actors. The work lives in :mod:`monarch.spmd.actor`,
:mod:`monarch.spmd.script` and :mod:`monarch.spmd.elastic_env`.
"""

from monarch.spmd.actor import SPMDActor
from monarch.spmd.elastic_env import setup_torch_elastic_env, setup_torch_elastic_env_async

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
