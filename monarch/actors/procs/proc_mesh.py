"""``ProcMesh``: a mesh of OS processes that host actors.

The owner side of a set of procs: it starts them (through a launcher, see
:mod:`monarch.actors.procs.launcher`), waits until each reports ready, spawns actor
meshes on them, learns at once when one exits (its reaper thread), and stops
them. Every proc mesh is stopped when the client exits, so none outlives it.

A ``ProcMesh`` is also a reference that travels: as an endpoint argument or
return value, alone or inside any picklable value. Where it lands it spawns
actors on the same procs (those actors are owned by whoever spawned them) and
hears of their deaths; only the owner may stop it (see :class:`ProcMeshRef`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from monarch.actors.calls.actor import check_actor_class, class_ref
from monarch.actors.calls.actor_mesh import ActorMesh
from monarch.actors.calls.context import (
    actor_context,
    context,
    sender_id,
    set_proc_mesh_decoder,
    set_this_proc,
)
from monarch.actors.calls.endpoint import endpoints_of
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
from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.rpc import request_all
from monarch.actors.process_state import actor_process
from monarch.actors.procs import mesh_table
from monarch.actors.procs.control_wait import ControlWait
from monarch.actors.procs.launcher import Launcher, ProcHandle
from monarch.actors.procs.log_collection import LogCollector, LogMode
from monarch.broker.bodies.codec import PicklingForbiddenError
from monarch.broker.bodies.ext import register_ext
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import encode_body
from monarch.supervision.failure import MeshFailure

log = logging.getLogger(__name__)
A = TypeVar("A")

# This machine as a HostMesh (``this_host()``), handed in by the layer above
# (monarch.actors.procs.host_mesh) when it is imported: ``this_proc().host_mesh``.
_this_host: Any = None


def set_this_host(mesh: Any) -> None:
    global _this_host
    _this_host = mesh


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
        self.spawning: set[asyncio.Task] = set()
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

    async def spawn_actors(self, mesh_state: MeshState, proc_ranks: list[int], body: bytes) -> None:
        try:
            await asyncio.shield(self.ready)
            if self.stopping:
                raise MeshStoppedError(f"`ProcMesh` has already been stopped ({self.name!r})")
            # A slow __init__ on live procs is waited for; the first to fail fails it all.
            replies = await self.ask_procs(
                f"spawning actor mesh {mesh_state.name!r}", proc_ranks, "spawn", body,
                fail_fast=True,
            )  # fmt: skip
            for rank, reply in enumerate(replies):
                if reply is not None and (reply.headers or {}).get(m.KIND) == "error":
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
                    mesh_state.name, mesh_state.uid, list(range(len(proc_ranks))), "init_failed",
                    str(e), exception=e, traceback=getattr(cause, "traceback", ""),
                )  # fmt: skip
                sup.report(mesh_state.owner_proc, mesh_state.owner_actor, failure)
            return
        mesh_state.proc_uids = [self.procs[pr].uid for pr in proc_ranks]
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
        # them are delivered before the procs are told to stop.
        if self.spawning:
            if spawn_wait is None:
                spawn_wait = self.rt.settings.spawn_timeout
            await asyncio.wait(list(self.spawning), timeout=spawn_wait)
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


class ProcMeshRef(ProcMeshState):
    """A proc mesh known from a reference that travelled here (it is owned elsewhere).

    It spawns actors on the same procs and watches their heartbeats, so calls
    to actors spawned from here fail when a proc is gone; stopping the procs
    is left to the owner.
    """

    def __init__(
        self, rt: Runtime, name: str, uid: str, extent: Extent, proc_uids: list[str]
    ) -> None:
        super().__init__(rt, name, extent, launcher=None)  # type: ignore[arg-type]
        self.uid = uid
        self.procs = [ProcHandle(u, r) for r, u in enumerate(proc_uids)]
        self.launched.set()
        self.settled.set()

    def start_watching(self) -> None:
        """On the loop: watch the procs' heartbeats, and be ready once we hear them (as
        an owner's mesh is, ``start()``): an actor spawned from here may make a proc
        import torch at its first call, and we must hear that announced."""
        self._watching = self.rt.loop.create_task(self._watch_then_ready())

    async def _watch_then_ready(self) -> None:
        try:
            await self._watch()
        finally:
            if not self.ready.done():
                self.ready.set_result(None)

    def _proc_lost(self, handle: ProcHandle, reason: str, why: str) -> None:
        """Calls to actors spawned from here on that proc fail from now on (SupervisionError).

        No failure is reported to their owners: from here an orderly stop by the
        proc mesh's owner and a crash look alike (the heartbeats end), and an
        orderly stop is no failure (as in Monarch). The owner hears of a crash.
        """
        if handle.lost:
            return
        handle.lost = True
        exc = SupervisionError(
            f"proc {handle.uid} (rank {handle.rank} of proc mesh {self.name!r}) is gone: {why}",
            actor_id=handle.uid,
            rank=handle.rank,
        )
        for wait in list(self.control_waits):
            wait.proc_lost(handle.uid, exc)
        for mesh_state, proc_ranks in self.actor_meshes:
            ranks = [i for i, pr in enumerate(proc_ranks) if pr == handle.rank]
            if ranks:
                mesh_state.mark_dead(ranks, _while_spawning(mesh_state, ranks, exc))

    async def stop(
        self, procs: list[ProcHandle] | None = None, spawn_wait: float | None = None
    ) -> None:
        raise ValueError(
            f"proc mesh {self.name!r} is not owned here (it was received as a reference); "
            "it must be stopped by its owner"
        )

    async def shutdown(self) -> None:
        return None  # the owner stops the procs

    async def kill(self) -> None:
        return None


def _while_spawning(mesh_state: MeshState, ranks: list[int], exc: BaseException) -> BaseException:
    """What calls to ``ranks`` raise once their proc is gone: a :class:`SpawnError` while
    the mesh is still being spawned (its proc died in ``__init__``), else ``exc``."""
    if mesh_state.ready or mesh_state.error is not None:
        return exc
    return spawn_error(mesh_state.name, ranks[0], exc)


def owned_by_caller(mesh: Any) -> None:
    """Inside an actor, what it spawns is stopped before the actor cleans up."""
    ctx = actor_context()
    if ctx is not None:
        owned = ctx.actor_instance.owned
        # forget meshes already stopped, so an actor that respawns does not pile them up
        owned[:] = [o for o in owned if getattr(o, "stopped", None) is None]
        owned.append(mesh)


class ProcMesh(MeshShapeOps):
    """Processes laid out on a mesh; spawn actors on them with :meth:`spawn`."""

    def __init__(self, state: ProcMeshState, view: View) -> None:
        self._state = state
        self._view = view

    def _new_with_view(self, view: View) -> ProcMesh:
        return ProcMesh(self._state, view)

    @property
    def initialized(self) -> Future[bool]:
        """Completes (True) once every proc reported ready; raises if one failed to start."""
        st = self._state

        async def wait() -> bool:
            await asyncio.shield(st.ready)
            return True

        return Future(st.rt.run_coro(wait()))

    def spawn(self, name: str, Class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Create one ``Class`` actor per proc; returns at once, messages queue until ready.

        ``__init__`` arguments are checked here (``TypeError``); a failing
        ``__init__`` makes calls on the mesh raise :class:`SpawnError`.
        """
        subjects.check_token(name, "actor mesh name")
        cls = check_actor_class(Class)
        clashes = sorted(n for n in endpoints_of(cls) if hasattr(ActorMesh, n))
        if clashes:
            raise ValueError(
                f"{cls.__name__} has endpoint(s) {clashes} named like ActorMesh attributes, so "
                "mesh.<name> could not reach them: rename the endpoint(s)"
            )
        st = self._state
        if st.start_error is not None and st.stopped is None:  # say why, not just "stopped"
            raise spawn_error(name, 0, st.start_error)
        if st.stopping or st.stopped is not None:
            raise MeshStoppedError(f"`ProcMesh` has already been stopped ({st.name!r})")
        import inspect

        try:
            inspect.signature(cls).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{cls.__name__}(): {e}") from None
        except ValueError:
            pass  # no signature available (builtins): let __init__ decide
        view = self._view
        extent = view.extent
        mesh_uid = subjects.new_uid()
        spec = {
            "name": name,
            "uid": mesh_uid,
            "cls": class_ref(cls),
            "args": list(args),
            "kwargs": kwargs,
            "labels": extent.labels,
            "sizes": extent.sizes,
            "owner": [st.rt.proc_uid, sender_id()],
            # context().actor_instance.proc_mesh in the actors: this mesh, as a reference
            # made now (spawn returns at once; the procs need not be up yet)
            "proc_mesh": _spawn_reference(self),
            # context().actor_instance.creator (and the names in str(instance)): who spawns
            "creator": context().actor_instance.creator_chain(),
        }
        if not isinstance(spec["cls"], str) and not st.rt.settings.pickle:
            raise PicklingForbiddenError(
                f"actor class {cls.__qualname__} is defined in {cls.__module__} (not importable "
                "by procs), so it would travel by cloudpickle, which MONARCH_PICKLE=0 forbids: "
                "move it to an importable module or set MONARCH_PICKLE=1"
            )
        # big __init__ arguments stay here and travel out of band, once per proc
        body = encode_body(spec, readers=len(self._view))
        if not isinstance(body, bytes):
            body = bytes(body)
        mesh_state = MeshState(st.rt, name, mesh_uid, cls, cls.__name__, extent)
        mesh_state.owner_proc, mesh_state.owner_actor = st.rt.proc_uid, sender_id()
        owned_by_caller(mesh_state)
        proc_ranks = list(view.ranks)

        def register() -> None:
            st.actor_meshes.append((mesh_state, proc_ranks))
            task = st.rt.loop.create_task(st.spawn_actors(mesh_state, proc_ranks, body))
            st.spawning.add(task)
            task.add_done_callback(st.spawning.discard)

        st.rt.call_soon(register)
        return ActorMesh(mesh_state, View.full(extent))

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: int | None = 3,
        level: int = logging.INFO,
    ) -> Future[None]:
        """How the procs' stdout, stderr and log records reach this client (as in Monarch).

        Lines print here prefixed with actor and rank; with a window, identical
        lines from many ranks print once as ``[N similar log lines] text``.
        Records below ``level`` are dropped; ``stream_to_client=False`` keeps
        output on each proc's own streams. The defaults are also the mode a
        new proc mesh starts in. Applies to the whole proc mesh; blocks until
        its procs have applied it. See :mod:`monarch.actors.procs.log_collection`.
        Returns a done future: Monarch's is a coroutine (``await pm.logging_option(...)``),
        and a script written for it awaits the result.
        """
        st = self._state
        st.logs.set_mode(LogMode(stream_to_client, aggregate_window_sec, level), st.ready)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def activate(self) -> Any:
        """Tensor engine: ``with procs.activate():`` makes torch calls run on these procs.

        Imported lazily so that the actor API does not import torch
        (see :mod:`monarch.tensors.mode`).
        """
        # A door into the tensor engine, a layer above (pyproject's import contract
        # names it): imported when used, so torch stays off the actor API's path.
        from monarch.tensors.mode import activate

        return activate(self)

    def stop(self) -> Future[None]:
        """Stop every actor and process of this mesh; completes when they are gone."""
        st = self._state
        if isinstance(st, ProcMeshRef):  # refused (not owned here); the mesh stays usable
            return Future(st.rt.run_coro(st.stop()))
        if st.stopped is not None:
            return st.stopped
        for hook in st.before_stop:
            hook()
        st.stopped = Future(st.rt.run_coro(st.stop()))
        return st.stopped

    async def __aenter__(self) -> ProcMesh:
        await self.initialized
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop().get()

    def rank_tensor(self, dim: str | Sequence[str]) -> Any:
        """Tensor engine: a distributed scalar (``torch.long``) holding each proc's rank.

        For one dimension, each proc's coordinate along it in this (sliced)
        mesh; for several, the row-major rank over them in the order given.
        Runs on the tensor engine's workers (spawned on first use, as by
        :meth:`activate`). Raises ``KeyError`` for a dimension this mesh lacks.
        """
        dims = [dim] if isinstance(dim, str) else list(dim)
        extent = self._view.extent
        for d in dims:
            if d not in extent.labels:
                raise KeyError(f"{self!r} does not have dimension {d!r}")
        at = [extent.labels.index(d) for d in dims]
        by_base = [0] * self._state.extent.nelements  # the value for each proc, by base rank
        for i, base_rank in enumerate(self._view.ranks):
            coords = extent.coords(i)
            for j in at:
                by_base[base_rank] = by_base[base_rank] * extent.sizes[j] + coords[j]
        # torch only now, through the tensor engine's door (named in pyproject's
        # import contract), kept off the actor API's import path
        import torch

        # A door into the tensor engine (named in pyproject's import contract): imported when used.
        from monarch.tensors.remote import remote

        fn = remote(
            f"{__name__}._rank_on_worker",
            propagate=lambda _table: torch.zeros((), dtype=torch.long),
        )
        with self.activate():
            return fn(by_base)

    def rank_tensors(self) -> dict[str, Any]:
        """Tensor engine: :meth:`rank_tensor` for each dimension of this mesh, by name."""
        return {d: self.rank_tensor(d) for d in self._view.extent.labels}

    def __reduce__(self) -> tuple:
        """Pickle as a reference, so a proc mesh travels inside any picklable value."""
        return (_decode_proc_mesh, (_encode_proc_mesh(self),))

    @property
    def host_mesh(self) -> Any:
        """The host of this proc mesh's one proc, as a ``HostMesh`` (a reference).

        As in Monarch 0.7, only for a proc mesh of one proc (a slice will do);
        a larger one raises ``NotImplementedError``. Spawning procs on it
        starts them on the same machine (through the same host agent).
        """
        if len(self._view) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        st = self._state
        hosts = _hosts_of(st)
        if hosts is None:
            raise NotImplementedError(f"proc mesh {st.name!r} does not know its host mesh")
        return hosts._host_at(self._view.ranks[0] // st.procs_per_host)

    def to_table(self) -> str:
        """A text table of where each proc runs: ``H.gpu[L]``, proc L of host H (Monarch 0.7).

        Built from what this mesh knows (see :mod:`monarch.actors.procs.mesh_table`);
        unlike Monarch's it needs no tensor engine, torch or tabulate.
        """
        return mesh_table.proc_table(
            self._view.extent, self._view.ranks, self._state.procs_per_host
        )

    @classmethod
    def from_host_mesh(
        cls,
        host_mesh: Any,
        hy_proc_mesh: Any = None,
        region: Any = None,
        setup: Callable[[], Any] | None = None,
        _attach_controller_controller: bool = True,
    ) -> ProcMesh:
        """Procs on every host of ``host_mesh``: its ``spawn_procs``, in Monarch 0.7's words.

        In Monarch this wraps a proc mesh its Rust layer already started
        (``hy_proc_mesh``); here there is none to wrap, so ``hy_proc_mesh``
        must be None and the procs are started now. ``region`` gives their
        dimensions (the host mesh's first, as Monarch's region, or only the
        per-host ones); ``setup`` runs on each proc before its first actor
        (``spawn_procs(bootstrap=...)``).
        """
        del _attach_controller_controller  # ours are always the caller's (it owns them)
        if hy_proc_mesh is not None:
            raise NotImplementedError(
                "ProcMesh.from_host_mesh: there is no Rust proc mesh to wrap here; pass "
                "hy_proc_mesh=None and the procs' dimensions as region"
            )
        per_host = mesh_table.per_host_of(host_mesh.extent, region)
        return host_mesh.spawn_procs(per_host=per_host, bootstrap=setup)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._state.name!r} {self._view.extent!r}>"


