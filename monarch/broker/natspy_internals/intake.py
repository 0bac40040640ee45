"""One ordered intake for all the subscriptions of a connection.

nats-py hands each subscription its own queue and its own task, so messages
that arrive on one socket in order can be handled out of order when they match
different subscriptions (an actor listens on 2^d subjects; docs/design.md,
"Ordering and delivery", reports 30 inversions in 100,000 messages over 4
subscriptions). The server delivers one
publisher's messages to one connection in order, so the fix is to handle each
message synchronously, in wire order, the moment nats-py parses it.

nats-py has no public hook for that, so :func:`subscribe_ordered` swaps the
subscription's pending queue for :class:`_DirectQueue`, whose ``put_nowait``
calls the handler at once. This is the one place the runtime touches nats-py
internals (``Subscription._pending_queue``, ``_pending_size``,
``_pending_bytes_limit``); :func:`subscribe_ordered` checks they exist so an
incompatible nats-py fails loudly at start-up rather than reordering quietly.

It is also where a job with a key (:mod:`monarch.broker.connections.auth`) checks what
comes in: a message without a valid ``Mon-Auth`` tag is dropped (and counted)
before anything else sees it, whether it is a call, a reply, a heartbeat, a
supervision event or a control message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from monarch.broker.bodies import batch
from monarch.broker.connections.auth import MessageAuth, secure
from monarch.broker.natspy_internals import fast_paths
from monarch.broker.settings import settings

log = logging.getLogger(__name__)

Handler = Callable[[Msg], None]


class _DirectQueue:
    """Quacks like the ``asyncio.Queue`` nats-py expects; delivers inline."""

    def __init__(
        self,
        sub: Subscription,
        handler: Handler,
        on_message: Handler | None,
        auth: MessageAuth | None,
    ) -> None:
        self._sub = sub
        self._handler = handler
        self._on_message = on_message
        self._auth = auth

    def put_nowait(self, msg: Msg) -> None:
        # nats-py counted these bytes as pending; they are handled (or dropped) already.
        self._sub._pending_size -= len(msg.data)
        self.deliver(msg)

    def deliver(self, msg: Msg) -> None:
        """Check, then hand ``msg`` to the handler (also called by :mod:`monarch.broker.natspy_internals.fast_delivery`)."""
        if self._auth is not None and not self._auth.accepts(msg):
            return  # counted and warned about by accepts()
        if self._on_message is not None:
            self._on_message(msg)
        try:
            if batch.is_batch(msg) and not msg.reply:  # we never send a batch with a reply
                for one in batch.unpack(msg):
                    self._handler(one)  # type: ignore[arg-type]
            else:
                self._handler(msg)
        except batch.MalformedBatchError as e:
            log.warning("dropping a malformed batch: %s", e)
        except Exception:  # a handler bug must not kill the connection's reader
            log.exception("dropping message on %s: handler failed", msg.subject)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        return None


def use_plain_header_parser() -> None:
    """Make nats-py parse headers into plain strings, as everything here expects.

    When the optional ``fast_mail_parser`` package is installed, nats-py parses
    headers with it and every header value becomes a *list* of strings
    (``{'Mon-Kind': ['call']}``), which no comparison here would match; it is
    also slower than nats-py's own parser (3.2 vs 2.3 us for our three-header
    replies, NOTES 17). So it is switched off for this process, once, with a
    warning that says why.
    """
    import nats.aio.client as nats_client

    if getattr(nats_client, "parse_email", None) is not None:
        log.warning(
            "fast_mail_parser is installed: nats-py would hand header values over as lists; "
            "monarch makes nats-py use its own header parser in this process"
        )
        nats_client.parse_email = None


async def subscribe_ordered(
    nc: Client, subject: str, handler: Handler, on_message: Handler | None = None
) -> Subscription:
    """Subscribe so that ``handler`` runs inline, in wire order, as nats-py parses.

    (That is in the socket's own callback, :mod:`monarch.broker.natspy_internals.direct_read`,
    or where it is off, on nats-py's reader task.)

    ``on_message`` (if given) sees every message first (the runtime's busy poll).

    The handler must be quick and must not block: it routes the message to a
    mailbox and returns. Exceptions it raises are logged and the message is
    dropped; they never reach nats-py.

    When the job has a key, only messages with a valid tag reach ``on_message``
    and ``handler``. ``nc`` is secured here if it was made some other way than
    :func:`monarch.broker.connections.connect.connect` (a host agent's), so that it signs
    its own answers too.
    """
    use_plain_header_parser()
    # Fewer Python steps per message read and sent, the handler reached without a
    # task switch, answers leaving within their publish.
    fast_paths.install(nc)
    auth = secure(nc, settings())  # the connection's own, if connect() secured it already
    sub = await nc.subscribe(subject)
    for attr in ("_pending_queue", "_pending_size", "_pending_bytes_limit"):
        if not hasattr(sub, attr):
            raise RuntimeError(
                f"this nats-py version has no Subscription.{attr}; monarch needs it for "
                "ordered delivery (pin nats-py>=2.9,<3)"
            )
    sub._pending_bytes_limit = 0  # our mailboxes account for memory, not nats-py
    sub._pending_queue = _DirectQueue(sub, handler, on_message, auth)  # type: ignore[assignment]
    return sub
