"""Job message authentication: every message a job publishes carries an HMAC tag.

A broker that admits anyone (no token, user or account) lets anyone who can
reach it publish on a job's subjects: forge replies, ``dead`` heartbeats,
supervision events. With a job key (``MONARCH_NATS_JOB_KEY``, or
``MONARCH_AUTH=1`` to have the client make one and hand it to the procs it
starts through their environment), :func:`secure` makes a connection

* sign: every publish to a ``mon.`` subject gets a ``Mon-Auth`` header,
  HMAC-SHA256 (truncated to 128 bits) over the subject, the reply subject,
  the ``Mon-*`` headers sorted by name and the body;
* verify: :func:`monarch.broker.natspy_internals.intake.subscribe_ordered`, the one door every
  message of our subscriptions comes in by, asks :meth:`MessageAuth.accepts`
  first; a message without a valid tag is dropped, counted in
  :func:`dropped` and reported by a rate-limited warning.

What the tag does not do: it proves a message was made by a holder of the
key, not that it is fresh. A captured message can be replayed unchanged (a
call runs again, an old ``alive`` heartbeat counts once more). Bodies are not
encrypted: anyone on an open broker still reads the traffic. The server's own
"no responders" status (``Status: 503``, no body) cannot be signed, so it is
let through and can be forged to fail a call early. Only a broker that admits
just the job (token, accounts, TLS) stops reading and replay.

An open broker without a job key is reported once per job by a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from nats.aio.client import Client

from monarch.broker.settings import BrokerSettings
from monarch.broker.vocabulary import headers as hdr

log = logging.getLogger(__name__)

TAG = hdr.AUTH
KEY_ENV = "MONARCH_NATS_JOB_KEY"
# Set once the open-broker warning was shown, so the procs this process starts
# (which inherit the environment) do not repeat it: one warning per job.
_WARNED_ENV = "MONARCH_OPEN_BROKER_WARNED"
_SIGNED_PREFIX = "mon."  # our subjects; JetStream API and KV subjects stay as they are
_TAG_CHARS = 32  # hex digits: 128 bits of HMAC-SHA256
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})
_WARN_EVERY = 10.0  # seconds between two drop warnings


class MessageAuth:
    """Signs and checks messages with one job key. Safe to share between threads."""

    def __init__(self, key: str | bytes) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        # Keyed once; each tag starts from a copy (cheaper than hmac.new per message).
        self._mac = hmac.new(raw, digestmod=hashlib.sha256)

    def tag(self, subject: str, reply: str, headers: Mapping[str, str] | None, body: Any) -> str:
        """The ``Mon-Auth`` value for this message (header values as nats-py sends them)."""
        lines = []
        if headers:
            for k in sorted(headers):
                if k[:4] == hdr.PREFIX and k != TAG:
                    v = headers[k].strip()
                    if "\n" in v or "\r" in v:
                        v = v.translate(_NEWLINES)  # what nats-py puts on the wire
                    lines.append(f"{k}:{v}\n")
        # Subjects, names and values hold no newline and the count ends the header
        # lines, so no two messages read alike (no header can pass for the body).
        mac = self._mac.copy()
        mac.update(f"{subject}\n{reply or ''}\n{len(lines)}\n{''.join(lines)}".encode())
        mac.update(body)
        return mac.hexdigest()[:_TAG_CHARS]

    def valid(self, msg: Any) -> bool:
        """Whether ``msg`` (anything with subject, reply, headers, data) carries a valid tag."""
        headers = msg.headers
        got = headers.get(TAG) if headers else None
        if not got:
            return False
        want = self.tag(msg.subject, msg.reply, headers, msg.data)
        try:
            return hmac.compare_digest(got, want)
        except TypeError:  # a forged tag with non-ASCII characters
            return False

    def accepts(self, msg: Any) -> bool:
        """:meth:`valid`, or the server's own "no responders" (``Status: 503``, no body, no
        ``Mon-*`` headers).

        A refused message is counted and warned about (rate limited).
        """
        if self.valid(msg):
            return True
        headers = msg.headers or {}
        if (
            headers.get("Status") == "503"
            and not msg.data
            and not any(k.startswith(hdr.PREFIX) for k in headers)
        ):
            return True  # made by the server (it adds Description, Nats-Subject): unsigned
        _drops.add(msg.subject, "no Mon-Auth tag" if TAG not in headers else "a wrong tag")
        return False


class _Drops:
    """Counts of refused messages by subject kind (``port``, ``hb``, ...), process-wide."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last_warning = 0.0
        self._unreported = 0

    def add(self, subject: str, why: str) -> None:
        parts = subject.split(".", 3)
        kind = parts[2] if len(parts) > 2 else subject
        now = time.monotonic()
        with self._lock:
            self.counts[kind] += 1
            self._unreported += 1
            if now - self._last_warning < _WARN_EVERY:
                log.debug("dropped a message on %s: %s", subject, why)
                return
            self._last_warning, n, self._unreported = now, self._unreported, 0
        log.warning(
            "dropped %d message(s) without a valid job authentication tag (latest on %s: %s): "
            "a process without this job's MONARCH_NATS_JOB_KEY, with another key, or a forger "
            "is publishing on this job's subjects",
            n,
            subject,
            why,
        )


