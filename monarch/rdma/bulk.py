"""Big message bodies travel out of band: the hooks the actor runtime calls.

``offload(body)`` on the sender: a body over ``MONARCH_BULK_THRESHOLD``
(default 256 KiB; always when over the broker's ``max_payload``) stays in
this process, registered with the bulk server, and what goes through the
broker is a small body that refers to it. ``fetch(body)`` on the receiver
(or ``await fetch_async(body)`` on an event loop) gives back the original
bytes, copied by the best transport (same_host, tcp, ibverbs), and tells the
owner one reader is done. A body is released after ``readers`` such
acknowledgements, or after ``ttl`` seconds (``MONARCH_BULK_TTL``, default
600), whichever comes first; a reader that comes later gets
:class:`~monarch.rdma.errors.BufferDroppedError`.

The reference is ``dumps(BulkRef(handle))``, a codec ext type of its own
(21), so its first bytes (``92 c7 00 15``: an array of two whose first item
is the empty ext 21) can never start a body the codec makes for anything
else: bodies that are not references pass through ``fetch`` untouched. The
reference is msgpack even when ``MONARCH_WIRE=json`` (``loads`` reads both).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from monarch.broker.bodies import buffers
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.bodies.ext import register_ext
from monarch.core.process_runtime import current_runtime_or_none
from monarch.rdma import config, transfer
from monarch.rdma.handle import BufferHandle
from monarch.rdma.memory import as_memory
from monarch.rdma.owner import local_owner

log = logging.getLogger(__name__)
BULK_EXT = 21
PREFIX = b"\x92\xc7\x00\x15"  # fixarray(2), ext8 of length 0 with code 21: BulkRef's marker


class BulkRef:
    """A body that stayed behind in its sender: where to fetch it."""

    __slots__ = ("handle",)

    def __init__(self, handle: BufferHandle) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"BulkRef({self.handle.describe()})"


register_ext(
    BULK_EXT,
    BulkRef,
    lambda ref: ref.handle.fields(),
    lambda fields: BulkRef(BufferHandle.from_fields(fields)),
)


_threshold_cache: tuple[Any, int] = (object(), 0)


def threshold() -> int:
    """Bodies longer than this go out of band.

    On every message's path: parsed once per value of ``MONARCH_BULK_THRESHOLD``
    (and of the broker's ``max_payload``), not per call.
    """
    global _threshold_cache
    rt = current_runtime_or_none()
    key = (os.environ.get("MONARCH_BULK_THRESHOLD"), rt.max_payload if rt is not None else None)
    if key != _threshold_cache[0]:
        limit = config.bulk_threshold()
        _threshold_cache = (key, min(limit, key[1]) if key[1] is not None else limit)
    return _threshold_cache[1]


ALWAYS_INLINE = 1024  # bodies this small never go out of band, whatever the threshold


def stays_inline(size: int) -> bool:
    """Whether a body of ``size`` bytes travels in its message (:func:`offload` keeps it)."""
    return size <= ALWAYS_INLINE or size <= threshold()


def offload(body: bytes, *, readers: int | None, ttl: float | None = None) -> bytes:
    """``body`` itself if small, else a reference to it (kept here for ``readers`` reads or ``ttl`` s)."""
    if stays_inline(len(body)):
        return body
    ttl = config.bulk_ttl() if ttl is None else ttl
    # Read-only: no peer may write into a body, and a released body's memory is then
    # free at once (writable memory lingers a few seconds, see monarch.rdma.registry).
    memory = as_memory(memoryview(body).toreadonly(), "message body")
    handle = local_owner().register(memory, readers=readers, ttl=ttl)
    return dumps(BulkRef(handle), wire="msgpack")  # the marker is msgpack in every wire mode


def is_reference(body: bytes | bytearray | memoryview) -> bool:
    return body[:4] == PREFIX  # a slice of bytes, bytearray or memoryview compares alike


def fetch(body: bytes, *, timeout: float | None = None) -> bytes | bytearray | memoryview:
    """The original bytes of ``body`` (``body`` itself unless it is a reference). Blocks.

    A fetched body is a bytearray, or a memoryview of anonymous memory when big;
    both are what :func:`~monarch.broker.bodies.codec.loads` takes.

    Raises BufferDroppedError if the body was already released, OwnerGoneError
    if its sender has exited, RDMATimeoutError after ``timeout`` seconds
    (``MONARCH_BULK_TIMEOUT``, default 120).
    """
    if not is_reference(body):
        return body
    ref = loads(body)
    if not isinstance(ref, BulkRef):  # pragma: no cover - the prefix says it is one
        return body
    handle = ref.handle
    deadline = transfer.deadline_in(config.bulk_timeout() if timeout is None else timeout)
    # Anonymous memory, not bytearray(n): the kernel zeroes its pages on first touch, inside
    # the copy's system calls, where the GIL is released; bytearray(n) would memset 1 GiB
    # holding the GIL (and stall the proc's event loop, heartbeats included).
    data = (
        buffers.take(handle.size) if handle.size >= buffers.MIN_POOLED else bytearray(handle.size)
    )
    transfer.read(handle, 0, as_memory(data), deadline)
    try:
        transfer.ack(handle, transfer.deadline_in(5.0))
    except Exception as e:  # the body is here; the owner's time to live frees it anyway
        log.debug("could not acknowledge %s: %s", handle.describe(), e)
    return data


async def fetch_async(
    body: bytes, *, timeout: float | None = None
) -> bytes | bytearray | memoryview:
    """:func:`fetch` for event loops: the copy runs on a worker thread, not on the loop."""
    if not is_reference(body):
        return body
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(transfer.executor(), lambda: fetch(body, timeout=timeout))


# -- the one pair every sender and receiver of a message body uses ------------------


def encode_body(value: Any, *, readers: int | None, ttl: float | None = None) -> bytes:
    """``value`` as a message body: encoded, and kept here for ``readers`` if it is big.

    A big body stays in this process and the message carries a reference to
    it, which each of ``readers`` fetches once (:func:`decode_body`).
    """
    body = offload(dumps(value, big_out=True), readers=readers, ttl=ttl)
    return body if isinstance(body, bytes) else bytes(body)


def decode_body(data: Any, *, owned: bool = False) -> Any:
    """The value of a message body; a reference's bytes are fetched first (blocks).

    ``owned``: ``data`` was fetched already and is this caller's alone (a
    :class:`~monarch.core.runtime.LocalMsg` says so), so tensors in it are used
    in place, not copied.
    """
    if owned:
        return loads(data, take=True)
    body = fetch(data)
    return loads(body, take=body is not data)


async def decode_body_async(data: Any) -> Any:
    """:func:`decode_body` for event loops: a reference's bytes are fetched off the loop."""
    body = await fetch_async(data)
    return loads(body, take=body is not data)
