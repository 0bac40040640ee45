"""Who is out there: host agents and procs, registered in JetStream KV buckets.

``monarch-<ns>-hosts`` holds one entry per running host agent (key: its
uid), ``monarch-<ns>-procs`` one per running proc. Values are JSON, so
``nats kv get monarch-default-hosts <uid>`` shows them as they are. An entry is
deleted on a clean exit; a process that is killed outright leaves its entry
behind, which is why liveness is never read from the buckets but from
heartbeats (:class:`HeartbeatSeen`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from monarch.broker.connections.auth import auth_of
from monarch.broker.connections.jetstream_setup import (
    NOT_READY,
    NotPlacedYet,
    replicas,
    while_electing,
)
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects

HOSTS = "hosts"
PROCS = "procs"
HOST_UID_ENV = "MONARCH_HOST_UID"  # set in procs an agent starts: which agent did


def bucket_name(namespace: str, what: str) -> str:
    """``monarch-<ns>-hosts`` or ``monarch-<ns>-procs``."""
    return f"monarch-{namespace}-{what}"


@dataclass
class HostInfo:
    """A host agent's entry: what a client needs to choose it and to reach it."""

    uid: str
    name: str
    address: str  # the IP this agent uses to reach the broker
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int | None = None  # most procs it runs at once; None: no limit
    pid: int = 0
    started_at: float = 0.0  # time.time() on the agent's machine
    heartbeat_interval: float = 0.5  # how often it beats: how long silence means absence
    # What its spawn requests may ask beyond the default (an older agent lists none):
    # "bind" (proc_bind), "command" (a client's bootstrap command).
    features: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> HostInfo:
        d = json.loads(data)
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def matches(self, worker: str) -> bool:
        """Whether ``worker`` names this agent: its uid, name or address.

        Monarch-style addresses (``tcp://node3:4444``) match by their host part.
        """
        host = worker.split("://", 1)[-1].rsplit(":", 1)[0] if "://" in worker else worker
        return host in (self.uid, self.name, self.address)

    def has_labels(self, labels: dict[str, str] | None) -> bool:
        return all(self.labels.get(k) == v for k, v in (labels or {}).items())


async def open_bucket(nc: Client, namespace: str, what: str) -> KeyValue:
    """The bucket, created (in memory, one revision per key) if it does not exist yet."""
    js = nc.jetstream()
    name = bucket_name(namespace, what)

    async def open_or_create() -> KeyValue:
        try:
            return await js.key_value(name)
        except BucketNotFoundError:
            pass
        try:
            return await js.create_key_value(
                KeyValueConfig(
                    bucket=name, history=1, storage=StorageType.MEMORY, replicas=replicas(nc)
                )
            )
        except NOT_READY:
            raise
        except Exception as refused:
            try:
                return await js.key_value(name)  # created by someone else meanwhile
            except BucketNotFoundError:
                raise NotPlacedYet(repr(refused)) from refused

    # On a cluster: a copy per server, and patience while it elects its leader.
    return await while_electing(f"the bucket {name}", open_or_create)


async def read_all(nc: Client, namespace: str, what: str, timeout: float = 5.0) -> dict[str, bytes]:
    """Every live key of the bucket and its value (empty if the bucket does not exist).

    On a cluster that has just lost a server, the bucket's new leader may take
    seconds to be elected: its lookup is asked again meanwhile (:func:`while_electing`).
    """
    name = bucket_name(namespace, what)
    try:
        kv = await while_electing(f"the bucket {name}", lambda: nc.jetstream().key_value(name))
    except BucketNotFoundError:
        return {}
    # Its watcher is a consumer on the bucket's stream: also refused while that
    # stream elects a leader (seen in CI right after a server was killed).
    watcher = await while_electing(
        f"a watcher of the bucket {name}", lambda: kv.watchall(ignore_deletes=True)
    )
    out: dict[str, bytes] = {}
    try:
        while True:
            entry = await watcher.updates(timeout=timeout)
            if entry is None:  # the initial values are all here
                break
            if entry.value:
                out[entry.key] = entry.value
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()
    return out


async def list_hosts(nc: Client, namespace: str) -> list[HostInfo]:
    """Registered host agents, live or not, ordered by name then uid."""
    hosts = []
    for value in (await read_all(nc, namespace, HOSTS)).values():
        with contextlib.suppress(ValueError, TypeError):
            hosts.append(HostInfo.from_json(value))
    return sorted(hosts, key=lambda h: (h.name, h.uid))


async def list_procs(nc: Client, namespace: str) -> list[dict[str, Any]]:
    """Registered procs (see :mod:`monarch.core.proc_registry`), ordered by uid."""
    procs = []
    for value in (await read_all(nc, namespace, PROCS)).values():
        with contextlib.suppress(ValueError):
            procs.append(json.loads(value))
    return sorted(procs, key=lambda p: p.get("uid", ""))


class HeartbeatSeen:
    """Which uids are beating: subscribes to every heartbeat of the namespace while open.

    Registration says who was there; a beat seen lately says who still is.
    ``alive(uid, within)`` is true if ``uid`` beat in the last ``within``
    seconds; ``watched_for()`` says how long we have been listening, so a
    caller can tell "silent" from "not heard yet".
    """

    def __init__(self, nc: Client, namespace: str) -> None:
        self.nc = nc
        self.subject = subjects.heartbeat(namespace, "*")
        self.last: dict[str, float] = {}
        self.dead: set[str] = set()
        self.started = time.monotonic()
        self._sub: Any = None

    async def __aenter__(self) -> HeartbeatSeen:
        self._sub = await self.nc.subscribe(self.subject, cb=self._on_beat)
        self.started = time.monotonic()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    async def _on_beat(self, msg: Any) -> None:
        auth = auth_of(self.nc)
        if auth is not None and not auth.accepts(msg):
            return  # not from this job (counted by accepts)
        uid = msg.subject.rsplit(".", 1)[-1]
        if (msg.headers or {}).get(hdr.KIND) == "dead":
            self.dead.add(uid)
        else:
            self.last[uid] = time.monotonic()

    def alive(self, uid: str, within: float) -> bool:
        seen = self.last.get(uid)
        return uid not in self.dead and seen is not None and time.monotonic() - seen <= within

    def watched_for(self) -> float:
        return time.monotonic() - self.started

    def silent(self, uids: Iterable[str], within: float) -> list[str]:
        """Those of ``uids`` not heard from although we listened for ``within`` seconds."""
        if self.watched_for() < within:
            return [u for u in uids if u in self.dead]
        return [u for u in uids if not self.alive(u, within)]
