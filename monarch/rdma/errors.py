"""The exceptions (and warnings) ``monarch.rdma`` raises, all in one place.

Every transfer failure is an :class:`RDMAError` (or, for a timeout, an
:class:`RDMATimeoutError`, which is also a ``TimeoutError``), and its message
names the buffer and its owner. Bad arguments are raised by the caller's own
call, before any byte moves: a size or offset that does not fit is a
``ValueError`` (as in Monarch), memory that cannot be used (not 1-D, not
contiguous, not a tensor or buffer) an :class:`UnsupportedMemoryError`, which
is a ``ValueError`` as in Monarch and also a ``TypeError``.
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


class UnsupportedMemoryError(ValueError, TypeError):
    """The object is not memory an RDMABuffer can register or a transfer can use; says how to fix it.

    Monarch raises ``ValueError`` for these (a non-contiguous or 2-D tensor, a
    list), so ``except ValueError`` written for Monarch catches it; it is also
    a ``TypeError``, the usual Python error for an argument of the wrong kind.
    """


class RDMAReadTransferWarning(Warning):
    """Monarch's name, kept so code that filters it imports; this implementation does not emit it."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's name, kept so code that filters it imports; this implementation does not emit it."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's name, kept so code that filters it imports; this implementation does not emit it.

    Monarch warns on every host without ibverbs; here the fallback is usually
    a direct same-host copy, not TCP, so there is nothing to warn about.
    """


class TransportDenied(RDMAError):
    """Internal: a transport cannot serve this peer after all (e.g. ``EPERM``); the next one is tried."""
