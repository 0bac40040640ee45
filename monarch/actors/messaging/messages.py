"""The actor protocol on the wire: the headers it uses, message kinds and bodies.

Every header is declared in :mod:`monarch.broker.vocabulary.headers`; these are the
actor protocol's (bodies are encoded by :mod:`monarch.broker.bodies.codec`):

========================  ==============================================
``Mon-Kind``              ``call`` (wants replies), ``send`` (no reply),
                          ``reply``, ``error``, ``spawn``, ``stop``,
                          ``ready``, ``ok``, ``sync``; on control subjects
                          also ``probe`` and ``lost``
``Mon-Endpoint``          the endpoint a call or send is for
``Mon-From``              the sender's actor id (``client`` for the root)
``Mon-Seq``               ``<n>@<sender proc uid>``: the n-th send of that
                          process to this subject (a hole is a loss,
                          :mod:`monarch.actors.messaging.lost_sends`)
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
from monarch.broker.bodies.codec import CodecError, dumps, loads
from monarch.broker.vocabulary.headers import (
    ACTOR_RANK,
    ENDPOINT,
    FROM,
    KIND,
    MSG_RANK,
    RANK,
    RANKS,
    REDUCE,
    SEQ,
    WAIT,
)
from monarch.core.runtime import LocalMsg
from monarch.rdma.bulk import decode_body

__all__ = ["ACTOR_RANK", "ENDPOINT", "FROM", "KIND", "MSG_RANK", "RANK", "RANKS", "REDUCE"]
__all__ += ["SEQ", "WAIT"]
__all__ += ["decode_error", "decode_reply", "encode_error"]


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
    # A big reply is a reference: its bytes are fetched here (blocks), unless the
    # gatherer fetched them already (then they are this message's alone).
    return True, decode_body(msg.data, owned=type(msg) is LocalMsg and msg.owned)
