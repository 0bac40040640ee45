"""Creating streams and buckets on a broker that may be a cluster, and may still be booting.

Two things go wrong with JetStream on a NATS cluster that a single server never
shows (both seen with docker-compose.cluster.yml, issue 35):

* A stream or bucket with one replica lives on one server; when that server
  stops, every request to it times out, so the hosts registry and the
  supervision streams vanish with one node of three. On a cluster they are
  made with one replica per server, up to three (:func:`replicas`).
* Right after the servers start, JetStream has no meta leader yet and a create
  request gets no answer (``TimeoutError``) or "temporarily unavailable", and
  right after a server stops, a stream it led is "offline" until its other
  copies elect a leader; :func:`while_electing` asks again until a bound
  instead of giving up at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, ServiceUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

ELECTION_BOUND = 30.0  # seconds; a cluster elects its JetStream leader in a few



class NotPlacedYet(Exception):
    """A create was refused and the stream or bucket does not exist.

    On a cluster that has just lost servers, the meta leader may still answer
    for a moment before it steps down, refusing to place the copies ("no
    suitable peers", "insufficient resources") instead of saying it is
    unavailable; seen in CI. Asked again like the other not-ready answers.
    """


class StreamOffline(Exception):
    """JetStream said "stream is offline" (error 10118): the stream lost the server that
    led it and has not elected another yet. Seen in CI for the hosts bucket right after
    one node of the compose cluster was stopped (tests/deploy/test_compose_cluster.py);
    it passes once the remaining copies elect a leader."""


OFFLINE = 10118  # JetStream's err_code for "stream is offline"

# What JetStream answers (or fails to) while it has no leader.
NOT_READY = (
    NatsTimeoutError,
    asyncio.TimeoutError,
    NoRespondersError,
    ServiceUnavailableError,
    NotPlacedYet,
    StreamOffline,
)


def replicas(nc: Client) -> int:
    """Copies a stream or bucket keeps: one per server of the cluster ``nc`` is on, at most 3.

    The server's INFO names its cluster and lists the client URLs of the
    servers in it; a lone server lists none, and gets one copy.
    """
    info = getattr(nc, "_server_info", None) or {}
    if not info.get("cluster"):
        return 1
    return max(1, min(3, len(info.get("connect_urls") or ())))


async def while_electing(
    what: str, make: Callable[[], Awaitable[T]], bound: float = ELECTION_BOUND
) -> T:
    """``await make()``, again while JetStream is not ready, for up to ``bound`` seconds.

    Raises the last error after ``bound``, with ``what`` and the likely cause
    in the log, so a broker without JetStream or a cluster without quorum is
    named instead of a bare ``TimeoutError``.
    """
    deadline = time.monotonic() + bound
    delay = 0.2
    while True:
        try:
            try:
                return await make()
            except APIError as e:
                if e.err_code != OFFLINE:
                    raise
                raise StreamOffline(str(e)) from e
        except NOT_READY as e:
            if time.monotonic() + delay > deadline:
                log.warning(
                    "JetStream did not answer to create %s within %.0f s (%r): is JetStream "
                    "enabled (-js), and does the cluster have a quorum of its servers?",
                    what,
                    bound,
                    e,
                )
                raise
            log.debug("JetStream not ready to create %s (%r); asking again", what, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
