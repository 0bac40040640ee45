"""A job made of the hosts of a running torchrun job: Monarch 0.7's ``StoreJob``.

Inside a job torchrun (or any SPMD launcher) already started, every rank calls
:meth:`StoreJob.from_store` with the job's ``torch.distributed`` store. The
first rank of each node (``LOCAL_RANK == 0``) starts one Monarch worker on
its node and writes the worker's address into the store under
``monarch/spmd/workers/<node>``; global rank 0 reads them all and gets a
``StoreJob`` whose ``state()`` attaches to those workers, so rank 0 becomes a
Monarch client over the SPMD job's own machines. Every other rank gets None.

A worker is ``run_worker_loop_forever(address=...)`` in a child process: it
listens on that address, and the client's ``attach_to_workers`` dials it and
hands it the client's broker (:mod:`monarch.hosts.dial_in`, which also says who
may dial). As the agents of a ``ProcessJob``, it is tied to the rank that
started it (``PR_SET_PDEATHSIG``): it ends when that rank ends, however it ends
(so call ``from_store`` from a thread that lives as long as the rank, such as
its main thread).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Protocol

from monarch.actor import attach_to_workers
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.job.job import JobState, JobTrait

log = logging.getLogger(__name__)

WORKER_ADDR_ENV = "MONARCH_STORE_WORKER_ADDR"
"""Where the worker child listens (set by its parent rank)."""
WORKER_NAME_ENV = "MONARCH_STORE_WORKER_NAME"
"""The worker's agent name (``<name>_<node>``)."""
_WORKER = (
    "import os\n"
    "from monarch.actor import run_worker_loop_forever\n"
    f"run_worker_loop_forever(address=os.environ[{WORKER_ADDR_ENV!r}], "
    f"name=os.environ[{WORKER_NAME_ENV!r}])\n"
)
_TRANSPORTS = ("ipc", "tcp")


class StoreLike(Protocol):
    """What of a ``torch.distributed.Store`` is used: ``set`` and a blocking ``get``."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


def worker_key(node: int) -> str:
    """The store key under which node ``node``'s worker address is written."""
    return f"monarch/spmd/workers/{node}"


def _topology(override: int | None, variable: str) -> int:
    if override is not None:
        return override
    value = os.environ.get(variable)
    if value is None:
        raise RuntimeError(
            f"StoreJob.from_store needs {variable} (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE "
            "and LOCAL_WORLD_SIZE) or the matching keyword argument"
        )
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"{variable}={value!r} is not an integer") from None


def _listen_address(transport: str, port: int, name: str) -> str:
    if transport == "ipc":
        # A folder of the user's own (mode 0700) for the socket: no other user can reach it.
        return f"ipc://{tempfile.mkdtemp(prefix='monarch_worker_')}/{name}"
    if port == 0:
        raise ValueError(
            "monarch_port must be a fixed non-zero port with transport='tcp': the address "
            "is written to the store before the worker listens"
        )
    return f"tcp://{socket.getfqdn()}:{port}"


def spawn_worker(address: str, name: str) -> int:
    """Start a worker child listening on ``address``; its pid. It ends when this process does."""
    child = subprocess.Popen(
        [sys.executable, "-c", _WORKER],
        env={**os.environ, WORKER_ADDR_ENV: address, WORKER_NAME_ENV: name},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # its procs' output travels to the client, not here
        start_new_session=True,  # the rank's Ctrl-C is not the worker's
        preexec_fn=functools.partial(child_dies_with_parent, os.getpid()),
    )
    log.info("monarch worker %s started, pid %d, listening on %s", name, child.pid, address)

    def reap() -> None:
        code = child.wait()
        (log.info if code == 0 else log.warning)(
            "monarch worker %s (pid %d, %s) exited with %d", name, child.pid, address, code
        )

    threading.Thread(target=reap, daemon=True, name=f"monarch-worker-{name}").start()
    return child.pid


class StoreJob(JobTrait):
    """The workers of a running SPMD job as one host mesh, named ``name``, of one host per node.

    Made by :meth:`from_store` on global rank 0. The SPMD job owns the
    workers: ``kill()`` leaves them, and they end with their ranks.
    """

    def __init__(self, worker_addrs: list[str], name: str) -> None:
        super().__init__()
        self._worker_addrs = list(worker_addrs)
        self._name = name

    @classmethod
    def from_store(
        cls,
        store: StoreLike,
        *,
        monarch_port: int = 0,
        name: str = "monarch_worker",
        transport: str = "ipc",
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
    ) -> StoreJob | None:
        """Call on every rank: a job on global rank 0, None elsewhere.

        Ranks and sizes default to torchrun's ``RANK``, ``LOCAL_RANK``,
        ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``. ``transport="ipc"`` (a socket
        only this user can open) serves one machine; across machines use
        ``transport="tcp"`` with a fixed ``monarch_port`` (and a broker every
        machine reaches, ``MONARCH_NATS_URL``; ``MONARCH_WORKER_KEY`` lets the
        client dial the other machines' workers).
        """
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {_TRANSPORTS}, got {transport!r}")
        rank = _topology(rank, "RANK")
        local_rank = _topology(local_rank, "LOCAL_RANK")
        world_size = _topology(world_size, "WORLD_SIZE")
        per_node = _topology(local_world_size, "LOCAL_WORLD_SIZE")
        if per_node < 1 or world_size % per_node:
            raise ValueError(
                f"WORLD_SIZE ({world_size}) must be a multiple of LOCAL_WORLD_SIZE ({per_node})"
            )
        node = rank // per_node
        if local_rank == 0:  # this node's first rank starts its worker
            worker = f"{name}_{node}"
            address = _listen_address(transport, monarch_port, worker)
            spawn_worker(address, worker)
            store.set(worker_key(node), address.encode())
        if rank != 0:
            return None
        # Rank 0 waits in store.get until each node's first rank has written its address.
        nodes = world_size // per_node
        return cls([store.get(worker_key(n)).decode() for n in range(nodes)], name)

    def state(self, cached_path: str | None = None) -> JobState:
        """Attach to the workers; nothing is cached (the job is this SPMD run's)."""
        return super().state(cached_path)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise ValueError("a StoreJob runs inside its SPMD job; it takes no client script")

    def _state(self) -> JobState:
        return JobState({self._name: attach_to_workers(workers=self._worker_addrs)})

    def _kill(self) -> None:
        pass  # the workers end with the ranks that started them

    def can_run(self, spec: JobTrait) -> bool:
        return False
