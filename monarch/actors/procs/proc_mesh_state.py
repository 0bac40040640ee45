"""The owner's side of a proc mesh: its state machine.

:class:`ProcMeshState` is shared by every view of one proc mesh and mutated on
the runtime loop: it starts the procs through a launcher (see
:mod:`monarch.actors.procs.launcher`), waits until each reports ready, learns
at once when one exits, spawns actor meshes on them and stops them. Kept apart
from the user API (:mod:`monarch.actors.procs.proc_mesh`) so that each reads as
one thing: what a mesh *does* here, and what a caller may ask of it.
:class:`LocalProcMeshState` is the calling process itself as a mesh of one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from monarch.actors.calls.mesh_state import MeshState, spawn_error
from monarch.actors.errors import (
    MeshStoppedError,
    ProcStartError,
    SpawnError,
    SupervisionError,
    process_exit_reason,
)
from monarch.actors.hosting.server import local_server
from monarch.actors.hosting.supervisor import supervisor_of
from monarch.actors.meshes.shape import Extent
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.rpc import request_all
from monarch.actors.procs.control_wait import ControlWait
from monarch.actors.procs.launcher import Launcher, ProcHandle
from monarch.actors.procs.log_collection import LogCollector
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.runtime import Runtime
from monarch.supervision.failure import MeshFailure

log = logging.getLogger(__name__)


class ProcMeshState:
    """Shared by all views of one proc mesh; mutated on the runtime loop."""

    def __init__(
        self,
        rt: Runtime,
        name: str,
        extent: Extent,
        launcher: Launcher,
        bootstrap: bytes | None = None,
    ) -> None:
        self.rt = rt
        # spawn_procs(bootstrap=fn): fn, encoded, for every proc to run before its first
        # actor (start() sends it once they are up; ready waits for it)
        self.bootstrap = bootstrap
        self.start_error: BaseException | None = None  # why start() failed, if it did
        # The HostMesh (or slice) that started these procs, and how many each host runs:
        # ProcMesh.host_mesh. Set by HostMesh.spawn_procs (the layer above); None here
        # for this_proc().
        self.hosts: Any = None
        self.procs_per_host = 1
        # Called (any thread) when stop() is asked, before anything stops: a layer
        # above (the tensor engine) sends what it still holds for this mesh.
        self.before_stop: list[Callable[[], None]] = []
        self.name = name
        self.uid = subjects.new_uid()
        self.extent = extent
        self.launcher = launcher
        self.procs: list[ProcHandle] = []
        # Every proc said it is ready, and our subscriptions to their heartbeats are
        # in place (start()): messages to them may go now.
        self.ready: asyncio.Future = rt.loop.create_future()
        self._said_ready: asyncio.Future = rt.loop.create_future()  # every proc said so
        self.launched = asyncio.Event()  # start() has finished, successfully or not
        self.settled = threading.Event()  # the same, for other threads (references wait on it)
        self.dead: asyncio.Future = rt.loop.create_future()  # completed by the first early exit
        self.actor_meshes: list[tuple[MeshState, list[int]]] = []
        self.stopping = False
        self.stopped: Future[None] | None = None
        self.spawning: dict[asyncio.Task, MeshState] = {}  # a spawn under way -> its mesh
        # Control requests running user code (spawns, the bootstrap) still waited on:
        # a proc lost meanwhile fails them at once (_proc_lost), a stop ends them.
        self.control_waits: set[ControlWait] = set()
        self.logs = LogCollector(rt, name)  # prints the procs' output here

    async def start(self) -> None:
        port_id, subject = self.rt.open_port(self._on_ready)
        self._ready_count = 0
        self._ready_uids: set[str] = set()
        try:
            uids = self.proc_uids()
            await self.logs.start(uids)  # before launch, so no early line is lost
            self.procs = await self.launcher.launch(
                uids, subject, self.extent, on_exit=self._on_exit
            )
            self._maybe_ready()  # forked procs may all have said "ready" before launch returned
            timeout = self.rt.settings.spawn_timeout
            launched = self.rt.loop.time()
            done, _ = await asyncio.wait(
                [self._said_ready, self.dead], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if self._said_ready not in done:
                if self.dead.done():
                    raise self.dead.exception()  # type: ignore[misc]
                raise self._not_ready(timeout, self.rt.loop.time() - launched)
            await self._watch()
            if self.dead.done():  # a proc ended while we started watching
                raise self.dead.exception()  # type: ignore[misc]
            if self.bootstrap is not None:
                await self._run_bootstrap(self.bootstrap)
            self.ready.set_result(None)
        except BaseException as e:
            self.start_error = e
            if not self.ready.done():
                self.ready.set_exception(e)
                self.ready.exception()  # mark retrieved; spawn() re-raises it
            await self.kill()
            raise
        finally:
            self.rt.close_port(port_id)
            self.launched.set()
            self.settled.set()

    async def _run_bootstrap(self, body: bytes) -> None:
        """Each proc runs the ``bootstrap`` function before anything else; its error raises here.

        A control message, so each proc runs it before the spawns that follow
        (its control messages are served one at a time, in order), and no spawn
        is sent before ``ready``, which waits for this. As in Monarch, the
        failure is an :class:`~monarch.actors.errors.ActorError` carrying the
        function's exception (``initialized`` and every spawn raise it).
        """
        replies = await self.ask_procs(
            f"bootstrapping proc mesh {self.name!r}",
            list(range(len(self.procs))),
            "bootstrap",
            body,
            error=ProcStartError,
        )
        for rank, reply in enumerate(replies):
            if reply is not None and (reply.headers or {}).get(m.KIND) == "error":
                raise m.decode_error(
                    reply.data, actor_id=self.procs[rank].uid, rank=rank, endpoint="bootstrap"
                )

    async def ask_procs(
        self,
        what: str,
        proc_ranks: list[int],
        kind: str,
        body: bytes,
        *,
        fail_fast: bool = False,
        error: type[Exception] = SpawnError,
    ) -> list[Any]:
        """A control request that runs user code on each of ``proc_ranks``; the replies.

        Waited for as long as the procs are alive and busy (see
        :mod:`monarch.actors.procs.control_wait`): MONARCH_SPAWN_TIMEOUT bounds
        only a proc's silence, and a proc lost meanwhile fails it at once.
        """
        handles = [self.procs[pr] for pr in proc_ranks]
        sup = supervisor_of(self.rt)
        wait = ControlWait(
            self.rt, what, [h.uid for h in handles], self._last_heard,
            unread_since=None if sup is None else sup.watcher.unread_since,
            fail_fast=fail_fast, error=error,
        )  # fmt: skip
        ns = self.rt.namespace
        self.control_waits.add(wait)
        try:
            for h in handles:
                if h.lost:
                    wait.proc_lost(h.uid, f"proc {h.uid} (rank {h.rank}) is already gone")
            return await wait.run(
                [subjects.ctl_proc(ns, h.uid) for h in handles],
                body,
                {m.KIND: kind},
                self.rt.settings.spawn_timeout,
            )
        finally:
            self.control_waits.discard(wait)

    def _last_heard(self, uid: str) -> float | None:
        """When ``uid``'s heartbeat was last heard here (a sign of life), if ever."""
        sup = supervisor_of(self.rt)
        return None if sup is None else sup.watcher.last_heard(uid)

    def proc_uids(self) -> list[str]:
        """The uids of this mesh's procs, known before they start (they are chosen here)."""
        if self.procs:
            return [p.uid for p in self.procs]
        return [f"{self.name}-{self.uid}-{r}" for r in range(self.extent.nelements)]

    def _on_ready(self, msg: Any) -> None:
        if (msg.headers or {}).get(m.KIND) != "ready" or self._said_ready.done():
            return
        self._ready_count += 1
        self._ready_uids.add((msg.headers or {}).get(m.FROM, ""))
        self._maybe_ready()

    def _not_ready(self, timeout: float, elapsed: float) -> ProcStartError:
        """Which procs did not report ready in time, and the setting that bounds it."""
        late = [p.rank for p in self.procs if p.uid not in self._ready_uids]
        return ProcStartError(
            f"procs of {self.name!r} ({len(self.procs)}): rank(s) "
            f"{', '.join(map(str, late)) or '?'} did not report ready within "
            f"MONARCH_SPAWN_TIMEOUT={timeout:g}s (elapsed {elapsed:.1f} s)"
        )

    def _maybe_ready(self) -> None:
        """Ready once every proc said so, and not before their handles are known:
        a spawn waiting on ``ready`` looks procs up by rank."""
        if not self._said_ready.done() and self.procs and self._ready_count >= len(self.procs):
            self._said_ready.set_result(None)

    def _on_exit(self, handle: ProcHandle, code: int) -> None:
        """A proc's process ended (the reaper thread hands this to the loop)."""
        handle.returncode = code
        if self.stopping:
            return
        sup = supervisor_of(self.rt)
        if sup is not None:
            sup.announce_exit(handle.uid, process_exit_reason(code))
        self._proc_lost(handle, "proc_died", process_exit_reason(code))

    def _proc_lost(self, handle: ProcHandle, reason: str, why: str) -> None:
        """Fail every actor on ``handle``'s proc: in-flight calls raise, owners hear of it."""
        if handle.lost or self.stopping:
            return
        handle.lost = True
        lost = SupervisionError(
            f"proc {handle.uid} (rank {handle.rank} of proc mesh {self.name!r}) is gone: {why}",
            actor_id=handle.uid,
            rank=handle.rank,
        )
        for wait in list(self.control_waits):  # a spawn waiting on it fails now, saying why
            wait.proc_lost(handle.uid, lost)
        if not self.ready.done() and not self.dead.done():
            err = ProcStartError(f"proc {handle.uid} ended before it was ready: {why}")
            self.dead.set_exception(err)
            self.dead.exception()
        sup = supervisor_of(self.rt)
        for mesh_state, proc_ranks in self.actor_meshes:
            ranks = [i for i, pr in enumerate(proc_ranks) if pr == handle.rank]
            if not ranks:
                continue
            mesh_state.mark_dead(ranks, _while_spawning(mesh_state, ranks, lost))
            if sup is not None:
                # Monarch's words first ("the process this actor was running on
                # failed: Killed(sig=9)"), then which proc it was.
                failure = MeshFailure(
                    mesh_state.name, mesh_state.uid, ranks, reason,
                    f"the process this actor was running on failed: {why} "
                    f"(proc {handle.uid} hosting rank(s) {ranks})",
                )  # fmt: skip
                sup.report(mesh_state.owner_proc, mesh_state.owner_actor, failure)
        if handle.returncode is None:
            handle.kill()  # declared dead while maybe still running: no orphans

    async def _watch(self) -> None:
        """Owners also watch heartbeats: a silent (hung, stopped, cut off) proc is dead too.

        Returns once the broker holds our subscriptions to their heartbeats (bounded):
        a first call may make a proc import torch at once, and the heartbeat that
        announces it must reach us (:meth:`Watcher.listening`).
        """
        sup = supervisor_of(self.rt)
        if sup is None:
            return
        watched: list[str] = []
        for h in self.procs:

            def lost(uid: str, why: str, h: ProcHandle = h) -> None:
                if h.returncode is None:  # an exit is reported by the reaper, with its code
                    self._proc_lost(h, "heartbeat_lost", why)

            await sup.watcher.watch(h.uid, lost)
            watched.append(h.uid)
            if h.host_uid is not None:  # a silent host agent takes its procs with it
                await sup.watcher.watch(
                    h.host_uid,
                    lambda uid, why, lost=lost: lost(uid, f"its host agent {uid} is gone: {why}"),
                )
        await sup.watcher.listening(watched)

    async def spawn_actors(
        self, mesh_state: MeshState, proc_ranks: list[int], body: bytes, per_proc: int = 1
    ) -> None:
        """Spawn the mesh's actors, ``per_proc`` on each of ``proc_ranks`` (``ProcMesh.per_proc``:
        the actor at rank ``i * per_proc + j`` lives on the proc at position ``i``)."""
        try:
            await asyncio.shield(self.ready)
        except BaseException as e:
            # The procs never started: no actor was made, none failed. The mesh's calls
            # raise why, as a spawn after the start failed does (ProcMesh._spawn), and
            # nothing is reported to supervision: Monarch 0.7's spawn on such a mesh
            # raises at the call and leaves its client running.
            mesh_state.mark_failed(spawn_error(mesh_state.name, 0, e))
            return
        try:
            if self.stopping:
                raise MeshStoppedError(f"`ProcMesh` has already been stopped ({self.name!r})")
            # A slow __init__ on live procs is waited for; the first to fail fails it all.
            replies = await self.ask_procs(
                f"spawning actor mesh {mesh_state.name!r}", proc_ranks, "spawn", body,
                fail_fast=True,
            )  # fmt: skip
            for position, reply in enumerate(replies):
                headers = (reply.headers or {}) if reply is not None else {}
                if headers.get(m.KIND) == "error":
                    rank = int(headers.get(m.ACTOR_RANK) or position * per_proc)
                    err = m.decode_error(
                        reply.data,
                        actor_id=mesh_state.actor_id(rank),
                        rank=rank,
                        endpoint="__init__",
                    )
                    raise spawn_error(mesh_state.name, rank, err)
        except BaseException as e:
            mesh_state.mark_failed(e)
            sup = supervisor_of(self.rt)
            if sup is not None and not isinstance(e, MeshStoppedError):
                cause = getattr(e, "__cause__", None)
                failure = MeshFailure(
                    mesh_state.name, mesh_state.uid, list(range(len(proc_ranks) * per_proc)),
                    "init_failed",
                    str(e), exception=e, traceback=getattr(cause, "traceback", ""),
                )  # fmt: skip
                sup.report(mesh_state.owner_proc, mesh_state.owner_actor, failure)
            return
        mesh_state.proc_uids = [self.procs[pr].uid for pr in proc_ranks for _ in range(per_proc)]
        self._bind_local(mesh_state)
        mesh_state.mark_ready()

    def _bind_local(self, mesh_state: MeshState) -> None:
        """Meshes on procs elsewhere are reached through the broker (see LocalProcMeshState)."""

    async def stop(
        self, procs: list[ProcHandle] | None = None, spawn_wait: float | None = None
    ) -> None:
        """Stop gracefully (actors drain and clean up), then kill what is left.

        Waits for a start that is still under way, so procs that come up
        after ``stop()`` was called are stopped too, and for spawns already
        asked for, at most ``spawn_wait`` seconds (default MONARCH_SPAWN_TIMEOUT).
        """
        await self.launched.wait()
        # Spawns already asked for complete first, so messages queued behind
        # them are delivered before the procs are told to stop; not the spawn of a
        # mesh stopped meanwhile (its __init__ may never end): nothing waits for it.
        waiting = [task for task, mesh in self.spawning.items() if mesh.stopped is None]
        if waiting:
            if spawn_wait is None:
                spawn_wait = self.rt.settings.spawn_timeout
            await asyncio.wait(waiting, timeout=spawn_wait)
        for wait in list(self.control_waits):  # an __init__ still running is not waited for
            wait.abort(MeshStoppedError(f"`ProcMesh` {self.name!r} was stopped while spawning"))
        self.stopping = True
        procs = self.procs if procs is None else procs
        for mesh_state, _ in self.actor_meshes:
            mesh_state.mark_stopped("its proc mesh was stopped")
        live = [p for p in procs if p.returncode is None and not p.lost]
        if self.rt.nc is None or not self.rt.nc.is_connected:
            live_to_ask: list[ProcHandle] = []  # no broker: nobody would hear a stop request
        else:
            live_to_ask = live
        if self.ready.done() and not self.ready.exception() and live_to_ask:
            requests = [
                (subjects.ctl_proc(self.rt.namespace, p.uid), b"", {m.KIND: "stop"})
                for p in live_to_ask
            ]
            try:
                await request_all(self.rt, requests, self.rt.settings.stop_timeout, absent_ok=True)
            except Exception as e:
                log.warning("graceful stop of %r incomplete: %s", self.name, e)
        await self.launcher.wait_or_kill(live, timeout=5.0 if live_to_ask else 0.0)
        await self.logs.stop()

    async def shutdown(self) -> None:
        """At client exit: stop whatever is still running, quickly.

        An ``__init__`` still running is waited for at most half the stop
        timeout: the client's exit gives its whole close MONARCH_STOP_TIMEOUT
        (and a little), and the procs' graceful stop needs the rest.
        """
        if not self.launched.is_set() or any(
            p.returncode is None and not p.exited.is_set() for p in self.procs
        ):
            await self.stop(spawn_wait=self.rt.settings.stop_timeout / 2)

    async def kill(self) -> None:
        self.stopping = True
        await self.launcher.wait_or_kill([p for p in self.procs if p.returncode is None], timeout=0)
        await self.logs.stop()


