"""Connecting to the broker with the configured credentials, and saying clearly why not.

Credentials come from the ``MONARCH_NATS_*`` settings (token, user and
password, a ``.creds`` file, TLS files) or from the URL itself
(``nats://TOKEN@host:port``, which is how the embedded broker's generated
token reaches the procs a client starts). A refused or unreachable broker
raises :class:`BrokerConnectionError` naming the URL (without secrets) and
what to check.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats
from nats.aio.client import Client

from monarch.broker import natspy_internals
from monarch.broker.connections.auth import secure
from monarch.broker.settings import BrokerSettings


class BrokerConnectionError(ConnectionError):
    """The broker refused us or could not be reached."""


def redact(url: str) -> str:
    """``url`` with any credentials replaced by ``***`` (safe to print)."""
    out = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        if parts.username or parts.password:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            parts = parts._replace(netloc=f"***@{host}")
        out.append(urlunsplit(parts))
    return ",".join(out)


def check_creds_file(path: str) -> None:
    """Fail before connecting when ``MONARCH_NATS_CREDS`` cannot work.

    nats-py reads the file only while signing the server's nonce, deep inside its
    connect loop, where a missing file or a missing ``nkeys`` package surfaces as
    an unrelated-looking error or a generic "no servers available".
    """
    try:
        import nkeys  # noqa: F401  (nats-py signs the nonce with it)
    except ImportError as e:
        raise BrokerConnectionError(
            "MONARCH_NATS_CREDS needs the nkeys package: pip install nkeys"
        ) from e
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise BrokerConnectionError(
            f"MONARCH_NATS_CREDS={path!r} cannot be read: {e.strerror}"
        ) from e
    for section in (b"BEGIN NATS USER JWT", b"BEGIN USER NKEY SEED"):
        if section not in text:
            raise BrokerConnectionError(
                f"MONARCH_NATS_CREDS={path!r} is not a NATS credentials file "
                f"(no '{section.decode()}' section; make one with `nsc generate creds`)"
            )


def connect_options(cfg: BrokerSettings) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if cfg.nats_token:
        opts["token"] = cfg.nats_token
    if cfg.nats_user:
        opts["user"] = cfg.nats_user
        opts["password"] = cfg.nats_password or ""
    if cfg.nats_creds:
        check_creds_file(cfg.nats_creds)
        opts["user_credentials"] = cfg.nats_creds
    if cfg.nats_tls_ca or cfg.nats_tls_cert:
        ctx = ssl.create_default_context(cafile=cfg.nats_tls_ca)
        if cfg.nats_tls_cert:
            ctx.load_cert_chain(cfg.nats_tls_cert, cfg.nats_tls_key)
        opts["tls"] = ctx
    return opts


async def connect(
    url: str,
    cfg: BrokerSettings,
    *,
    name: str,
    error_cb: Callable[[Exception], Awaitable[None]] | None = None,
    disconnected_cb: Callable[[], Awaitable[None]] | None = None,
    reconnected_cb: Callable[[], Awaitable[None]] | None = None,
) -> Client:
    """Connect once (no retry loop at start: a wrong URL or password fails fast).

    The connection signs what it publishes when the job has a key, and an open
    broker is warned about once (:func:`monarch.broker.connections.auth.secure`).
    """
    errors: list[Exception] = []
    options = connect_options(cfg)  # a bad credentials file fails here, before any I/O

    async def record(e: Exception) -> None:
        errors.append(e)
        if error_cb is not None:
            await error_cb(e)

    try:
        # nats-py can wait forever on a TLS handshake it cannot complete: bound it.
        nc = await asyncio.wait_for(
            nats.connect(
                [u.strip() for u in url.split(",")],
                name=name,
                allow_reconnect=True,
                # One pass over the servers at start; once connected, reconnect forever
                # (the runtime decides when a lost broker fails the job).
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                connect_timeout=5,
                error_cb=record,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                **options,
            ),
            cfg.connect_timeout,
        )
    except Exception as e:
        causes = "; ".join(dict.fromkeys(str(x) for x in [*errors, e] if str(x)))
        causes = causes or type(e).__name__
        if isinstance(e, asyncio.TimeoutError) and not str(e):
            causes = f"not connected within {cfg.connect_timeout:.0f} s (MONARCH_CONNECT_TIMEOUT)"
        hint = (
            "check MONARCH_NATS_TOKEN, MONARCH_NATS_USER/MONARCH_NATS_PASSWORD or MONARCH_NATS_CREDS"
            if "authorization" in causes.lower() or "auth" in causes.lower()
            else "check that the broker runs, that MONARCH_NATS_URL points at it, and for a TLS "
            "broker MONARCH_NATS_TLS_CA"
        )
        raise BrokerConnectionError(
            f"cannot connect to the broker at {redact(url)}: {causes} ({hint})"
        ) from e
    nc.options["max_reconnect_attempts"] = -1
    # Cheaper headers, reading on arrival, writing within the publish, and threads
    # writing their own message when nothing waits. (Signing, below, wraps only
    # ``publish``, which none of them touches: the two may go on in either order.)
    natspy_internals.install(nc, thread_writes=True)
    secure(nc, cfg)
    return nc
