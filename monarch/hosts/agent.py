"""The host agent (``monarch host``): starts, reaps and kills procs on its machine.

An agent connects to the broker, registers in the ``monarch-<ns>-hosts`` KV
bucket, heartbeats on ``mon.<ns>.hb.<host-uid>`` and serves requests on
``mon.<ns>.ctl.host.<host-uid>`` (see :mod:`monarch.hosts.protocol`), one at a
time, in order. Procs are started exactly as a client starts local ones
(``python -m monarch.actors.hosting.proc``, environment from
:func:`monarch.actors.procs.launcher.proc_env`), but with the *requesting client*
as their owner, so they exit when it dies; the agent also watches each
owner's heartbeat and kills the procs of an owner that is gone. Each proc
gets a reaper thread blocked in ``wait()``, so its end is reported to its
owner the moment it happens. The kernel kills the procs if the agent dies
(``PR_SET_PDEATHSIG``), so a killed agent takes its procs with it, as a
machine that goes down would.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from nats.aio.msg import Msg

from monarch.actors.errors import process_exit_reason
from monarch.actors.meshes.shape import Extent
from monarch.actors.messaging import messages as m
from monarch.actors.procs.command_launcher import (
    BootstrapCommand,
    command_argv,
    command_env,
    command_from_wire,
    default_bootstrap_cmd,
    prepare_child,
)
from monarch.actors.procs.launcher import popen_proc, proc_env, reap_in_thread
from monarch.actors.procs.proc_bind import ProcBind, parse_binds
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.registry import HOST_UID_ENV, HOSTS, PROCS, HostInfo, open_bucket
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.broker.vocabulary import subjects
from monarch.hosts import protocol as p
from monarch.hosts.connect import connect, local_address
from monarch.hosts.stop_signals import ignore_stop_signals, stop_on_signals
from monarch.settings import Settings, settings
from monarch.supervision.heartbeat import Heartbeater
from monarch.supervision.streams import ensure_streams
from monarch.supervision.watcher import Watcher, announce_dead

log = logging.getLogger("monarch.host")

_GRACE = 3.0  # seconds procs get to exit after SIGTERM when the agent stops


def host_uid(name: str) -> str:
    """A subject token that reads as the host's name: ``node-3.example`` -> ``node-3-example-1a2b3c4d``."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-_") or "host"
    return f"{safe[:40]}-{subjects.new_uid()}"


@dataclass
class Child:
    """A proc this agent started, and who to tell when it ends."""

    uid: str
    popen: subprocess.Popen
    owner: str  # the requesting client's proc uid
    exits: str  # subject its exit is reported to