class LocalProcMeshState(ProcMeshState):
    """The calling process itself as a proc mesh of one (``this_proc()``).

    Actors spawned here run in this process; messages to them from this
    process skip the broker (see ``MeshState.local``).
    """

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt, "local", Extent([], []), launcher=None)  # type: ignore[arg-type]
        self.procs = [ProcHandle(rt.proc_uid, 0)]
        self.ready.set_result(None)
        self.launched.set()
        self.settled.set()

        self.server = local_server(rt)

    def _bind_local(self, mesh_state: MeshState) -> None:
        mesh_state.local = self.server.actors.get(mesh_state.uid)

    async def stop(
        self, procs: list[ProcHandle] | None = None, spawn_wait: float | None = None
    ) -> None:
        """Stops the actors spawned here; the process itself goes on."""
        for mesh_state, _ in self.actor_meshes:
            await mesh_state.stop_actors()

    async def shutdown(self) -> None:
        await self.stop()


def _while_spawning(mesh_state: MeshState, ranks: list[int], exc: BaseException) -> BaseException:
    """What calls to ``ranks`` raise once their proc is gone: a :class:`SpawnError` while
    the mesh is still being spawned (its proc died in ``__init__``), else ``exc``."""
    if mesh_state.ready or mesh_state.error is not None:
        return exc
    return spawn_error(mesh_state.name, ranks[0], exc)