_drops = _Drops()


def dropped() -> dict[str, int]:
    """How many messages this process refused for a missing or wrong tag, by subject kind."""
    with _drops._lock:
        return dict(_drops.counts)


# -- the job key --------------------------------------------------------------

_generated: str | None = None
_key_lock = threading.Lock()


def job_key(cfg: BrokerSettings) -> str | None:
    """This process's job key: ``MONARCH_NATS_JOB_KEY``, or one made here for ``MONARCH_AUTH=1``.

    A key made here is put into this process's environment, so every proc it
    starts inherits it (procs get their environment at spawn, never in argv).
    The ``MONARCH_NATS_`` prefix keeps it out of the settings a client forwards
    to host agents over the broker; host agents get it from their operator.
    """
    global _generated
    if cfg.nats_job_key:
        return cfg.nats_job_key
    if not cfg.auth:
        return None
    with _key_lock:
        if _generated is None:
            _generated = os.environ.get(KEY_ENV) or secrets.token_urlsafe(32)
            os.environ[KEY_ENV] = _generated
        return _generated


# -- connections ------------------------------------------------------------------

_ATTR = "_monarch_auth"  # set on a secured nats-py Client: its MessageAuth, or None
_warned = False
_warn_lock = threading.Lock()


def secure(nc: Client, cfg: BrokerSettings) -> MessageAuth | None:
    """Make ``nc`` sign what it publishes (if the job has a key); warn about an open broker.

    Idempotent: the first call decides for the connection. Returns the
    connection's :class:`MessageAuth` (None: authentication is off).
    """
    if hasattr(nc, _ATTR):
        return getattr(nc, _ATTR)
    key = job_key(cfg)
    auth = MessageAuth(key) if key else None
    setattr(nc, _ATTR, auth)
    if auth is not None:
        _sign_publishes(nc, auth)
    elif not cfg.open_broker_ok and not requires_credentials(nc):
        _warn_open_broker(nc)
    return auth


def auth_of(nc: Client) -> MessageAuth | None:
    """The :class:`MessageAuth` of a connection :func:`secure` has seen (None: off or not seen)."""
    return getattr(nc, _ATTR, None)


def _sign_publishes(nc: Client, auth: MessageAuth) -> None:
    """Wrap this connection's ``publish``; nats-py's request and JetStream publish go through it."""
    publish = nc.publish

    async def signed_publish(
        subject: str, payload: bytes = b"", reply: str = "", headers: dict | None = None
    ) -> None:
        headers = signed_headers(auth, subject, reply, headers, payload)
        await publish(subject, payload, reply=reply, headers=headers)

    nc.publish = signed_publish  # type: ignore[method-assign]


def signed_headers(
    auth: MessageAuth, subject: str, reply: str, headers: dict | None, payload: Any
) -> dict | None:
    """``headers`` as a signing connection sends them: with the tag, on our subjects only.

    A copy: the caller's dictionary (shared by a broadcast's messages) stays as it was.
    """
    if not subject.startswith(_SIGNED_PREFIX):
        return headers
    headers = dict(headers) if headers else {}
    headers[TAG] = auth.tag(subject, reply, headers, payload)
    return headers


def requires_credentials(nc: Client) -> bool:
    """Whether the broker ``nc`` is connected to asked it for credentials (its INFO says so)."""
    info = getattr(nc, "_server_info", None) or {}  # nats-py keeps the server's INFO here
    return bool(info.get("auth_required"))


def _warn_open_broker(nc: Client) -> None:
    global _warned
    with _warn_lock:
        if _warned or os.environ.get(_WARNED_ENV):
            _warned = True
            return
        _warned = True
        os.environ[_WARNED_ENV] = "1"
    url = getattr(nc, "connected_url", None)
    where = f"{url.hostname}:{url.port}" if url is not None else "?"
    log.warning(
        "the NATS broker at %s admits clients without credentials: anyone who can reach it can "
        "read this job's messages and forge replies, heartbeats and supervision events (and run "
        "code in its procs). Give the broker credentials (MONARCH_NATS_TOKEN, _USER/_PASSWORD, "
        "_CREDS), or sign the job's messages (MONARCH_AUTH=1 or MONARCH_NATS_JOB_KEY), or set "
        "MONARCH_OPEN_BROKER_OK=1 to silence this warning",
        where,
    )
