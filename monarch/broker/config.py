"""Runtime settings, read from ``MONARCH_*`` environment variables.

Every setting has a default that works on one machine with no setup. Values
are validated with pydantic, so a typo such as ``MONARCH_HEARTBEAT_TIMEOUT=abc``
fails at start-up with a message naming the variable instead of later and
somewhere else.
"""

from __future__ import annotations

import functools
import os
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

ENV_PREFIX = "MONARCH_"

# As in Monarch (``monarch.actor.config.prefix_python_logs_with_actor = False``):
# whether log records made in actor code (and in client code that has used
# ``context()``) start with ``[actor=<name>] ``.
prefix_python_logs_with_actor = True


class Settings(BaseModel):
    """The validated ``MONARCH_*`` environment."""

    nats_url: str | None = Field(
        None, description="Broker URL(s), comma separated. Unset: start an embedded nats-server."
    )
    namespace: str = Field(
        "default", pattern=r"^[A-Za-z0-9_-]+$", description="First token after 'mon.' in subjects."
    )
    job_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        description="The name `monarch jobs` lists this job by (its record and NATS context "
        "are named after it). Unset: the script's name and 4 hex digits, e.g. train-3f2a.",
    )
    heartbeat_interval: float = Field(0.5, gt=0, description="Seconds between heartbeats.")
    heartbeat_timeout: float = Field(3.0, gt=0, description="Silence before a peer is dead.")
    stall_threshold: float = Field(
        5.0,
        gt=0,
        description="Seconds an endpoint call may run before it is reported as stalled "
        "(one warning at the caller; `monarch top` and the stats answer show it).",
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
    flow_timeout: float = Field(
        60.0, gt=0, description="Seconds a sender may be held back by a slow mesh before it errs."
    )
    batch_max: int = Field(
        1000,
        ge=0,
        description="Most fire-and-forget messages to one subject sent as one NATS message "
        "(0: each travels alone).",
    )
    busy_poll_us: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Microseconds an event loop keeps polling after a one-to-one call's "
        "message (0: sleep at once). Pays only where waking a sleeping core is slow "
        "(benchmarks/NOTES.md 16 and 26); 1000 there.",
    )
    direct_read: bool = Field(
        True,
        description="Parse what the broker sends in the socket's callback, not in nats-py's "
        "reader task (monarch.broker.direct_read; benchmarks/NOTES.md 30).",
    )
    fast_delivery: bool = Field(
        True,
        description="Deliver whole, plain MSG/HMSG frames of a received chunk to our ordered "
        "subscriptions in one pass, not through nats-py's parser (needs direct_read; "
        "monarch.broker.fast_delivery; benchmarks/NOTES.md 31).",
    )
    write_through: bool = Field(
        True,
        description="Write a message to the broker's socket within its publish (a burst: the "
        "rest at the next loop turn), not on nats-py's flusher task's turn "
        "(monarch.broker.write_through; benchmarks/NOTES.md 30).",
    )
    sync_publish: bool = Field(
        True,
        description="Publish from the runtime's loop in one plain call, not through nats-py's "
        "publish coroutines (needs write_through; monarch.broker.sync_publish; "
        "benchmarks/NOTES.md 31).",
    )
    direct_write: bool = Field(
        True,
        description="A thread other than the loop's (a script calling, a sync actor answering) "
        "writes its message to the broker's socket itself while nothing else waits to be "
        "written, instead of waking the loop to (monarch.broker.direct_write; "
        "benchmarks/NOTES.md 42).",
    )
    flow_batch: int = Field(1000, ge=1, description="Messages between two flow markers.")
    flow_window: int = Field(16, ge=1, description="Unanswered flow markers before a sender waits.")
    flow_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Bytes of message bodies a sender may have unhandled by an actor mesh "
        "(a flow marker every MONARCH_FLOW_BYTES / MONARCH_FLOW_WINDOW bytes): keeps a stalled "
        "receiver's backlog well under nats-server's 64 MiB, past which it is cut off.",
    )
    flow_hold_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1,
        description="Bytes of messages sent from the event loop (async endpoints) that may "
        "wait in the sender for a slow receiver (mesh or proc) while its window is full; a send "
        "past it raises BackpressureError.",
    )
    connect_timeout: float = Field(
        15.0, gt=0, description="Seconds the first connection to the broker may take."
    )
    broker_lost_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds without the broker before the job fails; also how long a call "
        "that reached no actor (its proc reconnecting) is sent again before NoActorError.",
    )
    stop_timeout: float = Field(10.0, gt=0, description="Seconds a graceful stop may take.")
    spawn_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds for procs to report ready, and the longest a proc may show no sign "
        "of life (no heartbeat, no answer) while actors are spawned on it; a slow __init__ on "
        "live procs is waited for.",
    )
    attach_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds attach_to_workers gives a worker given by address (tcp://, ipc://) "
        "to take the client's hello (its settings) before the attach fails naming it; read "
        "when attaching (Monarch's mesh_attach_config_timeout).",
    )
    zygote: bool = Field(
        True, description="Fork procs from a pre-imported template process (fast spawns)."
    )
    preload_torch: Literal["auto", "1", "0"] = Field(
        "auto",
        description="Fork procs from a zygote that has imported torch: 'auto' once the client "
        "script has imported it, '1' always (when installed), '0' never.",
    )
    die_with_parent: bool = Field(
        True, description="Have the kernel kill procs whose parent dies (besides heartbeats)."
    )
    telemetry: bool = Field(
        False,
        description="Record per-message spans and metrics and publish them to the "
        "monarch-<ns>-telemetry stream (`monarch query`; docs/telemetry.md). Off: nothing "
        "is added per message.",
    )
    telemetry_interval: float = Field(
        1.0, gt=0, description="Seconds between two telemetry batches of a process."
    )
    telemetry_batch: int = Field(
        2000, ge=1, description="Spans a process buffers before it publishes them early."
    )
    telemetry_max_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="Size limit of the telemetry stream (oldest go first)."
    )
    telemetry_max_age: float = Field(
        3600.0, gt=0, description="Seconds the telemetry stream keeps a batch."
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP endpoint the client exports the job's telemetry to (default: "
        "OTEL_EXPORTER_OTLP_ENDPOINT); needs the `otel` extra.",
    )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
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


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings.from_env()
