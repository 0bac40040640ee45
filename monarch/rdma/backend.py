"""What this process can use: Monarch's ``get_rdma_backend`` and friends, and our transport.

Monarch's answers, in Monarch's words: ``get_rdma_backend()`` is
``"ibverbs"`` (RDMA hardware), ``"tcp"`` (its fallback) or ``"none"``;
``is_ibverbs_available()`` says whether RDMA hardware is usable;
``is_rdma_available()`` is deprecated and means the same. As in Monarch,
``monarch.configure(rdma_allow_tcp_fallback=False)`` makes a host without
RDMA hardware answer ``"none"``, and ``RDMABuffer()`` raise there.

Here every fallback is ``"tcp"`` to Monarch's API, although the fallback
between processes of one host is a direct memory copy (``same_host``),
faster than TCP; :func:`get_rdma_transport` (and ``RDMABuffer.transport``)
names our transports.
"""

from __future__ import annotations

import warnings

from monarch.rdma.transports import best_available
from monarch.rdma.transports.ibverbs import status
from monarch.settings import Settings


def monarch_name(transport: str) -> str:
    """Monarch's backend name for one of our transports: ``ibverbs`` stays, the rest are ``tcp``."""
    return "ibverbs" if transport == "ibverbs" else "tcp"


def is_ibverbs_available() -> bool:
    """Whether pyverbs is importable and an RDMA device is present (False without RDMA hardware)."""
    return status()[0]


def is_rdma_available() -> bool:
    """Deprecated, as in Monarch: warns (DeprecationWarning) and answers :func:`is_ibverbs_available`.

    ``RDMABuffer`` works whatever this says (falling back to same-host copies
    or tcp); :func:`get_rdma_backend` says how.
    """
    warnings.warn(
        "is_rdma_available is deprecated, as in Monarch: it means is_ibverbs_available(). "
        "Use is_ibverbs_available() or get_rdma_backend() instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """``"ibverbs"``, ``"tcp"`` or ``"none"``: Monarch's name for what this process's transfers use.

    ``"tcp"`` covers every fallback (same-host copies and tcp). ``"none"``
    only when ``MONARCH_RDMA_TRANSPORT=ibverbs`` forces RDMA hardware this
    process does not have (its transfers then fail with
    TransportUnavailableError).
    """
    transport = best_available()
    if transport == "ibverbs" and not is_ibverbs_available():
        return "none"
    if not fallback_allowed():
        return "none"
    return monarch_name(transport)


def fallback_allowed() -> bool:
    """Whether buffers may be made here: RDMA hardware, or the fallback allowed.

    ``monarch.configure(rdma_allow_tcp_fallback=False)`` (``MONARCH_RDMA_ALLOW_TCP_FALLBACK``,
    which procs started afterwards inherit) disallows it, as Monarch's key does.
    """
    return Settings.read("rdma_allow_tcp_fallback") or is_ibverbs_available()


def get_rdma_transport() -> str:
    """Our transport this process prefers: ``"ibverbs"``, ``"same_host"`` or ``"tcp"``.

    ``MONARCH_RDMA_TRANSPORT`` forces one. Each buffer may still use another
    (a peer on another host cannot use same_host): ``RDMABuffer.transport``
    says which one a transfer of that buffer from here would use.
    """
    return best_available()
