"""The actor protocol on the wire: header names, message kinds and bodies.

Headers carry what a person watching traffic wants to read; bodies are
encoded by :mod:`monarch.broker.codec`.

========================  ==============================================
``Mon-Kind``              ``call`` (wants replies), ``send`` (no reply),
                          ``reply``, ``error``, ``spawn``, ``stop``,
                          ``ready``, ``ok``, ``sync``; on control subjects
                          also ``probe`` and ``lost``
``Mon-Endpoint``          the endpoint a call or send is for
``Mon-From``              the sender's actor id (``client`` for the root)
``Mon-Seq``               ``<n>@<sender proc uid>``: the n-th send of that
                          process to this subject (a hole is a loss,
                          :mod:`monarch.actors.lost_sends`)
``Mon-Sent``              ``<n>@<sender proc uid>`` on a gathered call or a
                          ``sync`` marker: that many sends so far
``Mon-Rank``              the replier's rank in its mesh (replies), or
                          the receiver's rank (spawn)
``Mon-Wait``              ``one`` on a call to a single actor and on its
                          reply: the caller blocks on it, so both sides
                          busy-poll briefly (:mod:`monarch.core.busy_poll`)
========================  ==============================================
"""

from __future__ import annotations

import traceback as tb
from typing import Any

from monarch.actors.errors import ActorError, RemoteException
from monarch.broker.codec import CodecError, dumps, loads
from monarch.core.busy_poll import WAIT_HEADER
from monarch.rdma.bulk import fetch

KIND = "Mon-Kind"
ENDPOINT = "Mon-Endpoint"
FROM = "Mon-From"
SEQ = "Mon-Seq"
RANK = "Mon-Rank"
WAIT = WAIT_HEADER


def encode_error(exc: BaseException) -> bytes:
    """An exception as a reply body: type, message, traceback and, if it pickles, itself."""
    text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        return dumps([type_name, str(exc), text, exc])
    except CodecError:
        return dumps([type_name, str(exc), text, None])


def decode_error(body: bytes, *, actor_id: str, rank: int | None, endpoint: str) -> ActorError:
    """The caller's view of an ``error`` reply."""
    try:
        type_name, message, text, exc = loads(body)
    except CodecError as e:
        exc, text = RemoteException("undecodable error", str(e)), ""
    else:
        if not isinstance(exc, BaseException):
            exc = RemoteException(type_name, message)
    # An ActorError re-raised by a nested call stays whole, inside this call's
    # ActorError (as in Monarch): ``.exception`` is the inner call's error.
    return ActorError(exc, text, actor_id=actor_id, rank=rank, endpoint=endpoint)


def decode_reply(msg: Any) -> tuple[bool, Any]:
    """(ok, value) from a reply message; value is the raw body for errors."""
    headers = msg.headers or {}
    if headers.get(KIND) == "error":
        return False, msg.data
    body = fetch(msg.data)  # a big reply is a reference: fetch its bytes (blocks)
    return True, loads(body, take=body is not msg.data)
