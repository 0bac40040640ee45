"""What this process can use: Monarch's ``is_rdma_available`` / ``get_rdma_backend``, and ours.

Monarch answers "ibverbs" or "none" and refuses ``RDMABuffer`` without a
device. Here an ``RDMABuffer`` always works (tcp is always there), so
``is_rdma_available()`` is True wherever ``RDMABuffer`` works, and
``is_ibverbs_available()`` tells whether real RDMA hardware is usable.
"""

from __future__ import annotations

from monarch.rdma.transports import best_available
from monarch.rdma.transports.ibverbs import status


def is_rdma_available() -> bool:
    """True: ``RDMABuffer`` works on every host (falling back to same_host copies or tcp)."""
    return True


def is_ibverbs_available() -> bool:
    """Whether pyverbs is importable and an RDMA device is present (False on this build's CI)."""
    return status()[0]


def get_rdma_backend() -> str:
    """The transport this process prefers: ``"ibverbs"``, ``"same_host"`` or ``"tcp"``.

    ``MONARCH_RDMA_TRANSPORT`` forces one. Each buffer may still use another
    (a peer on another host cannot use same_host): ``RDMABuffer.backend`` says
    which one a transfer of that buffer from here would use.
    """
    return best_available()
