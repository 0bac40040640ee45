"""``AgentLauncher``: a proc mesh's procs, started by host agents instead of by us.

It has :class:`~monarch.actors.procs.local_launcher.LocalLauncher`'s interface, so
:class:`~monarch.actors.procs.proc_mesh_state.ProcMeshState` drives both the same way.
Proc rank ``r`` of a mesh with ``n`` procs per host runs on host ``r // n``.
The handles it returns have no ``popen``: a proc's end arrives as an ``exit``
message from its agent (on a port of ours), and ``ProcHandle.kill()`` asks the
agent (and, should the agent be silent, tells the proc itself to stop). The
owner watches each agent's heartbeat besides its procs' (see
``ProcMeshState._watch``): a host that goes silent takes its procs with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from monarch.actors.errors import ProcStartError
from monarch.actors.hosting.supervisor import supervisor_of
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.rpc import request_all
from monarch.actors.procs.command_launcher import BootstrapCommand, BootstrapSpec, command_to_wire
from monarch.actors.procs.launcher import ProcHandle
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.registry import HostInfo
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime
from monarch.hosts import protocol as p

log = logging.getLogger(__name__)

UNKNOWN_EXIT = -1
"""``returncode`` of a proc declared dead whose end its agent did not (or not yet) report."""


class AgentLauncher:
    """Starts and stops one proc mesh's procs through the agents of ``hosts`` (loop only)."""

    def __init__(
        self,
        rt: Runtime,
        hosts: list[HostInfo],
        per_host: int,
        *,
        command: BootstrapSpec | None = None,
        binds: list[dict[str, str]] | None = None,
    ) -> None:
        self.rt = rt
        self.hosts = hosts  # host rank -> agent
        self.per_host = max(per_host, 1)
        self.command = command  # the procs' bootstrap command (or a function of their point)
        self.binds = binds  # proc_bind (parsed by the caller), checked and applied by each agent
        self.handles: dict[str, ProcHandle] = {}
        self._on_exit: Callable[[ProcHandle, int], None] | None = None
        self._port_id: int | None = None
        self._gone: set[str] = set()  # agents declared dead
        self._abort: asyncio.Future | None = None

    async def launch(
        self,
        uids: list[str],
        ready_subject: str,
        extent: Extent,
        on_exit: Callable[[ProcHandle, int], None],
    ) -> list[ProcHandle]:
        rt = self.rt
        self._check_features(len(uids))
        commands = self._commands(extent, len(uids))  # a bad command fails here, before any start
        self._on_exit = on_exit
        self._port_id, exits = rt.open_port(self._on_exit_msg)
        handles = []
        for rank, uid in enumerate(uids):
            host = self.hosts[rank // self.per_host]
            h = ProcHandle(uid, rank, host_uid=host.uid)
            h.killer = lambda h=h: self._kill([h])
            handles.append(h)
            self.handles[uid] = h
        self._abort = rt.loop.create_future()
        sup = supervisor_of(rt)
        used = list({h.host_uid: self._host(h) for h in handles}.values())
        if sup is not None:
            for host in used:
                await sup.watcher.watch(host.uid, self._host_lost)
        spec = {
            "labels": extent.labels,
            "sizes": extent.sizes,
            "ready": ready_subject,
            "exits": exits,
            "owner": rt.proc_uid,
            "root": rt.root_uid,
            "settings": p.forwarded_settings(),
        }
        if self.binds is not None:
            spec["bind"] = self.binds
        requests = []
        for host in used:
            mine = [h for h in handles if h.host_uid == host.uid]
            body = {**spec, "procs": [[h.uid, h.rank] for h in mine]}
            if commands is not None:
                body["commands"] = [commands[h.rank] for h in mine]
            requests.append(
                (subjects.ctl_host(rt.namespace, host.uid), dumps(body), {m.KIND: p.SPAWN})
            )
        try:
            replies = await request_all(rt, requests, rt.settings.spawn_timeout, self._abort)
            for host, reply in zip(used, replies):
                if (reply.headers or {}).get(m.KIND) == "error":
                    err = m.decode_error(reply.data, actor_id=host.uid, rank=None, endpoint="spawn")
                    raise ProcStartError(
                        f"host {host.name} ({host.uid}) could not start procs: {err.exception}"
                    )
        except BaseException as e:
            self._kill(handles)  # whatever did start on the other hosts
            for h in handles:
                h.exited.set()
            self._close_port()
            if isinstance(e, ProcStartError):
                raise
            raise ProcStartError(f"starting procs on host agents failed: {e}") from e
        return handles

    def _host(self, h: ProcHandle) -> HostInfo:
        return self.hosts[h.rank // self.per_host]

    def _check_features(self, n: int) -> None:
        """Whether the agents of ``n`` procs take what this mesh asks of them.

        An agent of an older version would start the procs its own way, unbound,
        ignoring what it does not know: refused here instead, naming it.
        """
        asked = [
            (what, feature)
            for what, feature, given in (
                ("proc_bind", "bind", self.binds is not None),
                ("bootstrap_command", "command", self.command is not None),
            )
            if given
        ]
        used = {r // self.per_host: self.hosts[r // self.per_host] for r in range(n)}
        for host in used.values():
            for what, feature in asked:
                if feature not in host.features:
                    raise ProcStartError(
                        f"host agent {host.name} ({host.uid}) cannot start procs with a "
                        f"{what}: it runs an older monarch; upgrade it"
                    )

    def _commands(self, extent: Extent, n: int) -> list[dict[str, Any]] | None:
        """Each proc's bootstrap command, as the agents take it; None: their default."""
        if self.command is None:
            return None
        out = []
        for rank in range(n):
            cmd = self.command
            cmd = cmd(Point(rank, extent)) if callable(cmd) else cmd
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command gave {cmd!r}, not a BootstrapCommand")
            out.append(command_to_wire(cmd))
        return out

    # -- ends ------------------------------------------------------------------------

    def _on_exit_msg(self, msg: Any) -> None:
        if (msg.headers or {}).get(m.KIND) != p.EXIT:
            return
        try:
            report = loads(msg.data)
            h, code = self.handles.get(report["uid"]), int(report["code"])
        except Exception as e:
            log.warning("malformed exit report on %s: %r", msg.subject, e)
            return
        if h is None or h.exited.is_set():
            return
        h.exited.set()
        if self._on_exit is not None:
            self._on_exit(h, code)
        self._maybe_close_port()

    def _host_lost(self, host_uid: str, why: str) -> None:
        """An agent is silent or gone: its procs will never be reported; count them gone."""
        self._gone.add(host_uid)
        name = next((h.name for h in self.hosts if h.uid == host_uid), host_uid)
        if self._abort is not None and not self._abort.done():
            self._abort.set_exception(
                ProcStartError(f"host agent {name} ({host_uid}) is gone: {why}")
            )
            self._abort.exception()  # retrieved by request_all or nobody
        # After the owner's own watchers ran (they report "heartbeat_lost"), not before.
        self.rt.loop.call_soon(self._give_up_on, host_uid)

    def _give_up_on(self, host_uid: str) -> None:
        for h in self.handles.values():
            if h.host_uid == host_uid and not h.exited.is_set():
                if h.returncode is None:
                    h.returncode = UNKNOWN_EXIT
                h.exited.set()
        self._maybe_close_port()

    def _kill(self, handles: list[ProcHandle]) -> None:
        """Ask each agent to SIGKILL its procs; also tell the procs to stop, should it be silent.

        A proc already declared dead (``lost``) counts as gone from now on: its
        agent may never answer (it may be why the proc went silent), and a
        mesh's ``stop()`` must not wait for it.
        """
        rt, by_host = self.rt, {}
        for h in handles:
            if not h.exited.is_set():
                by_host.setdefault(h.host_uid, []).append(h.uid)
                if h.lost:
                    if h.returncode is None:
                        h.returncode = UNKNOWN_EXIT
                    h.exited.set()
        for host_uid, uids in by_host.items():
            rt.publish(subjects.ctl_host(rt.namespace, host_uid), dumps(uids), {m.KIND: p.KILL})
            if host_uid in self._gone:
                for uid in uids:
                    rt.publish(subjects.ctl_proc(rt.namespace, uid), b"", {m.KIND: "stop"})
        self._maybe_close_port()

    def _maybe_close_port(self) -> None:
        if all(h.exited.is_set() for h in self.handles.values()):
            self._close_port()

    def _close_port(self) -> None:
        if self._port_id is not None:
            self.rt.close_port(self._port_id)
            self._port_id = None

    async def wait_or_kill(self, handles: list[ProcHandle], timeout: float) -> None:
        """Wait up to ``timeout`` for each proc's exit report, then have the agents kill the rest.

        Procs on an agent that is gone are not waited for; a proc whose end is
        still unreported 5 s after the kill is given up on (logged).
        """
        pending = [h for h in handles if not h.exited.is_set()]
        await _wait_exited(pending, timeout)
        pending = [h for h in pending if not h.exited.is_set()]
        if pending:
            self._kill(pending)
            await _wait_exited(pending, 5.0)
        for h in pending:
            if not h.exited.is_set():
                log.warning("no exit report for proc %s from host agent %s", h.uid, h.host_uid)
                h.exited.set()
        self._maybe_close_port()


async def _wait_exited(handles: list[ProcHandle], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(h.exited.is_set() for h in handles):
        await asyncio.sleep(0.01)
