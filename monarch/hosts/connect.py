"""Connecting long-lived tools (host agents, ``monarch ps``/``tail``) to the broker.

Unlike a client, an agent is often started before the broker is up (a
compose file, a cluster booting), so the first connection is retried until
``timeout``; after that nats-py reconnects on its own, forever. A tool that
found its broker by a job's record (:func:`give_up_when`) stops retrying as
soon as the job is known to have ended.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client

from monarch.broker.connections.auth import secure
from monarch.broker.connections.connect import connect_options
from monarch.settings import settings

log = logging.getLogger(__name__)


_gone: Callable[[], bool] | None = None
GONE_CHECK_EVERY = 0.5  # seconds between two looks at whether the target ended


def give_up_when(gone: Callable[[], bool] | None) -> None:
    """From now on in this process, :func:`connect` stops retrying once ``gone()``
    is true (looked at every ``GONE_CHECK_EVERY`` seconds), rather than trying
    for its whole timeout: a command-line tool that found a job by its record
    says "job ended" at once when the job ends while it connects. ``None``: off."""
    global _gone
    _gone = gone


async def _unless_gone(attempt: Any, timeout: float, gone: Callable[[], bool]) -> Client:
    """``attempt`` (a connect), given up after ``timeout`` or once ``gone()``."""
    task = asyncio.ensure_future(attempt)
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while True:
            left = deadline - asyncio.get_running_loop().time()
            done, _ = await asyncio.wait({task}, timeout=max(0.0, min(GONE_CHECK_EVERY, left)))
            if done:
                return task.result()
            if left <= GONE_CHECK_EVERY or gone():
                raise asyncio.TimeoutError
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def server_list(url: str) -> list[str]:
    """``MONARCH_NATS_URL`` may list several servers of a cluster, comma separated."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def connect(url: str, name: str, timeout: float = 60.0, **options: Any) -> Client:
    """A connection to the broker at ``url``; raises ConnectionError after ``timeout`` s."""

    async def quiet(e: Exception) -> None:  # nats-py would print a traceback per attempt
        log.debug("NATS (%s): %r", name, e)

    options.setdefault("error_cb", quiet)
    options = {**connect_options(settings()), **options}  # MONARCH_NATS_TOKEN, creds, TLS
    attempt = nats.connect(
        server_list(url),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        **options,
    )
    try:
        if _gone is None:
            nc = await asyncio.wait_for(attempt, timeout)
        else:
            nc = await _unless_gone(attempt, timeout, _gone)
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
