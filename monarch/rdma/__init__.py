"""Monarch's RDMA API (``from monarch.rdma import RDMABuffer``).

This module only re-exports; the work lives in the modules beside it:
:mod:`.buffer` (``RDMABuffer``), :mod:`.action` (``RDMAAction``),
:mod:`.transports` (ibverbs, same_host, tcp, and how one is chosen),
:mod:`.bulk` (big messages out of band), :mod:`.errors`.

Layer: above :mod:`monarch.core` and :mod:`monarch.broker`, which is all it
imports; the actor runtime builds on it (big message bodies go out of band here).
"""

from monarch.rdma import control as _control  # noqa: F401  (installs the ibverbs exchange)
from monarch.rdma.action import RDMAAction
from monarch.rdma.backend import (
    get_rdma_backend,
    get_rdma_transport,
    is_ibverbs_available,
    is_rdma_available,
)
from monarch.rdma.buffer import RDMABuffer
from monarch.rdma.errors import (
    BufferDroppedError,
    OwnerGoneError,
    RDMAError,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMATimeoutError,
    RDMAWriteTransferWarning,
    ReadOnlyBufferError,
    TransportUnavailableError,
    UnsupportedMemoryError,
)

__all__ = [
    "BufferDroppedError",
    "OwnerGoneError",
    "RDMAAction",
    "RDMABuffer",
    "RDMAError",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMATimeoutError",
    "RDMAWriteTransferWarning",
    "ReadOnlyBufferError",
    "TransportUnavailableError",
    "UnsupportedMemoryError",
    "get_rdma_backend",
    "get_rdma_transport",
    "is_ibverbs_available",
    "is_rdma_available",
]