def this_proc() -> ProcMesh:
    """The calling process as a proc mesh of one: ``this_proc().spawn(...)`` runs actors here."""
    rt = runtime()
    pm = actor_process(rt).this_proc_mesh
    if pm is None:
        holder: list[ProcMesh] = []
        done = threading.Event()

        def make() -> None:
            state = LocalProcMeshState(rt)
            rt.on_close(state.shutdown)
            holder.append(ProcMesh(state, View.full(state.extent)))
            done.set()

        rt.call_soon(make)
        if not rt.on_loop_thread():
            done.wait()
        pm = holder[0]
        actor_process(rt).this_proc_mesh = pm
    return pm


set_this_proc(this_proc)


def _rank_on_worker(by_base: list[int]) -> Any:
    """On each tensor-engine worker (one per proc, spawned on the whole mesh): its value."""
    import torch

    # the worker's own rank in the whole proc mesh (not the message's, which is the slice's)
    return torch.tensor(by_base[context().actor_instance.rank.rank], dtype=torch.long)


# -- references travel as their own msgpack extension type ------------------------
#
# The ext at top level and inside msgpack containers; ``ProcMesh.__reduce__`` gives
# pickle the same fields (and ``_decode_proc_mesh``) for meshes inside other objects.

_PROC_MESH_EXT = 18
_known: weakref.WeakKeyDictionary[Runtime, weakref.WeakValueDictionary[str, ProcMeshState]]
_known = weakref.WeakKeyDictionary()  # per runtime: proc mesh uid -> its state here
_known_lock = threading.Lock()


