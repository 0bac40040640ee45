"""Connecting long-lived tools (host agents, ``monarch ps``/``tail``) to the broker.

Unlike a client, an agent is often started before the broker is up (a
compose file, a cluster booting), so the first connection is retried until
``timeout``; after that nats-py reconnects on its own, forever.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import nats
from nats.aio.client import Client

from monarch.broker.connections.auth import secure
from monarch.broker.connections.connect import connect_options
from monarch.settings import settings

log = logging.getLogger(__name__)


def server_list(url: str) -> list[str]:
    """``MONARCH_NATS_URL`` may list several servers of a cluster, comma separated."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def connect(url: str, name: str, timeout: float = 60.0, **options: Any) -> Client:
    """A connection to the broker at ``url``; raises ConnectionError after ``timeout`` s."""

    async def quiet(e: Exception) -> None:  # nats-py would print a traceback per attempt
        log.debug("NATS (%s): %r", name, e)

    options.setdefault("error_cb", quiet)
    options = {**connect_options(settings()), **options}  # MONARCH_NATS_TOKEN, creds, TLS
    try:
        nc = await asyncio.wait_for(
            nats.connect(
                server_list(url),
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                connect_timeout=2,
                **options,
            ),
            timeout,
        )
    except (asyncio.TimeoutError, OSError, nats.errors.Error) as e:
        raise ConnectionError(
            f"cannot reach the NATS broker at {url} (tried for {timeout:.0f} s): "
            "is it running, and is MONARCH_NATS_URL (or --nats-url) right?"
        ) from e
    secure(nc, settings())  # with a job key: sign what we publish (monarch.broker.connections.auth)
    return nc


def connected_url(nc: Client) -> str:
    """The server this connection is on, as a URL a process on this machine can use."""
    u = nc.connected_url
    if u is None:
        raise ConnectionError("not connected")
    return f"{u.scheme}://{u.netloc}"


def local_address(nc: Client) -> str:
    """The IP this machine uses to reach the connected server (its address on that network).

    Asks the kernel which source address a packet to the server would leave
    from (a UDP ``connect`` sends nothing).
    """
    u = nc.connected_url
    host, port = (u.hostname or "127.0.0.1"), (u.port or 4222)
    family, _, _, _, addr = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]