class HostAgent:
    """One machine's agent. ``await start()``, then ``await close()`` to leave cleanly."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        capacity: int | None = None,
        cfg: Settings | None = None,
    ) -> None:
        self.url = url
        self.cfg = cfg or settings()
        self.ns = self.cfg.namespace
        self.name = name or socket.gethostname()
        self.uid = host_uid(self.name)
        self.labels = dict(labels or {})
        self.capacity = capacity
        self.children: dict[str, Child] = {}
        self.info: HostInfo | None = None
        self._tasks: set[asyncio.Task] = set()

    # -- life ---------------------------------------------------------------------

    async def start(self, connect_timeout: float = 60.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.nc = await connect(
            self.url,
            f"monarch-host-{self.uid}",
            connect_timeout,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        # Procs get every server we were given, not the one we happen to be on: a
        # proc started after that server went away must still reach the broker.
        self.proc_url = self.url
        await ensure_streams(self.nc, self.ns)
        self.info = HostInfo(
            uid=self.uid,
            name=self.name,
            address=local_address(self.nc),
            labels=self.labels,
            capacity=self.capacity,
            pid=os.getpid(),
            started_at=time.time(),
            heartbeat_interval=self.cfg.heartbeat_interval,
            features=list(p.FEATURES),
        )
        self.hosts_kv = await open_bucket(self.nc, self.ns, HOSTS)
        self.procs_kv = await open_bucket(self.nc, self.ns, PROCS)
        # Off the loop, on a connection of its own (see monarch.supervision.heartbeat),
        # which also hears the heartbeats of the owners we watch.
        own_connection = functools.partial(connect, self.url, f"monarch-host-{self.uid}-heartbeat")
        self.heartbeater = Heartbeater(
            self.ns, self.uid, self.cfg.heartbeat_interval, own_connection
        )
        self.watcher = Watcher(
            self.nc,
            self.ns,
            self.cfg.heartbeat_timeout,
            self.heartbeater.listen,
            announcements=functools.partial(subscribe_ordered, self.nc),
        )
        self.watcher.follow(self.heartbeater, self.loop)
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub = await subscribe_ordered(
            self.nc, subjects.ctl_host(self.ns, self.uid), self._queue.put_nowait
        )
        self._serve_task = self.loop.create_task(self._serve())
        # Only once the server has our subscription may clients find us.
        await self.nc.flush()
        await self._register()
        self.heartbeater.start()

    async def _register(self) -> None:
        """Put our entry (again after a reconnect: the broker may have lost it)."""
        if self.info is not None:
            await self.hosts_kv.put(self.uid, self.info.to_json())

    async def _on_disconnected(self) -> None:
        # Cut off from the broker, we hear no owner: their silence means nothing until we
        # are back (procs give up on their own after MONARCH_BROKER_LOST_TIMEOUT).
        if hasattr(self, "watcher"):
            self.watcher.pause()

    async def _on_reconnected(self) -> None:
        if hasattr(self, "watcher"):
            self.watcher.resume()
        with contextlib.suppress(Exception):
            await self._register()

    async def close(self) -> None:
        """Stop every proc (SIGTERM, then SIGKILL), report their exits, deregister, go."""
        self._serve_task.cancel()
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()
        for child in list(self.children.values()):
            with contextlib.suppress(ProcessLookupError):
                child.popen.terminate()
        await self._wait_children(_GRACE)
        for child in list(self.children.values()):
            with contextlib.suppress(ProcessLookupError):
                child.popen.kill()
        await self._wait_children(_GRACE)
        if self._tasks:  # the exit reports
            await asyncio.wait(list(self._tasks), timeout=5)
        with contextlib.suppress(Exception):
            await self.hosts_kv.delete(self.uid)
        await self.heartbeater.stop()
        await self.watcher.stop()
        with contextlib.suppress(Exception):
            await announce_dead(self.nc, self.ns, self.uid, f"host agent {self.name} stopped")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.drain(), 5)

    async def _wait_children(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.children and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    # -- requests -------------------------------------------------------------------

    async def _serve(self) -> None:
        while True:
            msg = await self._queue.get()
            kind = (msg.headers or {}).get(m.KIND, "")
            try:
                handler = {p.SPAWN: self._spawn, p.KILL: self._kill, p.PING: self._ping}.get(kind)
                if handler is None:
                    raise ValueError(f"host agent: unknown request kind {kind!r}")
                ok, body = True, dumps(await handler(msg))
            except Exception as e:
                log.warning("%s request failed: %s", kind, e)
                ok, body = False, m.encode_error(e)
            if msg.reply:
                rank = (msg.headers or {}).get(m.RANK, "0")
                headers = {m.KIND: "ok" if ok else "error", m.RANK: rank, m.FROM: self.uid}
                with contextlib.suppress(Exception):
                    await self.nc.publish(msg.reply, body, headers=headers)

    async def _ping(self, msg: Msg) -> dict[str, Any]:
        return {**asdict(self.info), "procs": sorted(self.children)}  # type: ignore[arg-type]

    async def _kill(self, msg: Msg) -> list[str]:
        killed = []
        for uid in loads(msg.data):
            child = self.children.get(uid)
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()
                killed.append(uid)
        return killed

    async def _spawn(self, msg: Msg) -> dict[str, int]:
        spec = loads(msg.data)
        procs = [(str(uid), int(rank)) for uid, rank in spec["procs"]]
        if self.capacity is not None and len(self.children) + len(procs) > self.capacity:
            raise RuntimeError(
                f"host {self.name} runs {len(self.children)} procs and takes at most "
                f"{self.capacity}; {len(procs)} more do not fit"
            )
        extent = Extent(spec["labels"], spec["sizes"])
        binds = self._binds(spec.get("bind"))
        commands = self._commands(spec.get("commands"), len(procs))
        started: dict[str, int] = {}
        try:
            for i, (uid, rank) in enumerate(procs):
                subjects.check_token(uid, "proc uid")
                bind = binds[rank % len(binds)] if binds else None
                command = commands[i] if commands else None
                popen = self._popen(uid, spec, extent, rank, command, bind)
                child = Child(uid, popen, spec["owner"], spec["exits"])
                self.children[uid] = child
                reap_in_thread(child.popen, f"reaper-{uid}", functools.partial(self._reap, child))
                started[uid] = child.popen.pid
        except BaseException:
            for uid in started:
                with contextlib.suppress(ProcessLookupError):
                    self.children[uid].popen.kill()
            raise
        await self.watcher.watch(spec["owner"], self._owner_gone)
        return started

    def _binds(self, dicts: Any) -> list[ProcBind] | None:
        """The mesh's ``proc_bind``, checked against this machine before any proc starts."""
        if dicts is None:
            return None
        if not isinstance(dicts, list) or not dicts:
            raise ValueError(f"malformed proc_bind {dicts!r}")
        binds = parse_binds(dicts, len(dicts))
        for bind in binds:
            bind.check_here()
        return binds

    def _commands(self, wire: Any, n: int) -> list[BootstrapCommand] | None:
        """The client's bootstrap command for each proc, if it sent any.

        With pickle allowed, whoever may spawn procs here may already make them run
        any code (actors travel by cloudpickle): a command is no more. With
        ``MONARCH_PICKLE=0`` the agent runs only importable code, so it refuses one.
        """
        if wire is None:
            return None
        if not self.cfg.pickle:
            raise PermissionError(
                f"host agent {self.name} runs with MONARCH_PICKLE=0 and starts procs only with "
                "its own command; start it with the Python and environment the procs need"
            )
        if not isinstance(wire, list) or len(wire) != n:
            raise ValueError(f"malformed bootstrap commands: {n} procs, got {wire!r}")
        return [command_from_wire(c) for c in wire]

    def _popen(
        self,
        uid: str,
        spec: dict,
        extent: Extent,
        rank: int,
        command: BootstrapCommand | None = None,
        bind: ProcBind | None = None,
    ) -> subprocess.Popen:
        env = proc_env(extent, rank)  # our environment, import path, rank and point
        env.update(spec.get("settings") or {})  # the job's MONARCH_* settings
        env.update(
            {
                "MONARCH_NATS_URL": self.proc_url,
                "MONARCH_ROOT_PROC": spec["root"],
                "MONARCH_OWNER_PROC": spec["owner"],  # it exits when its client dies
                HOST_UID_ENV: self.uid,
            }
        )
        if "gpus" in extent.labels:  # each proc sees only its own device of this host
            coord = extent.coords(rank)[extent.labels.index("gpus")]
            env["CUDA_VISIBLE_DEVICES"] = p.visible_device(
                os.environ.get("CUDA_VISIBLE_DEVICES"), coord
            )
        if command is not None:
            env = command_env(env, command)
        argv, program = command_argv(command or default_bootstrap_cmd(), uid, spec["ready"], bind)
        # its own session: a Ctrl-C at the agent's terminal is for the agent
        tie = self.cfg.die_with_parent
        prepare = functools.partial(prepare_child, os.getpid(), tie, bind) if tie or bind else None
        return popen_proc(argv, env, prepare, executable=program)

    # -- ends -----------------------------------------------------------------------

    def _reap(self, child: Child, code: int) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed: nobody left to tell
            self.loop.call_soon_threadsafe(self._exited, child, code)

    def _exited(self, child: Child, code: int) -> None:
        self.children.pop(child.uid, None)
        task = self.loop.create_task(self._report_exit(child, code))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_exit(self, child: Child, code: int) -> None:
        """Tell the owner first (it learns the code), then every watcher of the proc."""
        why = process_exit_reason(code)
        headers = {m.KIND: p.EXIT, p.PROC: child.uid, m.FROM: self.uid}
        try:
            await self.nc.publish(
                child.exits, dumps({"uid": child.uid, "code": code}), headers=headers
            )
            await announce_dead(self.nc, self.ns, child.uid, why)
            await self.procs_kv.delete(child.uid)  # a killed proc could not remove its entry
        except Exception as e:
            log.warning("could not report the exit of %s: %r", child.uid, e)

    def _owner_gone(self, owner: str, why: str) -> None:
        """No orphans: the procs of a client that is gone have nobody to serve."""
        for child in list(self.children.values()):
            if child.owner == owner:
                log.warning("owner %s of %s is gone (%s): killing it", owner, child.uid, why)
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()


async def run_agent(
    url: str,
    *,
    name: str | None = None,
    labels: dict[str, str] | None = None,
    capacity: int | None = None,
    connect_timeout: float = 60.0,
) -> None:
    """Run an agent until SIGINT or SIGTERM, then leave cleanly (procs stopped, entry removed)."""
    agent = HostAgent(url, name=name, labels=labels, capacity=capacity)
    await agent.start(connect_timeout)
    stop = asyncio.Event()
    stop_on_signals(asyncio.get_running_loop(), stop)  # a later signal: ignored, not fatal
    info = agent.info
    assert info is not None
    print(
        f"monarch host {info.name} ({info.uid}) at {info.address}, pid {info.pid}: serving "
        f"{subjects.ctl_host(agent.ns, agent.uid)} on {url}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        ignore_stop_signals()
        await agent.close()
        print(f"monarch host {info.name} ({info.uid}) stopped", flush=True)