def _remember(state: ProcMeshState) -> None:
    with _known_lock:
        _known.setdefault(state.rt, weakref.WeakValueDictionary())[state.uid] = state


def _encode_proc_mesh(mesh: ProcMesh) -> list:
    st, view = mesh._state, mesh._view
    if not st.settled.is_set():
        # Procs still starting: a reference must not reach anyone before they can
        # take spawn requests. Wait (bounded); a failed start travels as its error.
        if st.rt.on_loop_thread():  # an async endpoint: waiting here would stall the loop
            raise RuntimeError(
                f"proc mesh {st.name!r} is still starting: `await procs.initialized` before "
                "sending it from an async endpoint"
            )
        st.settled.wait(st.rt.settings.spawn_timeout)
    _remember(st)
    error = None
    if st.ready.done() and not st.ready.cancelled() and st.ready.exception() is not None:
        error = str(st.ready.exception())
    stopped = st.stopping or st.stopped is not None
    return _fields(st, view, [p.uid for p in st.procs], error, stopped)


def _fields(st: Any, view: View, proc_uids: list[str], error: str | None, stopped: bool) -> list:
    """A proc mesh reference on the wire (what :func:`_decode_proc_mesh` reads)."""
    return [
        st.name,
        st.uid,
        st.extent.labels,
        st.extent.sizes,
        view.extent.labels,
        view.extent.sizes,
        list(view.ranks),
        proc_uids,
        error,
        stopped,
        _hosts_of(st),  # a HostMesh travels as its own reference (or None)
        st.procs_per_host,
    ]


