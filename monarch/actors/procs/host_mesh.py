"""``HostMesh`` and ``this_host()``: where procs are started.

``this_host()`` is the machine the calling code runs on, as a mesh with an
empty extent, so ``this_host().spawn_procs(per_host={"gpus": 4})`` gives a
proc mesh of extent ``{'gpus': 4}``. On one machine with no host agent the
client starts the procs itself as child processes. A host mesh of registered
host agents (``attach_to_workers``, :mod:`monarch.hosts.attach`) has extent
``{'hosts': H}`` and starts its procs through those agents.

A ``HostMesh`` travels as a reference (an endpoint argument or return value,
alone or inside any picklable value); only the mesh ``attach_to_workers``
returned, unsliced, is *owned* and may be shut down. On this machine procs
can be started with a command other than the default (:class:`~monarch.actors.procs.command_launcher.BootstrapCommand`,
``with_python_executable``) and bound to CPUs and NUMA nodes (``proc_bind``,
:mod:`monarch.actors.procs.proc_bind`), on this machine and through host agents
alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import math
import os
import socket
import weakref
from collections.abc import Callable
from typing import Any

from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.procs.command_launcher import (
    _PYTHON_ENV,
    BootstrapSpec,
    CommandLauncher,
    _python_command,
)
from monarch.actors.procs.launcher import AgentLauncherFactory
from monarch.actors.procs.local_launcher import LocalLauncher
from monarch.actors.procs.proc_bind import parse_binds
from monarch.actors.procs.proc_mesh import ProcMesh, owned_by_caller
from monarch.actors.procs.proc_mesh_ref import set_this_host
from monarch.actors.procs.proc_mesh_state import ProcMeshState
from monarch.broker.bodies.ext import register_ext
from monarch.broker.connections.registry import HostInfo
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.rdma.bulk import encode_body


def _gone(actors: Any) -> bool:
    """Whether an actor mesh has a dead rank, failed or was stopped."""
    st = actors._state
    return bool(st.dead) or st.error is not None or st.stopped is not None


class _WorkspaceSlots:
    """What ``sync_workspace`` keeps for a host mesh and its copies."""

    def __init__(self) -> None:
        self.receivers: Any = None  # the receiver actors, one per host, once started
        self.receivers_state: ProcMeshState | None = None  # their proc mesh
        self.started: weakref.WeakSet[ProcMeshState] = weakref.WeakSet()  # for auto_reload


class HostMesh(MeshShapeOps):
    """A mesh of machines that can run procs."""

    def __init__(
        self,
        view: View,
        hosts: list[Any] | None = None,
        *,
        owned: bool | None = None,
        python: str | None = None,
        machine: str | None = None,
        agent_launcher: AgentLauncherFactory | None = None,
        on_shutdown: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
        failed: BaseException | None = None,
        _spawned: list[ProcMeshState] | None = None,
        _workspace: _WorkspaceSlots | None = None,
    ) -> None:
        if hosts is not None and agent_launcher is None:
            raise ValueError("a HostMesh of host agents needs the launcher that talks to them")
        self._view = view
        self._hosts = hosts  # host agents (HostInfo) by base rank; None: this machine
        # Starts procs through the agents (monarch.hosts hands it in: this layer is below it).
        self._agent_launcher = agent_launcher
        self._owned = hosts is not None if owned is None else owned
        self._python = python  # procs start with this Python (with_python_executable)
        self._machine = machine or socket.gethostname()  # where procs start when hosts is None
        # Proc meshes started from this mesh (and its slices and copies), for shutdown().
        self._spawned: list[ProcMeshState] = [] if _spawned is None else _spawned
        # sync_workspace's receivers and the proc meshes it reloads (shared by copies too).
        self._workspace = _WorkspaceSlots() if _workspace is None else _workspace
        # Run on the loop once shutdown() has stopped them (attach_to_workers: tell the
        # workers it dialled that they may end, as Monarch's do).
        self._on_shutdown = on_shutdown
        # Run on the loop once stop() has stopped them (attach_to_workers: hang up on the
        # workers it dialled, which then wait for the next client).
        self._on_stop = on_stop
        self._ended = ""  # "shut down" or "stopped" once one of them ran (owned is then None)
        # Why its hosts were never reached (attach_to_workers): as in Monarch, the mesh is
        # returned anyway and `initialized` and spawn_procs raise this.
        self._failed = failed

    def _new_with_view(self, view: View) -> HostMesh:
        return self._copy(view=view, owned=False)

    def _copy(self, **changes: Any) -> HostMesh:
        kw: dict[str, Any] = {"owned": self._owned, "python": self._python}
        kw.update(changes)
        view = kw.pop("view", self._view)
        return HostMesh(
            view,
            self._hosts,
            machine=self._machine,
            agent_launcher=self._agent_launcher,
            failed=self._failed,
            _spawned=self._spawned,
            _workspace=self._workspace,
            **kw,
        )

    @property
    def hosts(self) -> list[Any]:
        """The host agents of this (sliced) mesh, in rank order; empty for ``this_host()``
        and for a mesh whose hosts were never reached."""
        if self._hosts is None or self._failed is not None:
            return []
        return [self._hosts[r] for r in self._view.ranks]

    @property
    def stream_logs(self) -> bool:
        """Whether procs started here send their output to this client: always, here.

        Monarch 0.7 fixes this per host mesh when it is made. Here every proc
        mesh forwards its procs' stdout, stderr and log records to its owner
        over the broker from the start; ``ProcMesh.logging_option(
        stream_to_client=False)`` turns that off for one proc mesh.
        """
        return True

    @property
    def is_fake_in_process(self) -> bool:
        """False: procs are always real OS processes here (never simulated in this process)."""
        return False

    @property
    def initialized(self) -> Future[bool]:
        """Done at once: the hosts were found before this mesh was made, or never will be.

        For a mesh ``attach_to_workers`` could not reach, ``get()`` raises why (a
        ``TimeoutError`` naming the missing hosts), as Monarch's does.
        """
        fut: Future[bool] = Future()
        if self._failed is not None:
            fut.set_exception(self._failed)
        else:
            fut.set_result(True)
        return fut

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Any = None,
        name: str | None = "procs",
        proc_bind: Any = None,
        bootstrap_command: BootstrapSpec | None = None,
    ) -> ProcMesh:
        """Start ``prod(per_host)`` procs on each host; returns at once.

        The proc mesh's extent is the host mesh's followed by ``per_host``.
        Use ``.initialized`` (or simply spawn actors and call them) to wait
        until they are up; a proc that fails to start makes those raise
        :class:`~monarch.actors.errors.ProcStartError`. ``bootstrap_command``
        (a :class:`BootstrapCommand`, or a function of each proc's ``Point``
        returning one) starts procs of this machine with another command.
        ``proc_bind`` (one dict per proc of a host) binds each proc to CPUs
        (keys ``cpus``, ``physcpubind``) or NUMA nodes (``cpunodebind``,
        ``membind``: started under ``numactl``), on this machine or through the
        host agents; a binding the host cannot give fails the mesh, naming why.
        ``bootstrap`` (a function of no arguments, sync or ``async``) runs on
        each proc before any actor is spawned there (environment variables,
        say, before CUDA starts); if it raises, ``initialized`` and every spawn
        on the mesh raise an ``ActorError`` carrying that exception, as in
        Monarch.
        """
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a function of no arguments, got {bootstrap!r}")
        if self._failed is not None:
            raise self._failed
        if self._owned is None:
            raise RuntimeError(f"HostMesh has already been {self._ended or 'shut down'}")
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise TypeError(f"per_host[{label!r}] must be an int, got {size!r}")
        name = name or "procs"
        subjects.check_token(name, "proc mesh name")
        command = bootstrap_command
        if command is None and self._python is not None:
            command = _python_command(self._python)
        binds, bind_dicts = None, None
        if proc_bind is not None:
            bind_dicts = list(proc_bind)
            binds = parse_binds(bind_dicts, math.prod(per_host.values()))
        host_extent = self._view.extent
        extent = Extent(
            host_extent.labels + list(per_host), host_extent.sizes + list(per_host.values())
        )
        rt = runtime()
        if self._hosts is None:
            if self._machine != socket.gethostname():
                raise NotImplementedError(
                    f"this HostMesh is the machine {self._machine!r} (received as a reference on "
                    f"{socket.gethostname()!r}): starting procs on another machine needs a host "
                    "agent there (`monarch host`, then attach_to_workers)"
                )
            for bind in binds or ():
                bind.check_here()
            launcher: Any = (
                LocalLauncher(rt.loop)
                if command is None and binds is None
                else CommandLauncher(rt.loop, command, binds)
            )
        else:  # each agent checks the binding against its own machine
            launcher = self._agent_launcher(
                rt, self.hosts, math.prod(per_host.values()), command=command, binds=bind_dicts
            )
        setup = encode_body(bootstrap, readers=extent.nelements) if bootstrap is not None else None
        state = ProcMeshState(rt, name, extent, launcher, bootstrap=setup)
        state.hosts, state.procs_per_host = self, math.prod(per_host.values())
        rt.on_close(state.shutdown)
        rt.run_coro(_start_quietly(state))
        owned_by_caller(state)
        if self._hosts is not None:  # only meshes of host agents can be owned and shut down
            self._spawned.append(state)
        self._workspace.started.add(state)
        return ProcMesh(state, View.full(extent))

    def sync_workspace(
        self, workspace: Any, conda: bool = False, auto_reload: bool = False
    ) -> Future[None]:
        """Mirror ``workspace``'s folders to ``$WORKSPACE_DIR/<destination>`` on every host.

        As Monarch's (``await host_mesh.sync_workspace(workspace)``; ``.get()``
        works too): each folder ends up on each host as rsync ``--archive
        --delete`` would leave it, and only changed files travel (over the
        broker; :mod:`monarch.actors.procs.workspace_sync`). ``WORKSPACE_DIR``
        is read on each host. ``auto_reload``: the running procs started from
        this mesh then reload the modules whose files changed. A slice or a
        received reference of a mesh of host agents raises ``RuntimeError``,
        as in Monarch; ``conda=True`` with a conda environment active raises
        ``NotImplementedError`` (environments are not mirrored here).
        """
        from monarch.actors.procs import workspace_sync  # deferred: only its users pay

        if self._owned is None:
            raise RuntimeError(f"HostMesh has already been {self._ended or 'shut down'}")
        if self._hosts is not None and not self._owned:
            raise RuntimeError(
                "cannot call sync_workspace on a sliced host mesh or one that was sent over an "
                "actor endpoint"
            )
        env = getattr(workspace, "env", None)
        prefix = getattr(env, "_conda_prefix", None) or os.environ.get("CONDA_PREFIX")
        if conda and prefix:
            raise NotImplementedError(
                f"sync_workspace(conda=True): mirroring the conda environment {prefix!r} is not "
                "built in monarch over NATS; install the environment on the hosts instead"
            )
        for dst in getattr(workspace, "dirs", {}).values():
            workspace_sync.check_destination(str(dst))
        slots = self._workspace
        held = slots.receivers_state
        if held is None or held.stopping or held.rt is not runtime() or _gone(slots.receivers):
            if held is not None and not held.stopping and held.rt is runtime():
                runtime().run_coro(held.stop())  # the old receivers' procs that are left
            procs = self.spawn_procs(per_host={}, name="workspace_sync")
            slots.started.discard(procs._state)
            slots.receivers = procs.spawn("_workspace_sync", workspace_sync.WorkspaceReceiver)
            slots.receivers._state.internal = True  # its hosts' end is not the user's failure
            slots.receivers_state = procs._state
        live = [ProcMesh(st, View.full(st.extent)) for st in slots.started if not st.stopping]
        coro = workspace_sync.sync(slots.receivers, live, workspace, auto_reload)
        return Future(runtime().run_coro(coro))

    def _host_at(self, index: int) -> HostMesh:
        """The ``index``-th host of this (sliced) mesh alone, as a reference of no dimensions."""
        view = View(Extent([], []), self._view.base, [self._view.ranks[index]])
        return self._copy(view=view, owned=False)

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """A copy of this mesh whose procs start with ``python_executable`` (a path on each host).

        Procs started from it pass it on: ``this_host().spawn_procs()`` inside
        them uses it too.
        """
        return self._copy(python=python_executable, owned=False)

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh started from this host mesh; then it starts no more procs.

        Only an owned mesh (the one ``attach_to_workers`` returned, not a slice,
        a copy or a received reference) may be shut down; any other makes the
        future raise ``RuntimeError``, as in Monarch. Workers that
        ``attach_to_workers`` dialled end, as Monarch's do; host agents found
        through the broker keep running for other clients (stop them with
        ``monarch`` on each host). To keep dialled workers for the next
        client, use :meth:`stop`.
        """
        return self._end("shut down", self._on_shutdown)

    def stop(self) -> Future[None]:
        """Stop every proc mesh started from this host mesh, keeping the hosts for a reconnect.

        As Monarch's ``HostMesh.stop``: the procs end and this mesh starts no
        more, but the workers stay: the ones ``attach_to_workers`` dialled are
        hung up on and wait for the next client, so a later
        ``attach_to_workers`` (or a job's ``state()``) to the same addresses
        gets them again. Proc meshes another host mesh started on the same
        workers keep running. Only an owned mesh may be stopped (``RuntimeError``
        otherwise, as in Monarch).
        """
        return self._end("stopped", self._on_stop)

    def _end(self, how: str, then: Callable[[], None] | None) -> Future[None]:
        verb = "shut down" if how == "shut down" else "stop"
        if not self._owned:
            fut: Future[None] = Future()
            fut.set_exception(
                RuntimeError(f"HostMesh has already been {self._ended or 'shut down'}")
                if self._owned is None
                else RuntimeError(
                    f"cannot {verb} `HostMesh` that is a reference instead of owned (only the "
                    "mesh attach_to_workers returned, unsliced, is owned)"
                )
            )
            return fut
        self._owned, self._ended = None, how  # spawn_procs raises from now on
        states = list(self._spawned)
        rt = runtime()

        async def stop_all() -> None:
            await asyncio.gather(*(st.stop() for st in states))
            if then is not None:
                then()

        return Future(rt.run_coro(stop_all()))

    def __reduce__(self) -> tuple:
        """Pickle as a reference, so a host mesh travels inside any picklable value."""
        if self._failed is not None:
            raise ValueError(
                f"this HostMesh never reached its hosts, so it cannot be sent: {self._failed}"
            )
        return (_decode_host_mesh, (_encode_host_mesh(self),))

    async def __aenter__(self) -> HostMesh:
        if self._owned is None:
            raise RuntimeError(f"HostMesh has already been {self._ended or 'shut down'}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._owned:  # an owned mesh shuts down on exit, as in Monarch
            await self.shutdown()

    def __repr__(self) -> str:
        names = f" on {', '.join(h.name for h in self.hosts)}" if self._hosts is not None else ""
        if self._failed is not None:
            names = " (attach failed)"
        return f"<HostMesh {self._view.extent!r}{names}>"


async def _start_quietly(state: ProcMeshState) -> None:
    try:
        await state.start()
    except BaseException:
        pass  # kept in state.ready; raised to whoever uses the mesh


_THIS_HOST = HostMesh(View.full(Extent([], [])), python=os.environ.get(_PYTHON_ENV) or None)
set_this_host(_THIS_HOST)  # this_proc().host_mesh


def this_host() -> HostMesh:
    """The host the calling code runs on."""
    return _THIS_HOST


# -- references travel as their own msgpack extension type ------------------------
#
# The ext at top level and inside msgpack containers; ``HostMesh.__reduce__`` gives
# pickle the same fields (and ``_decode_host_mesh``) for meshes inside other objects.

_HOST_MESH_EXT = 19


def _encode_host_mesh(mesh: HostMesh) -> list:
    view = mesh._view
    hosts = [dataclasses.asdict(h) for h in mesh._hosts] if mesh._hosts is not None else None
    factory = mesh._agent_launcher
    launcher = f"{factory.__module__}:{factory.__qualname__}" if factory is not None else None
    return [
        view.base.labels,
        view.base.sizes,
        view.extent.labels,
        view.extent.sizes,
        list(view.ranks),
        hosts,
        mesh._python,
        mesh._machine,
        launcher,
    ]


def _decode_host_mesh(fields: list) -> HostMesh:
    blabels, bsizes, vlabels, vsizes, ranks, hosts, python, machine, launcher = fields
    infos = [HostInfo(**h) for h in hosts] if hosts is not None else None
    view = View(Extent(vlabels, vsizes), Extent(blabels, bsizes), ranks)
    factory = _launcher_by_name(launcher) if launcher is not None else None
    return HostMesh(
        view, infos, owned=False, python=python, machine=machine, agent_launcher=factory
    )


def _launcher_by_name(name: str) -> AgentLauncherFactory:
    """The agent launcher a mesh reference names, as pickle finds a class: by import path.

    Only monarch's own modules: a reference from the wire must not make us
    import anything else.
    """
    module, _, qualname = name.partition(":")
    if not module.startswith("monarch.") or not qualname.isidentifier():
        raise ValueError(f"a HostMesh reference names an unknown launcher {name!r}")
    return getattr(importlib.import_module(module), qualname)


register_ext(_HOST_MESH_EXT, HostMesh, _encode_host_mesh, _decode_host_mesh)
