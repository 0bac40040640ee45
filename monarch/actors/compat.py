"""Monarch names that exist for source compatibility, each saying what it does here.

Some are thin spellings of features we have (``local_proc_mesh``,
``proc_mesh``); the rest belong to features this build does not have yet and raise
``NotImplementedError`` with a sentence saying so, never a silent dummy.
"""

from __future__ import annotations

import enum
from typing import Any, NoReturn

from monarch.actors.procs.host_mesh import this_host
from monarch.actors.procs.proc_mesh import ProcMesh


def local_proc_mesh(*, gpus: int | None = None, hosts: int = 1, **_: Any) -> ProcMesh:
    """Older Monarch spelling of ``this_host().spawn_procs(per_host={"gpus": gpus})``."""
    return proc_mesh(gpus=gpus, hosts=hosts)


def proc_mesh(*, gpus: int | None = None, hosts: int = 1, **_: Any) -> ProcMesh:
    """Older Monarch spelling: ``hosts`` x ``gpus`` procs on this machine."""
    per_host = {"gpus": gpus if gpus is not None else 1}
    if hosts != 1:
        per_host = {"hosts": hosts, **per_host}
    return this_host().spawn_procs(per_host=per_host)


def _missing(what: str, why: str) -> NoReturn:
    raise NotImplementedError(f"{what} is not available in monarch over NATS yet: {why}")


def sim_proc_mesh(*args: Any, **kwargs: Any) -> NoReturn:
    _missing("sim_proc_mesh", "there is no simulator backend; use this_host().spawn_procs()")


def debug_controller(*args: Any, **kwargs: Any) -> NoReturn:
    _missing(
        "debug_controller",
        "the debugger has no controller actor here: breakpoint() in an endpoint pauses that "
        "actor, and `monarch debug` attaches to it (docs/debugging.md)",
    )


class ChannelTransport(enum.Enum):
    """Monarch's wire transports. Here every message goes through NATS, whatever is chosen."""

    Unix = "unix"
    Local = "local"
    TcpWithLocalhost = "tcp_localhost"
    TcpWithHostname = "tcp_hostname"
    Tls = "tls"
    MetaTlsWithHostname = "metatls_hostname"
    MetaTlsWithIpV6 = "metatls_ipv6"


def gpu_direct_rdma_supported() -> bool:
    """False: GPUDirect RDMA has not been built or verified on hardware here."""
    return False
