"""SPMDActor: one per proc, it plays the part of a torchrun worker.

Ranks come from the actor's own point in the mesh, as in Monarch 0.7: the
*last* dimension is the per-host one (``gpus``, ``procs``, whatever it is
called), so ``LOCAL_RANK`` is the coordinate along it and
``LOCAL_WORLD_SIZE`` its size; ``RANK`` is the point's rank in the whole
mesh, ``WORLD_SIZE`` the mesh's size, and ``GROUP_RANK`` (the "node rank")
is ``RANK // LOCAL_WORLD_SIZE``. A ``{"hosts": 2, "gpus": 2}`` mesh therefore
gets exactly what ``torchrun --nnodes 2 --nproc-per-node 2`` gives its
workers, and a flat ``{"procs": 4}`` mesh what ``torchrun --nproc-per-node 4``
gives. A mesh with no dimensions (one proc) is a one-worker job.
"""

from __future__ import annotations

import math
import os
import socket

from monarch.actor import Actor, current_rank, current_size, endpoint
from monarch.spmd.script import run_script
from monarch.tools.network import AddrType, find_free_port, get_ipaddr


class SPMDActor(Actor):
    """Sets torch elastic's environment in its proc and runs SPMD scripts there.

    The variables are those torchrun documents for its workers: ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``
    (``"rank"``), ``MASTER_ADDR`` and ``MASTER_PORT``; the same set as
    Monarch 0.7 (no ``TORCHELASTIC_*`` variables: there is no elastic agent).

    Example::

        procs = this_host().spawn_procs(per_host={"gpus": 4})
        spmd = procs.spawn("_SPMDActor", SPMDActor)
        first = dict.fromkeys(procs.extent.labels, 0)
        addr, port = spmd.slice(**first).get_host_port.call_one(None).get()
        spmd.main.call(addr, port, ["train.py", "--lr", "0.1"]).get()
    """

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        labels = point.extent.labels
        self.rank: int = point.rank
        self.world_size: int = math.prod(sizes.values())
        if labels:
            per_host = labels[-1]  # typically "gpus"
            self.local_rank: int = point[per_host]
            self.local_world_size: int = sizes[per_host]
        else:
            self.local_rank, self.local_world_size = 0, 1
        self.nproc_per_node: int = self.local_world_size
        self.group_rank: int = self.rank // self.local_world_size
        self.group_world_size: int = -(-self.world_size // self.local_world_size)

    def _elastic_env(self, master_addr: str, master_port: int) -> dict[str, str]:
        """The variables this rank's worker gets, as strings."""
        return {
            "MASTER_ADDR": str(master_addr),
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "rank",
            "WORLD_SIZE": str(self.world_size),
        }

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        if not isinstance(master_addr, str) or not master_addr:
            raise ValueError(
                f"master_addr must be a non-empty host name or IP, got {master_addr!r}"
            )
        if isinstance(master_port, bool) or not isinstance(master_port, int):
            raise TypeError(f"master_port must be an int, got {master_port!r}")
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {master_port}")
        os.environ.update(self._elastic_env(master_addr, master_port))

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None) -> tuple[str, int]:
        """This host's name (or, given an ``AddrType``, its IP) and a port free here now.

        Called on the first rank to choose the master, as torchrun's rank 0
        hosts the rendezvous store.
        """
        hostname = socket.gethostname()
        port = find_free_port()
        if use_ipaddr is None:
            return hostname, port
        return get_ipaddr(hostname, port, use_ipaddr), port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set the torch elastic variables in this proc's ``os.environ``."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the environment, then run ``script_args`` as torchrun would; ``True`` on success.

        ``script_args`` is ``[path, *args]`` or ``["-m", module, *args]``. A
        path or module that is not there raises ``FileNotFoundError`` /
        ``ModuleNotFoundError`` (no script ran); an empty list ``ValueError``.
        How a failing script is reported: :mod:`monarch.spmd.script`.
        """
        self._setup_env(master_addr, master_port)
        return run_script(script_args)
