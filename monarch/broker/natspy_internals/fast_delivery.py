"""Delivering the whole messages of a received chunk without nats-py's parser.

:mod:`monarch.broker.natspy_internals.direct_read` hands each chunk the socket receives to
nats-py's parser at once. That parser is general: it copies the chunk into
its buffer, tries regular expressions for each kind of line, cuts the buffer
up (a copy and a shift per piece) and goes through three coroutines per
message (``parse``, ``_process_msg``, ``_process_headers``). Almost every
chunk a proc or a client receives is one or a few small, complete ``MSG`` or
``HMSG`` frames for one of our ordered subscriptions, and for those
:func:`deliver_whole` does the same work in one pass over the bytes: it reads
the control line, slices the headers and the body out of the chunk, parses
the headers with the connection's own header parser and gives nats-py's
``Msg`` to the subscription's ordered intake (:mod:`monarch.broker.natspy_internals.intake`),
counting what nats-py counts (``stats``, ``Subscription._received``).

It stops at the first frame it does not take whole: one cut by the end of
the chunk, a status header (``NATS/1.0 503``: the server's, nats-py gives it
its ``Status`` header), a line that is not ``MSG``/``HMSG`` (``PING``,
``INFO``, ``-ERR``...), a frame for a subscription that is not ours (a
request inbox, JetStream) or one that unsubscribes itself after a count.
Everything from there on goes to nats-py's parser, in order, as before; while
nats-py's parser holds part of a frame, every chunk goes to it.
What comes out is what nats-py's path gives: the same ``Msg`` fields, the
same header dictionary, the same counters (``tests/broker/test_fast_delivery.py``
compares the two, frame by frame, through a real nats-server).
``MONARCH_FAST_DELIVERY=0`` turns it off, and :func:`usable` keeps it off
for a nats-py whose internals differ from what it reads (its parser's
``buf``/``state``, the client's ``_subs``/``msg_class``/``stats``, a
subscription's counters and kind): a missing name would otherwise fail
every chunk, and each failure drops the socket.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.protocol.parser import AWAITING_CONTROL_LINE

_CRLF = b"\r\n"
_HEADER_LINE = b"NATS/1.0\r\n"  # headers with no status: the only ones taken here
_HEADER_LINE_SIZE = len(_HEADER_LINE)


_CLIENT_NAMES = ("_ps", "_subs", "msg_class", "stats", "_parse_header_lines")
_SUBSCRIPTION_NAMES = ("_max_msgs", "_jsi", "_future", "_pending_queue", "_received")


def usable(nc: Client) -> bool:
    """Whether ``nc`` (and nats-py's subscriptions) have every name this module reads."""
    try:
        sub = Subscription(nc, 0)
    except Exception:
        return False
    ps = getattr(nc, "_ps", None)
    return (
        all(hasattr(nc, name) for name in _CLIENT_NAMES)
        and hasattr(ps, "buf")
        and hasattr(ps, "state")
        and all(hasattr(sub, name) for name in _SUBSCRIPTION_NAMES)
    )


def deliver_chunk(nc: Client, data: bytes) -> bytes:
    """Deliver what :func:`deliver_whole` can of a received chunk; what nats-py's parser must see.

    While nats-py's parser holds part of a frame (its buffer, or a control line
    whose body has not come), the whole chunk is its.
    """
    ps = nc._ps
    if ps.buf or ps.state != AWAITING_CONTROL_LINE:
        return data
    taken = deliver_whole(nc, data)
    return data[taken:] if taken else data


def deliver_whole(nc: Client, data: bytes) -> int:
    """Deliver the complete, plain frames at the head of ``data``; how many bytes they took.

    Only for a parser with nothing buffered: ``data`` must start at a frame's
    control line. The rest of ``data`` (from the returned offset) is for
    nats-py's parser.
    """
    pos, end_of_data = 0, len(data)
    subs = nc._subs
    stats = nc.stats
    while pos < end_of_data:
        eol = data.find(_CRLF, pos)
        if eol < 0:
            break
        args = data[pos:eol].split()
        op = args[0] if args else b""
        if op == b"HMSG":
            if len(args) == 6:
                _, subject, sid, reply, header_size, size = args
            elif len(args) == 5:
                _, subject, sid, header_size, size = args
                reply = b""
            else:
                break
        elif op == b"MSG":
            if len(args) == 5:
                _, subject, sid, reply, size = args
            elif len(args) == 4:
                _, subject, sid, size = args
                reply = b""
            else:
                break
            header_size = b"0"
        else:
            break
        if not (sid.isdigit() and header_size.isdigit() and size.isdigit()):
            break  # nats-py's parser says what is wrong with it
        start, header_end = eol + 2, eol + 2 + int(header_size)
        end = eol + 2 + int(size)
        if end + 2 > end_of_data or header_end > end:
            break  # cut by the chunk's end (or nonsense): nats-py's parser waits for the rest
        sub = subs.get(int(sid))
        deliver = _ordered_delivery(sub)
        if deliver is None and sub is not None:
            break  # a request inbox, JetStream, a counted subscription: nats-py's
        headers: Any = None
        if header_end > start:
            if data[start : start + _HEADER_LINE_SIZE] != _HEADER_LINE:
                break  # an inline status: nats-py's parser reads it
            if header_end - start > _HEADER_LINE_SIZE + 2:
                headers = (
                    nc._parse_header_lines(data[start + _HEADER_LINE_SIZE : header_end]) or None
                )
        payload = data[header_end:end]
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(payload)
        pos = end + 2
        if sub is None:
            continue  # unsubscribed meanwhile: dropped, as nats-py drops it
        sub._received += 1
        deliver(
            nc.msg_class(
                subject=subject.decode(),
                reply=reply.decode(),
                data=payload,
                headers=headers,
                _client=nc,
                _sid=int(sid),
            )
        )
    return pos


def _ordered_delivery(sub: Any) -> Any:
    """The ordered intake's ``deliver`` of ``sub``, or None where nats-py must deliver."""
    if sub is None or sub._max_msgs or sub._jsi is not None or sub._future is not None:
        return None
    return getattr(sub._pending_queue, "deliver", None)