def _hosts_of(st: ProcMeshState) -> Any:
    """The HostMesh that started ``st``'s procs; for this_proc(), this machine."""
    if st.hosts is None and isinstance(st, LocalProcMeshState):
        return _this_host
    return st.hosts


def _spawn_reference(mesh: ProcMesh) -> list:
    """The reference fields of a mesh being spawned on, without waiting for its procs.

    A spawn reaches the procs only once they are all up, so the reference it
    carries describes a started mesh; its proc uids were chosen before launch.
    """
    st, view = mesh._state, mesh._view
    _remember(st)  # an actor in this process gets this very mesh back
    return _fields(st, view, st.proc_uids(), None, False)


def _decode_proc_mesh(fields: list) -> ProcMesh:
    name, uid, blabels, bsizes, vlabels, vsizes, ranks, proc_uids, error, stopped = fields[:10]
    hosts, per_host = fields[10:12] if len(fields) >= 12 else (None, 1)
    rt = runtime()
    base = Extent(blabels, bsizes)
    with _known_lock:
        st = _known.get(rt, {}).get(uid)
    if st is None:
        st = ProcMeshRef(rt, name, uid, base, proc_uids)
        st.hosts, st.procs_per_host = hosts, per_host
        st.stopping = bool(stopped)
        if error is not None:
            st.ready.set_exception(ProcStartError(f"proc mesh {name!r} failed to start: {error}"))
            st.ready.exception()  # retrieved: whoever spawns on it raises it
        elif stopped:
            st.ready.set_result(None)
        else:
            rt.call_soon(st.start_watching)
        _remember(st)
    return ProcMesh(st, View(Extent(vlabels, vsizes), base, ranks))


register_ext(_PROC_MESH_EXT, ProcMesh, _encode_proc_mesh, _decode_proc_mesh)
set_proc_mesh_decoder(_decode_proc_mesh)
