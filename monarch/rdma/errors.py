"""The exceptions ``monarch.rdma`` raises, all in one place.

Every transfer failure is an :class:`RDMAError` (or, for a timeout, an
:class:`RDMATimeoutError`, which is also a ``TimeoutError``), and its message
names the buffer and its owner. Bad arguments (an offset out of range, a
tensor of the wrong layout) are ``ValueError``/``TypeError`` raised by the
caller's own call, before any byte moves.
"""

from __future__ import annotations


class RDMAError(Exception):
    """A transfer to or from an :class:`~monarch.rdma.RDMABuffer` failed; nothing was reported done."""


class BufferDroppedError(RDMAError):
    """The buffer was dropped by its owner (or never existed there, or the access key is wrong).

    Also raised for a big message (:mod:`monarch.rdma.bulk`) that was already
    released: all its readers had read it, or its time to live ran out.
    """


class OwnerGoneError(RDMAError):
    """The process that owns the buffer has exited or cannot be reached."""


class ReadOnlyBufferError(RDMAError):
    """A write to a buffer registered over read-only memory (``bytes``, a read-only memoryview)."""


class TransportUnavailableError(RDMAError):
    """``MONARCH_RDMA_TRANSPORT`` forces a transport that cannot reach this buffer; the message says why."""


class RDMATimeoutError(RDMAError, TimeoutError):
    """The transfer did not finish within its timeout; it was abandoned, not reported done."""


class TransportDenied(RDMAError):
    """Internal: a transport cannot serve this peer after all (e.g. ``EPERM``); the next one is tried."""
