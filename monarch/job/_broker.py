"""Which broker a job's host agents meet the client on: the one place the job layer asks the runtime.

The client's runtime knows its broker URL: the one ``MONARCH_NATS_URL``
names, or, when that is unset, the embedded nats-server it started, whose
URL carries the generated token (``nats://TOKEN@127.0.0.1:PORT``). Agents
get that URL in their *environment* (``MONARCH_NATS_URL``), never on their
command line, where ``ps`` would show the token to every user.
"""

from __future__ import annotations

import os

from monarch.actors.client import embedded_broker_url
from monarch.core.process_runtime import current_runtime_or_none, runtime


def client_broker() -> tuple[str, bool]:
    """The URL this client's runtime is connected to (starting it if needed), and whether
    that broker is the embedded one this process started (it dies with this process)."""
    rt = runtime()
    embedded = embedded_broker_url()
    return rt.nats_url, bool(embedded) and rt.nats_url == embedded


def use_broker(url: str) -> None:
    """Make this client meet a job's hosts on ``url`` (a job attached to from another script).

    Before the client runtime starts, this just sets ``MONARCH_NATS_URL`` so
    it connects there. Once it runs on another broker it cannot move:
    RuntimeError saying so.
    """
    rt = current_runtime_or_none()
    if rt is None:
        os.environ["MONARCH_NATS_URL"] = url
        return
    if rt.nats_url != url:
        raise RuntimeError(
            "this client is already connected to another broker than the one the job's hosts "
            f"use ({_redact(url)}); attach to the job (job.state()) before any other use of "
            "monarch in this script, or run it with MONARCH_NATS_URL set to the job's broker"
        )


def _redact(url: str) -> str:
    """The URL without its token, for messages."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
