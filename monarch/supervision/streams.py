"""The JetStream streams that hold heartbeats and supervision events.

Heartbeats keep only the latest message per subject (one per proc or host);
supervision events are kept for an hour so a person can read back what
failed and why (``nats stream view monarch-<ns>-sup``). Both are created on
first use, idempotently; every process calls :func:`ensure_streams`.
"""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from monarch.broker.connections.jetstream_setup import (
    NOT_READY,
    NotPlacedYet,
    replicas,
    while_electing,
)

log = logging.getLogger(__name__)


def heartbeat_stream(namespace: str) -> str:
    return f"monarch-{namespace}-hb"


def supervision_stream(namespace: str) -> str:
    return f"monarch-{namespace}-sup"


async def ensure_streams(nc: Client, namespace: str) -> None:
    js = nc.jetstream()
    configs = [
        StreamConfig(
            name=heartbeat_stream(namespace),
            subjects=[f"mon.{namespace}.hb.>"],
            retention=RetentionPolicy.LIMITS,
            max_msgs_per_subject=1,
            max_age=600.0,
            storage=StorageType.MEMORY,
        ),
        StreamConfig(
            name=supervision_stream(namespace),
            subjects=[f"mon.{namespace}.sup.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=3600.0,
            storage=StorageType.FILE,
        ),
    ]
    for cfg in configs:
        cfg.num_replicas = replicas(nc)  # on a cluster, a stream outlives one server

        async def create(cfg: StreamConfig = cfg) -> None:
            try:
                await js.add_stream(cfg)
            except NOT_READY:
                raise
            except Exception as refused:  # already there with the same config is fine
                try:
                    await js.stream_info(cfg.name)
                except NotFoundError:
                    raise NotPlacedYet(repr(refused)) from refused

        try:
            # A cluster that has just started elects its JetStream leader first.
            await while_electing(f"the stream {cfg.name}", create)
        except Exception as e:
            log.warning(
                "could not create JetStream stream %s: %r (heartbeats and supervision events "
                "still flow, but are not kept for late readers)",
                cfg.name,
                e,
            )
