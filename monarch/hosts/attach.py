"""Host meshes from registered host agents: Monarch's ``attach_to_workers`` and friends.

In Monarch a worker is a ``tcp://host:port`` a client dials. Here agents
(``monarch host``, or :func:`run_worker_loop_forever` given a broker) register
in the broker, and a client picks from the registered agents that are beating:
``attach_to_workers`` takes their names, a count or "all of them". A worker
started Monarch's way, ``run_worker_loop_forever(address="tcp://host:port")``
(or ``ipc://path``) with no broker, listens there instead, and a client given
that address dials it and hands it its broker (:mod:`monarch.hosts.dial_in`);
an address nobody listens on also matches registered agents by host name or
IP. Unlike Monarch's, ``attach_to_workers`` returns once the hosts are found
(bounded by ``timeout``), so ``initialized`` is already done; hosts not found
give, as in Monarch, a mesh whose ``initialized`` raises why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client

from monarch.actors.meshes.shape import Extent, View
from monarch.actors.procs.host_mesh import HostMesh
from monarch.broker.connections.registry import HeartbeatSeen, HostInfo, list_hosts
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.core.runtime import new_event_loop
from monarch.hosts import dial_in
from monarch.hosts.agent import run_agent
from monarch.hosts.launcher import AgentLauncher
from monarch.settings import settings

log = logging.getLogger(__name__)

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
    lifelines: list[Any] | None = None,
    push_timeout: float | None = None,
) -> list[HostInfo]:
    """Registered, beating agents: the named ``workers``, ``count`` of them, or all.

    Waits (up to ``timeout`` seconds) until enough are there; raises
    TimeoutError saying what was missing. Hosts come in ``workers`` order, else
    by name then uid. Given ``lifelines``, a worker that is an address is also
    dialled (see :mod:`monarch.hosts.dial_in`); the connection of each that
    answers is appended there, for the caller to keep open while it uses it.
    An address that neither answers nor names a registered agent within
    ``push_timeout`` seconds (Monarch's ``mesh_attach_config_timeout``) fails
    the search then, naming it: its worker never took our settings.
    """
    start = time.monotonic()
    deadline = start + timeout
    push_deadline = start + min(timeout, push_timeout if push_timeout is not None else timeout)
    workers = list(workers) if workers is not None else None
    async with HeartbeatSeen(nc, namespace) as seen:
        while True:
            if workers is not None and lifelines is not None:
                await _dial_workers(workers, lifelines, deadline, push_deadline)
            hosts = [h for h in await list_hosts(nc, namespace) if h.has_labels(labels)]
            chosen, missing = _pick(hosts, seen, workers, count)
            if chosen is not None:
                return chosen
            if workers is not None and lifelines is not None and time.monotonic() >= push_deadline:
                _fail_unreached(workers, hosts, push_deadline - start)
            if time.monotonic() >= deadline:
                known = ", ".join(f"{h.name} ({h.uid})" for h in hosts) or "none"
                raise TimeoutError(
                    f"host agents not found within {timeout} s: {missing}; registered in "
                    f"namespace {namespace!r}{f' with labels {labels}' if labels else ''}: {known}. "
                    "Start agents with `monarch host` (same MONARCH_NATS_URL and MONARCH_NAMESPACE)."
                )
            await asyncio.sleep(_POLL)


def _fail_unreached(workers: list[str], hosts: list[HostInfo], waited: float) -> None:
    """Raise naming the addresses whose workers never answered and that name no agent."""
    unreached = [
        w for w in workers if dial_in.is_dialable(w) and not any(h.matches(w) for h in hosts)
    ]
    if unreached:
        raise TimeoutError(
            f"attach failed: config push failed during attach: no worker took the client's "
            f"settings at {', '.join(unreached)} within {waited:g} s "
            "(mesh_attach_config_timeout, MONARCH_ATTACH_TIMEOUT). Is "
            "run_worker_loop_forever(address=...) running there?"
        )


async def _dial_workers(
    workers: list[str], lifelines: list[Any], deadline: float, push_deadline: float
) -> None:
    """Replace each address in ``workers`` whose worker answers by its agent's uid."""
    todo = [i for i, w in enumerate(workers) if dial_in.is_dialable(w)]
    now = time.monotonic()
    left, push_left = max(1.0, deadline - now), push_deadline - now
    answers = await asyncio.gather(*(dial_in.dial(workers[i], left, push_left) for i in todo))
    for i, answer in zip(todo, answers):
        if answer is not None:
            workers[i], line = answer
            lifelines.append(line)


def _refuse_monarch_tls(ca: Any, private_key: Any) -> None:
    """Monarch's own TLS between client and workers: here TLS is the broker's."""
    if private_key is not None or ca != "trust_all_connections":
        raise NotImplementedError(
            "TLS between client and hosts is the broker's: set MONARCH_NATS_TLS_CA (and "
            "MONARCH_NATS_TLS_CERT/KEY) instead of ca/private_key"
        )


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
    keeps agents started with all of those ``--labels``. Hosts not found within
    ``timeout`` seconds, or an address whose worker does not take the client's
    settings within ``mesh_attach_config_timeout`` (``monarch.configure``;
    ``MONARCH_ATTACH_TIMEOUT``; read at each call), give a mesh whose
    ``initialized`` and ``spawn_procs`` raise a ``TimeoutError`` naming them,
    as Monarch's (which checks at ``initialized``); it is logged as a warning
    too (:func:`attach_host_mesh` raises it instead). Wrong arguments raise
    here. TLS is the broker's business here: ``ca`` and ``private_key`` must
    stay at their defaults (use ``MONARCH_NATS_TLS_*``).
    """
    del name  # Monarch's name for the mesh; ours are found by their agents' names
    _refuse_monarch_tls(ca, private_key)
    try:
        return attach_host_mesh(workers=workers, hosts=hosts, labels=labels, timeout=timeout)
    except TimeoutError as e:
        log.warning("%s", e)
        asked = len(workers) if workers is not None else (hosts or 1)
        return HostMesh(
            View.full(Extent(["hosts"], [asked])), [], agent_launcher=AgentLauncher, failed=e
        )


def attach_host_mesh(
    *,
    workers: Sequence[Any] | None = None,
    hosts: int | None = None,
    labels: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> HostMesh:
    """:func:`attach_to_workers` that raises ``TimeoutError`` when the hosts are not found.

    What the jobs use: they retry, or say which mesh of theirs is not ready.
    """
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
    lifelines: list[Any] = []
    coro = find_hosts(
        rt.nc, rt.namespace, workers=names, count=hosts, labels=labels, timeout=timeout,
        lifelines=lifelines, push_timeout=settings().attach_timeout,
    )  # fmt: skip
    try:
        found = rt.run_coro(coro).result(timeout + 30)
    finally:
        for line in lifelines:  # dialled workers serve us until the runtime closes
            rt.on_close(line.close)

    def end_dialled_workers() -> None:
        for line in lifelines:
            dial_in.shutdown_lifeline(line)

    def hang_up_on_dialled_workers() -> None:  # they wait for the next client
        for line in lifelines:
            line.close()

    return HostMesh(
        View.full(Extent(["hosts"], [len(found)])),
        found,
        agent_launcher=AgentLauncher,
        on_shutdown=end_dialled_workers if lifelines else None,
        on_stop=hang_up_on_dialled_workers if lifelines else None,
    )


def run_worker_loop_until_shutdown(
    *, address: str, ca: Any = "trust_all_connections", private_key: Any = None
) -> None:
    """Serve as a worker at ``address`` until the client's ``HostMesh.shutdown()``; then return.

    Monarch 0.7's variant of :func:`run_worker_loop_forever` that returns
    instead of ending the process. Here that one returns too (this process is
    never ended for the worker), so this is it with ``address`` required.
    """
    run_worker_loop_forever(address=address, ca=ca, private_key=private_key)


def start_worker_loop_forever(
    *, address: str, ca: Any = "trust_all_connections", private_key: Any = None
) -> Future[None]:
    """Start serving as a worker at ``address`` on a thread; a ``Future`` of its end.

    As Monarch 0.7's: when this returns the worker listens (a client may
    attach at once), and it goes on if the future is dropped; ``get()``
    waits until a client shuts its host mesh down (``None``) or the worker
    fails (raises). ``address`` is a worker address (``tcp://``, ``ipc://``);
    SIGINT and SIGTERM stay the calling program's (a thread cannot take them).
    """
    _refuse_monarch_tls(ca, private_key)
    if not dial_in.is_dialable(address):
        raise ValueError(
            f"start_worker_loop_forever needs a worker address (tcp://host:port, ipc://path), "
            f"not {address!r}: to register with a broker use run_worker_loop_forever"
        )
    worker = dial_in.DialInWorker(address)
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    def serve() -> None:
        loop = new_event_loop()
        try:
            loop.run_until_complete(worker.serve_forever())
            ended.set_result(None)
        except BaseException as e:  # noqa: BLE001  (handed to whoever waits on the future)
            ended.set_exception(e)
        finally:
            loop.close()

    threading.Thread(target=serve, name=f"monarch-worker {address}", daemon=True).start()
    while not worker.listening.wait(0.05):
        if ended.done():
            ended.result()  # it could not listen there: raise why, here
    return Future(ended)


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

    ``address`` a broker (``nats://...``): register there (default:
    ``MONARCH_NATS_URL``). ``address`` a Monarch worker address
    (``tcp://host:port``, ``tcp://host:fdN``, ``ipc://path``, ``dial@bind``):
    listen there for a client's ``attach_to_workers``, which hands over its
    broker; serve one client at a time, until one shuts its host mesh down.
    """
    _refuse_monarch_tls(ca, private_key)
    # A Monarch worker address means "listen there", as in Monarch, even when this
    # process inherited a MONARCH_NATS_URL (a client's clients hand it on); a broker
    # address, or none, means "register with that broker".
    listen = bool(address) and dial_in.is_dialable(address)
    url = address if address and "://" in address and not listen else None
    url = url or (None if listen else settings().nats_url)
    loop = new_event_loop()
    try:
        if listen:
            worker = dial_in.DialInWorker(address, name=name, labels=labels, capacity=capacity)
            loop.run_until_complete(worker.serve_forever())
        elif url:
            loop.run_until_complete(run_agent(url, name=name, labels=labels, capacity=capacity))
        else:
            raise ValueError(
                "no broker to register with and no address to listen on: pass "
                "address='nats://host:4222' or 'tcp://host:port', or set MONARCH_NATS_URL"
            )
    finally:
        loop.close()
