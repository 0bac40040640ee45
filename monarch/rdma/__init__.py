"""Monarch's RDMA API (``from monarch.rdma import RDMABuffer``).

This module only re-exports; the work lives in the modules beside it:
:mod:`.buffer` (``RDMABuffer``), :mod:`.action` (``RDMAAction``),
:mod:`.transports` (ibverbs, same_host, tcp, and how one is chosen),
:mod:`.bulk` (big messages out of band), :mod:`.errors`.
"""

from monarch.rdma import control as _control  # noqa: F401  (installs the ibverbs exchange)
from monarch.rdma.action import RDMAAction
from monarch.rdma.backend import (
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from monarch.rdma.buffer import RDMABuffer
from monarch.rdma.errors import (
    BufferDroppedError,
    OwnerGoneError,
    RDMAError,
    RDMATimeoutError,
    ReadOnlyBufferError,
    TransportUnavailableError,
)

__all__ = [
    "BufferDroppedError",
    "OwnerGoneError",
    "RDMAAction",
    "RDMABuffer",
    "RDMAError",
    "RDMATimeoutError",
    "ReadOnlyBufferError",
    "TransportUnavailableError",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
