"""The process's settings, read from ``MONARCH_*`` environment variables.

:class:`Settings` is every ``MONARCH_*`` setting of the runtime: the broker's
own (:class:`monarch.broker.settings.BrokerSettings`, which it extends) and
those of the floors above it: heartbeats, flow control, timeouts, how procs
are started, telemetry. Every setting has a default that works on one machine
with no setup; values are validated with pydantic, so a typo such as
``MONARCH_HEARTBEAT_TIMEOUT=abc`` fails at start-up with a message naming the
variable. ``monarch.configure`` (:mod:`monarch.config`) sets them by name.

Layer: just above :mod:`monarch.broker`, below everything else.
"""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import Field

from monarch.broker import settings as _broker
from monarch.broker.settings import ENV_PREFIX, BrokerSettings

__all__ = ["ENV_PREFIX", "Settings", "prefix_python_logs_with_actor", "settings"]

# As in Monarch (``monarch.actor.config.prefix_python_logs_with_actor = False``):
# whether log records made in actor code (and in client code that has used
# ``context()``) start with ``[actor=<name>] ``.
prefix_python_logs_with_actor = True


class Settings(BrokerSettings):
    """The validated ``MONARCH_*`` environment."""

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
    flow_timeout: float = Field(
        60.0, gt=0, description="Seconds a sender may be held back by a slow mesh before it errs."
    )
    batch_max: int = Field(
        1000,
        ge=0,
        description="Most fire-and-forget messages to one subject sent as one NATS message, "
        "and most replies of a proc's actors of a per_proc mesh to one call (0: each travels "
        "alone).",
    )
    busy_poll_us: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Microseconds an event loop keeps polling after a one-to-one call's "
        "message (0: sleep at once). Pays only where waking a sleeping core is slow "
        "(benchmarks/NOTES.md 16 and 26); 1000 there.",
    )
    eager_start: bool = Field(
        True,
        description="Start a call the broker delivers to an idle actor whose endpoints are "
        "all async inside its delivery, as Python 3.12's eager tasks, and a call to a per_proc "
        "mesh's whole group for all its idle actors in one pass (0: every message on the "
        "next turn of the actor's task; monarch.actors.hosting.mailbox, group_call; "
        "benchmarks/NOTES.md 63-64).",
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
    rdma_allow_tcp_fallback: bool = Field(
        True,
        description="Whether an RDMABuffer may be made where there is no RDMA hardware (its "
        "transfers then use same-host copies or TCP); False: RDMABuffer() raises RuntimeError "
        "there. Monarch's key of the same name; read when a buffer is made.",
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


@functools.lru_cache(maxsize=1)
def _read() -> Settings:
    return Settings.from_env()


def settings() -> Settings:
    """The process-wide settings, read once from the environment.

    ``settings.cache_clear()`` reads them again at the next call, and the
    broker's (:func:`monarch.broker.settings.settings`) with them.
    """
    return _read()


def _cache_clear() -> None:
    _read.cache_clear()
    _broker.settings.cache_clear()


settings.cache_clear = _cache_clear  # type: ignore[attr-defined]
