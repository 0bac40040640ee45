"""Several small messages to one subject, carried by one NATS message.

Why: for small messages nats-py's Python parser is most of a receiver's work
(the protocol line and each header parsed in Python: ~45% of a proc's time
under a flood of sends, NOTES 17), and building each header block is a
quarter of the sender's. A run of fire-and-forget messages to the same
subject therefore leaves as one message: headers ``Mon-Kind: batch`` and
``Mon-Count: N``, body a msgpack array of ``[headers, payload]`` pairs in
send order. ``monarch tail`` and any NATS client still see the subject and
the count; :func:`unpack` gives the messages back.

Only messages without a reply subject are batched (a call keeps its own
reply subject, so the broker can still answer "no responders" for it), and a
batch never crosses a message to another subject, so the order of
everything a process publishes is unchanged.
"""

from __future__ import annotations

from typing import Any

import msgpack

from monarch.broker.vocabulary import headers as hdr

KIND_HEADER = hdr.KIND
COUNT_HEADER = hdr.COUNT
BATCH = "batch"
ITEM_MAX_BYTES = 16 * 1024  # bigger messages travel alone
BATCH_MAX_BYTES = 256 * 1024


class MalformedBatchError(ValueError):
    """A message marked as a batch whose body is not one."""


class BatchedMsg:
    """One message taken out of a batch; quacks like nats-py's ``Msg`` for our handlers."""

    # _mon_delivered: when the actor's intake took it, set only while someone records
    # calls (monarch.actors.calls.activity); a batched send gets a deliver span too.
    # _mon_share: as LocalMsg's (monarch.core.runtime).
    __slots__ = ("subject", "data", "reply", "headers", "_mon_delivered", "_mon_share")

    def __init__(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        self.subject = subject
        self.data = data
        self.reply = ""
        self.headers = headers


def headers(count: int) -> dict[str, str]:
    return {KIND_HEADER: BATCH, COUNT_HEADER: str(count)}


def is_batch(msg: Any) -> bool:
    h = msg.headers
    return bool(h) and h.get(KIND_HEADER) == BATCH


def pack(items: list[tuple[dict[str, str], Any]]) -> bytes:
    """The body of a batch of ``(headers, payload)`` pairs."""
    return msgpack.packb(items, use_bin_type=True)


def unpack(msg: Any) -> list[BatchedMsg]:
    """The messages inside batch ``msg``; MalformedBatchError if its body is not a batch."""
    try:
        items = msgpack.unpackb(msg.data, use_list=False, raw=False)
    except Exception as e:
        raise MalformedBatchError(f"batch on {msg.subject} is not msgpack: {e}") from None
    count = msg.headers.get(COUNT_HEADER)
    if not isinstance(items, tuple) or count != str(len(items)):
        raise MalformedBatchError(
            f"batch on {msg.subject} announces {count!r} messages but its body is not that many"
        )
    out = []
    for item in items:
        # Header values are not checked one by one: handlers compare them with strings.
        if type(item) is not tuple or len(item) != 2:
            raise MalformedBatchError(f"batch on {msg.subject} holds a malformed message")
        h, data = item
        if type(h) is not dict or type(data) is not bytes:
            raise MalformedBatchError(f"batch on {msg.subject} holds a malformed message")
        out.append(BatchedMsg(msg.subject, data, h))
    return out
