"""The ``monarch-<ns>-telemetry`` stream: where every process's batches are kept.

Each message on ``mon.<ns>.tel.<proc-uid>`` is one process's batch, a msgpack
map (``span_fields``, ``spans``: one array per span, ``call_fields``,
``calls``: one array per finished call of an actor, which readers make its
deliver and handle spans, ``metrics``: one map per point), which ``monarch tail 'mon.<ns>.tel.>'`` shows decoded.
The stream is bounded (``MONARCH_TELEMETRY_MAX_BYTES``, default 64 MiB, and
``MONARCH_TELEMETRY_MAX_AGE``, default an hour; the oldest batches go first),
kept in memory: telemetry is for looking at a job while it runs or just after.
The client creates it when telemetry is on, as it creates the other streams
(:mod:`monarch.supervision.streams`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgpack
from nats.aio.client import Client
from nats.js.api import DeliverPolicy, DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from monarch.broker.vocabulary import subjects

log = logging.getLogger(__name__)


class NoTelemetryError(LookupError):
    """The namespace has no telemetry stream: no job ran there with telemetry on."""


def telemetry_stream(namespace: str) -> str:
    return f"monarch-{namespace}-telemetry"


def stream_config(namespace: str, max_bytes: int, max_age: float) -> StreamConfig:
    return StreamConfig(
        name=telemetry_stream(namespace),
        subjects=[subjects.telemetry_wildcard(namespace)],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_bytes=max_bytes,
        max_age=max_age,
        storage=StorageType.MEMORY,
    )


async def ensure_stream(nc: Client, namespace: str, max_bytes: int, max_age: float) -> None:
    """Create the stream, or bring an existing one's limits to these; idempotent."""
    js = nc.jetstream()
    cfg = stream_config(namespace, max_bytes, max_age)
    try:
        await js.add_stream(cfg)
    except Exception as e:
        try:
            await js.update_stream(cfg)
        except Exception:
            log.warning("could not create JetStream stream %s: %r", cfg.name, e)


def decode_batch(data: bytes) -> list[dict[str, Any]]:
    """The records of one batch (:meth:`~monarch.telemetry.recorder.Recorder.flush`), each a
    dict with ``type`` ``span``, ``metric`` or ``log``; a body that is not a batch gives none.

    A finished call's record becomes its deliver span (when its delivery time is
    known) and its handle span, here rather than in the process that recorded it.
    """
    try:
        batch = msgpack.unpackb(data)
        fields = batch["span_fields"]
        records = [dict(zip(fields, span), type="span") for span in batch["spans"]]
        if batch.get("calls"):
            records += _spans_of_calls(batch["proc"], batch["call_fields"], batch["calls"])
        records += [dict(point, type="metric") for point in batch["metrics"]]
        if batch.get("logs"):  # absent from batches without logs (and from older writers)
            proc, log_fields = batch["proc"], batch["log_fields"]
            records += [dict(zip(log_fields, entry), proc=proc, type="log")
                        for entry in batch["logs"]]  # fmt: skip
    except Exception:
        return []
    return records


def _spans_of_calls(proc: str, fields: list[str], calls: list[list]) -> list[dict[str, Any]]:
    spans = []
    for values in calls:
        call = dict(zip(fields, values))
        delivered, started = call["delivered"], call["started"]
        common = {
            "type": "span", "trace_id": call["trace"] or None, "proc": proc,
            "actor_id": call["actor_id"], "mesh": call["mesh"], "rank": call["rank"],
            "endpoint": call["endpoint"], "caller": call["caller"] or None,
        }  # fmt: skip
        if delivered:  # 0.0: not known
            # delivered is time.time(), started the activity book's monotonic clock made
            # wall time: the two may disagree by a few microseconds, never a negative wait.
            spans.append(dict(common, span="deliver", start=min(delivered, started),
                              end=started, ok=True))  # fmt: skip
        spans.append(dict(common, span="handle", start=started, end=call["ended"], ok=call["ok"]))
    return spans


async def read_records(nc: Client, namespace: str, timeout: float) -> list[dict[str, Any]]:
    """Every record the stream holds now, oldest first, read with an ordered consumer.

    Raises :class:`NoTelemetryError` when there is no stream. Reading stops at
    the stream's last message as of the start, or after ``timeout`` seconds
    (then with what came, and a warning).
    """
    js = nc.jetstream()
    name = telemetry_stream(namespace)
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        raise NoTelemetryError(name) from None
    last = info.state.last_seq
    if not info.state.messages:
        return []
    records: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        records.extend(decode_batch(msg.data))
        if msg.metadata.sequence.stream >= last:
            done.set()

    sub = await js.subscribe(
        subjects.telemetry_wildcard(namespace),
        stream=name,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    started = time.monotonic()
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except asyncio.TimeoutError:
        log.warning(
            "read %d telemetry record(s) in %.1f s, not all of stream %s",
            len(records),
            time.monotonic() - started,
            name,
        )
    finally:
        await sub.unsubscribe()
    return records
