"""The broker's settings, read from ``MONARCH_*`` environment variables, and the one
settings style of the project.

:class:`EnvSettings` is that style: a pydantic model whose field ``x`` is the
variable ``MONARCH_X``, so a typo such as ``MONARCH_CONNECT_TIMEOUT=abc`` fails
with a message naming the variable instead of later and somewhere else. The
process's settings (:mod:`monarch.settings`), the bulk/RDMA layer's
(:mod:`monarch.rdma.config`) and the tensor engine's (:mod:`monarch.tensors.config`)
are all written in it.

:class:`BrokerSettings` holds what this floor reads: where the broker is and
how to log in to it, the job's message key, how bodies are encoded, and the
switches of the nats-py fast paths (:mod:`monarch.broker.natspy_internals`).
Every setting has a default that works on one machine with no setup.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

ENV_PREFIX = "MONARCH_"


class EnvSettings(BaseModel):
    """Settings whose field ``x`` is read from the variable ``MONARCH_X`` (unset or empty: the default)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Any:
        """All the settings, validated; ValueError naming each bad variable."""
        env = os.environ if environ is None else environ
        values = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        try:
            return cls(**values)
        except ValidationError as e:
            problems = "; ".join(
                f"{ENV_PREFIX}{'.'.join(map(str, err['loc'])).upper()}: {err['msg']}"
                for err in e.errors()
            )
            raise ValueError(f"invalid monarch environment: {problems}") from None

    @classmethod
    def read(cls, name: str, environ: Mapping[str, str] | None = None) -> Any:
        """One setting as the environment says now, validated (for settings read when used).

        Only that variable is looked at, so a bad value in another one fails
        where that one is used, not here.
        """
        env = os.environ if environ is None else environ
        raw = env.get(ENV_PREFIX + name.upper())
        return getattr(cls.from_env({} if raw is None else {ENV_PREFIX + name.upper(): raw}), name)


class BrokerSettings(EnvSettings):
    """The validated ``MONARCH_*`` variables this floor reads."""

    nats_url: str | None = Field(
        None, description="Broker URL(s), comma separated. Unset: start an embedded nats-server."
    )
    namespace: str = Field(
        "default", pattern=r"^[A-Za-z0-9_-]+$", description="First token after 'mon.' in subjects."
    )
    pickle: bool = Field(True, description="Allow cloudpickle for values msgpack cannot carry.")
    wire: Literal["msgpack", "json"] = Field("msgpack", description="Body encoding.")
    nats_server: str | None = Field(None, description="Path of the nats-server binary to run.")
    nats_token: str | None = Field(None, description="Token for an external broker.")
    nats_user: str | None = Field(None, description="User name for an external broker.")
    nats_password: str | None = Field(None, description="Password for MONARCH_NATS_USER.")
    nats_creds: str | None = Field(None, description="NATS credentials (.creds) file.")
    nats_tls_ca: str | None = Field(None, description="CA bundle that signed the broker's cert.")
    nats_tls_cert: str | None = Field(None, description="Client certificate for mutual TLS.")
    nats_tls_key: str | None = Field(None, description="Key of MONARCH_NATS_TLS_CERT.")
    nats_job_key: str | None = Field(
        None,
        min_length=16,
        description="The job's message authentication key (HMAC-SHA256; every process of "
        "the job needs the same one). Set: every message is signed and unsigned ones dropped.",
    )
    auth: bool = Field(
        False,
        description="Sign the job's messages with a key the client makes and hands to the "
        "procs it starts (as MONARCH_NATS_JOB_KEY, in their environment).",
    )
    open_broker_ok: bool = Field(
        False, description="Do not warn that the broker admits clients without credentials."
    )
    direct_read: bool = Field(
        True,
        description="Parse what the broker sends in the socket's callback, not in nats-py's "
        "reader task (monarch.broker.natspy_internals.direct_read; benchmarks/NOTES.md 30).",
    )
    fast_delivery: bool = Field(
        True,
        description="Deliver whole, plain MSG/HMSG frames of a received chunk to our ordered "
        "subscriptions in one pass, not through nats-py's parser (needs direct_read; "
        "monarch.broker.natspy_internals.fast_delivery; benchmarks/NOTES.md 31).",
    )
    write_through: bool = Field(
        True,
        description="Write a message to the broker's socket within its publish (a burst: the "
        "rest at the next loop turn), not on nats-py's flusher task's turn "
        "(monarch.broker.natspy_internals.write_through; benchmarks/NOTES.md 30).",
    )
    sync_publish: bool = Field(
        True,
        description="Publish from the runtime's loop in one plain call, not through nats-py's "
        "publish coroutines (needs write_through; monarch.broker.natspy_internals.sync_publish; "
        "benchmarks/NOTES.md 31).",
    )
    direct_write: bool = Field(
        True,
        description="A thread other than the loop's (a script calling, a sync actor answering) "
        "writes its message to the broker's socket itself while nothing else waits to be "
        "written, instead of waking the loop to (monarch.broker.natspy_internals.direct_write; "
        "benchmarks/NOTES.md 42).",
    )
    connect_timeout: float = Field(
        15.0, gt=0, description="Seconds the first connection to the broker may take."
    )


@functools.lru_cache(maxsize=1)
def settings() -> BrokerSettings:
    """The broker's settings, read once from the environment.

    :func:`monarch.settings.settings` (the whole process's) clears this cache
    with its own, so both always read the same environment.
    """
    return BrokerSettings.from_env()
