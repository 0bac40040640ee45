"""Host meshes from registered host agents: Monarch's ``attach_to_workers`` and friends.

In Monarch a worker is a ``tcp://host:port`` a client dials. Here nobody dials
anybody: agents (``monarch host``, or :func:`run_worker_loop_forever`)
register in the broker, and a client picks from the registered agents that
are beating. So ``attach_to_workers`` takes names rather than addresses (a
Monarch-style ``tcp://node3:4444`` still works: it matches by host name or IP),
and it can also take a count or "all of them". Unlike Monarch's, it returns
once the hosts are found (bounded by ``timeout``), so ``initialized`` is
already done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client

from monarch.actors.meshes.shape import Extent, View
from monarch.actors.procs.host_mesh import HostMesh
from monarch.broker.config import settings
from monarch.broker.registry import HeartbeatSeen, HostInfo, list_hosts
from monarch.core.runtime import new_event_loop, runtime
from monarch.hosts.agent import run_agent
from monarch.hosts.launcher import AgentLauncher

_POLL = 0.1  # seconds between looks at the registry while waiting


def _silence(h: HostInfo) -> float:
    """How long without a beat means this agent is not there (two missed beats and a bit)."""
    return 2 * h.heartbeat_interval + 0.3


def _pick(
    hosts: list[HostInfo],
    seen: HeartbeatSeen,
    workers: Sequence[str] | None,
    count: int | None,
) -> tuple[list[HostInfo] | None, str]:
    """The chosen hosts, or None and what is still missing."""
    live = [h for h in hosts if seen.alive(h.uid, _silence(h))]
    if workers is not None:
        chosen, missing = [], []
        for w in workers:
            # Several agents answering to a name (restarts): the newest one.
            options = [h for h in live if h.matches(w) and h not in chosen]
            if options:
                chosen.append(max(options, key=lambda h: h.started_at))
            else:
                missing.append(w)
        return (chosen, "") if not missing else (None, f"no live agent for {missing}")
    if count is not None:
        if len(live) >= count:
            return live[:count], ""
        return None, f"{len(live)} live agent(s) of the {count} asked for"
    undecided = [
        h for h in hosts if h not in live and h.uid not in seen.silent([h.uid], _silence(h))
    ]
    if live and not undecided:
        return live, ""
    return None, "no live agent" if not live else f"still listening for {len(undecided)} agent(s)"


async def find_hosts(
    nc: Client,
    namespace: str,
    *,
    workers: Sequence[str] | None = None,
    count: int | None = None,
    labels: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> list[HostInfo]:
    """Registered, beating agents: the named ``workers``, ``count`` of them, or all.

    Waits (up to ``timeout`` seconds) until enough are there; raises
    TimeoutError saying what was missing. Hosts come in ``workers`` order, else
    by name then uid.
    """
    deadline = time.monotonic() + timeout
    async with HeartbeatSeen(nc, namespace) as seen:
        while True:
            hosts = [h for h in await list_hosts(nc, namespace) if h.has_labels(labels)]
            chosen, missing = _pick(hosts, seen, workers, count)
            if chosen is not None:
                return chosen
            if time.monotonic() >= deadline:
                known = ", ".join(f"{h.name} ({h.uid})" for h in hosts) or "none"
                raise TimeoutError(
                    f"host agents not found within {timeout} s: {missing}; registered in "
                    f"namespace {namespace!r}{f' with labels {labels}' if labels else ''}: {known}. "
                    "Start agents with `monarch host` (same MONARCH_NATS_URL and MONARCH_NAMESPACE)."
                )
            await asyncio.sleep(_POLL)


def attach_to_workers(
    *,
    workers: Sequence[Any] | None = None,
    hosts: int | None = None,
    labels: dict[str, str] | None = None,
    name: str | None = None,
    timeout: float = 60.0,
    ca: Any = "trust_all_connections",
    private_key: Any = None,
) -> HostMesh:
    """A host mesh ``{'hosts': H}`` of registered host agents; blocks until they are found.

    ``workers``: agent names, uids or addresses (``str`` or ``Future[str]``), in
    mesh order; ``hosts``: just a count; neither: every live agent. ``labels``
    keeps agents started with all of those ``--labels``. Raises TimeoutError
    after ``timeout`` seconds. TLS is the broker's business here: ``ca`` and
    ``private_key`` must stay at their defaults (use ``MONARCH_NATS_TLS_*``).
    """
    del name  # Monarch's name for the mesh; ours are found by their agents' names
    if private_key is not None or ca != "trust_all_connections":
        raise NotImplementedError(
            "TLS between client and hosts is the broker's: set MONARCH_NATS_TLS_CA (and "
            "MONARCH_NATS_TLS_CERT/KEY) instead of ca/private_key"
        )
    if hosts is not None and (isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1):
        raise ValueError(f"hosts must be a positive int, got {hosts!r}")
    names = None
    if workers is not None:
        names = [w if isinstance(w, str) else str(w.get(timeout=timeout)) for w in workers]
    rt = runtime()
    if rt.on_loop_thread():
        raise RuntimeError(
            "attach_to_workers() blocks: call it from the client script, not an actor"
        )
    coro = find_hosts(
        rt.nc, rt.namespace, workers=names, count=hosts, labels=labels, timeout=timeout
    )
    found = rt.run_coro(coro).result(timeout + 30)
    return HostMesh(View.full(Extent(["hosts"], [len(found)])), found, agent_launcher=AgentLauncher)


def hosts_from_config(
    name: str = "hosts", *, hosts: int | None = None, timeout: float = 60.0
) -> HostMesh:
    """The host mesh ``name``: the live agents started with ``--labels mesh=<name>``.

    Monarch reads this from the project's configuration; here the agents
    carry it, so the same script finds its hosts in any cluster whose agents
    were labelled so. ``hosts`` takes only that many.
    """
    return attach_to_workers(hosts=hosts, labels={"mesh": name}, timeout=timeout)


def run_worker_loop_forever(
    *,
    address: str | None = None,
    ca: Any = "trust_all_connections",
    private_key: Any = None,
    name: str | None = None,
    labels: dict[str, str] | None = None,
    capacity: int | None = None,
) -> None:
    """Make this machine a host (what ``monarch host`` runs); returns on SIGINT/SIGTERM.

    ``address`` is the broker to register with (``nats://...``; default
    ``MONARCH_NATS_URL``): agents listen on no port of their own.
    """
    if private_key is not None or ca != "trust_all_connections":
        raise NotImplementedError("TLS is the broker's here: set MONARCH_NATS_TLS_* instead")
    url = address if address and "://" in address and not address.startswith("tcp://") else None
    url = url or settings().nats_url
    if not url:
        raise ValueError(
            "no broker to register with: pass address='nats://host:4222' or set MONARCH_NATS_URL"
        )
    loop = new_event_loop()
    try:
        loop.run_until_complete(run_agent(url, name=name, labels=labels, capacity=capacity))
    finally:
        loop.close()
