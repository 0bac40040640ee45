"""The control server of a process that hosts actors: it spawns, finds and stops them.

Every proc runs one (and the client, once it hosts ``this_proc()`` actors or
controllers). Control messages (``bootstrap``, ``spawn``, ``stop_mesh``, ``stop``,
``ping``, ``log_mode``; at the root also ``controller``, handed in by the client) are
served one at a time, in order; ``stop`` and ``stop_mesh`` at once (see ``_take``).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg

import monarch.actors.calls.actor_mesh  # noqa: F401  (registers the actor mesh reference type)
from monarch.actors.calls.actor import resolve_class
from monarch.actors.calls.context import CreatorInstance, proc_mesh_from_fields
from monarch.actors.hosting.group_fanout import GroupFanout, shared_by_group
from monarch.actors.hosting.instance import ActorInstance
from monarch.actors.hosting.log_forwarding import apply_mode
from monarch.actors.hosting.mailbox import LoopRunner
from monarch.actors.meshes.shape import Extent
from monarch.actors.messaging import messages as m
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import decode_body_async

log = logging.getLogger("monarch.proc")
_ROOT = ["root", None, [], [], 0]  # the root client, as a creator chain of one


class ProcServer:
    """Handles this proc's control messages and owns its actors.

    Control messages are served one at a time, in order, which also makes
    ``get_or_spawn_controller`` race-free at the root client.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.actors: dict[str, ActorInstance] = {}
        self.stopped = asyncio.Event()
        self._ctl: asyncio.Queue = asyncio.Queue()
        self._task = rt.loop.create_task(self._serve())
        self.controllers: dict[str, Any] = {}
        self._handlers: dict[str, Callable[[Msg], Awaitable[Any]]] = {}  # kinds handed in
        self._nested: set[asyncio.Task] = set()  # stop / stop_mesh handlers running (see _take)
        self._building: set[asyncio.Task] = set()  # spawns whose __init__ runs (see _spawn)
        self.group_fanout = GroupFanout(rt)  # a per_proc group's shared subjects, once a proc
        rt.set_ctl_handler(self._take)

    def _take(self, msg: Msg) -> None:
        """On the loop: queue a control message, or serve a ``stop`` / ``stop_mesh`` at once.

        Those are not queued behind a spawn whose ``__init__`` may run for
        minutes: the owner asks a stop when giving up on this proc (a caught
        SpawnError, the client's exit) and a stop_mesh for another mesh, and
        would wait its stop timeout for an answer. What a stop does not reach
        (an actor still in ``__init__``) ends with the process. Nor may they
        wait in line for each other: stopping an actor stops the meshes it
        owns first, and one of those may live in this very process (its
        stop_mesh would wait behind the stop that waits for it). A stop_mesh
        never overtakes its own mesh's spawn: the owner sends it only once
        that spawn has answered.
        """
        kind = (msg.headers or {}).get(m.KIND, "")
        if kind in _NESTING_KINDS:
            self._nest(msg, kind)
        else:
            self._ctl.put_nowait(msg)

    def _nest(self, msg: Msg, kind: str) -> None:
        task = self.rt.loop.create_task(self._handle(msg, kind))
        self._nested.add(task)
        task.add_done_callback(self._nested.discard)

    async def _serve(self) -> None:
        # Served until the process exits (or close()): after a stop, a late stop or
        # stop_mesh is answered at once (nothing is left to stop) and a spawn refused.
        while True:
            msg: Msg = await self._ctl.get()
            kind = (msg.headers or {}).get(m.KIND, "")
            if kind == "spawn" and "spawn" not in self._handlers:
                await self._spawn(msg)
            else:
                await self._handle(msg, kind)

    async def _spawn(self, msg: Msg) -> None:
        """A spawn holds the queue only until its actor is placed (subscribed, ``__init__``
        first in its mailbox), as Monarch's actor exists before its init message runs:
        an ``__init__`` that blocks, or never returns, holds back no other control
        message (the next spawn, a ``ping``); its own answer is sent when it has run."""
        try:
            placed = await self._place_from(msg)
        except Exception as e:
            log.debug("control spawn failed: %r", e)
            self._reply(msg, False, m.encode_error(e))
            return
        task = self.rt.loop.create_task(self._answer_spawn(msg, placed))
        self._building.add(task)
        task.add_done_callback(self._building.discard)

    async def _answer_spawn(
        self, msg: Msg, placed: list[tuple[ActorInstance, asyncio.Future]]
    ) -> None:
        """Answer once every actor placed for this spawn has run ``__init__`` (one,
        or a proc's share of a ``per_proc`` mesh); the first that failed is the answer."""
        failed: tuple[ActorInstance, BaseException] | None = None
        for inst, built in placed:
            try:
                await self._constructed(inst, built)
            except BaseException as e:  # CancelledError too: a stop cut its __init__ off
                if failed is None:
                    failed = (inst, e)
        if failed is not None:
            inst, e = failed
            for other, _ in placed:  # the spawn failed: none of its actors stays
                if other is not inst and self.actors.pop(other.server_key, None) is other:
                    await other.stop(self.rt.settings.stop_timeout)
            if not isinstance(e, Exception):
                e = RuntimeError(f"actor {inst.actor_id} was stopped during __init__")
            self._reply(msg, False, m.encode_error(e), inst.rank if len(placed) > 1 else None)
            return
        self._reply(msg, True, dumps(None))

    async def _handle(self, msg: Msg, kind: str) -> None:
        try:
            handler = self._handlers.get(kind) or getattr(self, f"_on_{kind}", None)
            if handler is None:
                raise ValueError(f"unknown control message kind {kind!r}")
            result = await handler(msg)
            self._reply(msg, True, dumps(result))
        except Exception as e:
            log.debug("control %s failed: %r", kind, e)
            self._reply(msg, False, m.encode_error(e))

    def _reply(self, msg: Msg, ok: bool, body: bytes, actor_rank: int | None = None) -> None:
        if msg.reply:
            rank = (msg.headers or {}).get(m.RANK, "0")
            headers = {m.KIND: "ok" if ok else "error", m.RANK: rank, m.FROM: self.rt.proc_uid}
            if actor_rank is not None:  # which of this proc's actors of the mesh failed
                headers[m.ACTOR_RANK] = str(actor_rank)
            self.rt.publish(msg.reply, body, headers)

    async def _on_ping(self, msg: Msg) -> str:
        return self.rt.proc_uid

    async def _on_spawn(self, msg: Msg) -> None:
        for inst, built in await self._place_from(msg):
            await self._constructed(inst, built)

    async def _place_from(self, msg: Msg) -> list[tuple[ActorInstance, asyncio.Future]]:
        """The actors a spawn message asks of this proc: one, or ``k`` of a ``per_proc``
        mesh (ranks ``i*k .. i*k+k-1`` for the proc at position ``i``), all placed."""
        if self.stopped.is_set():
            raise RuntimeError(f"proc {self.rt.proc_uid} is stopping: it spawns no more actors")
        spec = await decode_body_async(msg.data)  # big __init__ arguments travel out of band
        position = int((msg.headers or {})[m.RANK])
        extent = Extent(spec["labels"], spec["sizes"])
        owner_proc, owner_actor = spec.get("owner") or (self.rt.root_uid, "client")
        k, group_dims = spec.get("per_proc") or (1, 0)
        cls = resolve_class(spec["cls"])
        proc_mesh = proc_mesh_from_fields(spec["proc_mesh"]) if spec.get("proc_mesh") else None
        placed: list[tuple[ActorInstance, asyncio.Future]] = []
        try:
            for j in range(k):
                rank = position * k + j
                args, kwargs = tuple(spec["args"]), spec["kwargs"]
                if j:  # each actor its own arguments, as if each had been sent its own
                    args, kwargs = _own_copy(args, kwargs)
                inst, built = await self.place_instance(
                    spec["name"], spec["uid"], rank, extent, cls, args,
                    kwargs, owner=(owner_proc, owner_actor), proc_mesh=proc_mesh,
                    creator=CreatorInstance.from_chain(spec.get("creator")),
                    group_dims=group_dims if k > 1 else 0,
                )  # fmt: skip
                placed.append((inst, built))
        except BaseException:
            for inst, built in placed:
                built.cancel()
                await self._unplace(inst)
            raise
        return placed

    async def spawn_instance(
        self,
        name: str,
        uid: str,
        rank: int,
        extent: Extent,
        cls: type,
        args: tuple,
        kwargs: dict,
        owner: tuple[str, str] | None = None,
        proc_mesh: Any = None,
        creator: CreatorInstance | None = None,
    ) -> ActorInstance:
        """Construct one actor here and subscribe it to its 2^d subjects.

        ``proc_mesh`` is what ``context().actor_instance.proc_mesh`` gives the
        actor: the ProcMesh it was spawned on, or a function that makes it;
        ``creator`` says who spawned it (``None``: the root client).
        """
        inst, built = await self.place_instance(
            name, uid, rank, extent, cls, args, kwargs, owner, proc_mesh, creator
        )
        await self._constructed(inst, built)
        return inst

    async def place_instance(
        self,
        name: str,
        uid: str,
        rank: int,
        extent: Extent,
        cls: type,
        args: tuple,
        kwargs: dict,
        owner: tuple[str, str] | None = None,
        proc_mesh: Any = None,
        creator: CreatorInstance | None = None,
        group_dims: int = 0,
    ) -> tuple[ActorInstance, asyncio.Future]:
        """Make one actor here, its ``__init__`` queued first in its mailbox, and subscribe
        it; the future: ``__init__`` has run (see :meth:`_constructed`).

        ``group_dims``: the trailing dimensions of a ``per_proc`` mesh (several of its
        actors here); such an actor is kept under ``<uid>[<rank>]``, a lone one under
        its mesh's uid (what the tensor engine and a local mesh look it up by); where
        its endpoints are all async, the subjects its whole group hears are subscribed
        once for the group (:mod:`monarch.actors.hosting.group_fanout`)."""
        inst = ActorInstance(
            self.rt, name=name, uid=uid, rank=rank, extent=extent, cls=cls, proc_mesh=proc_mesh,
            creator=creator if creator is not None else CreatorInstance.from_chain([_ROOT]),
        )  # fmt: skip
        inst.owner_proc, inst.owner_actor = owner or (self.rt.proc_uid, "client")
        inst.group_dims = group_dims
        inst.server_key = f"{uid}[{rank}]" if group_dims else uid
        built = inst.begin_construct(args, kwargs)
        inst.on_stopped = self._forget
        inst.on_failure = self._actor_failed
        self.actors[inst.server_key] = inst
        # Only actors that run on the loop share subscriptions: handing one message to
        # hundreds of actor threads at once woke them all together, and the GIL convoy
        # starved the proc's loop and heartbeat for seconds (benchmarks/NOTES.md 59).
        on_loop = isinstance(inst._runner, LoopRunner)
        try:
            coords = extent.coords(rank)
            for subject in subjects.point_subscriptions(self.rt.namespace, name, uid, coords):
                if shared_by_group(subject, group_dims) and on_loop:  # the group hears it: once
                    inst.subscriptions.append(await self.group_fanout.join(subject, inst))
                else:
                    inst.subscriptions.append(await self.rt.subscribe_mesh(subject, inst.deliver))
        except BaseException:
            built.cancel()
            await self._unplace(inst)
            raise
        return inst, built

    async def _constructed(self, inst: ActorInstance, built: asyncio.Future) -> None:
        """Wait for ``__init__``; if it raised, the actor is taken away again and this raises."""
        try:
            await built
        except BaseException:
            await self._unplace(inst)
            raise

    async def _unplace(self, inst: ActorInstance) -> None:
        self._forget(inst)
        await inst._unsubscribe()

    def _forget(self, inst: ActorInstance) -> None:
        if self.actors.get(inst.server_key) is inst:
            del self.actors[inst.server_key]

    def find(self, actor_id: str) -> ActorInstance | None:
        """The live actor of this process with that id (owners are looked up this way)."""
        for inst in self.actors.values():
            if inst.actor_id == actor_id:
                return inst
        return None

    def list_actors(self) -> list[dict[str, Any]]:
        """What this proc hosts, as ``monarch ps`` shows it."""
        return [
            {
                "mesh": inst.name,
                "mesh_uid": inst.uid,
                "rank": inst.rank,
                "class": getattr(inst.cls, "__qualname__", str(inst.cls)),
                "sizes": dict(inst.extent),
            }
            for inst in list(self.actors.values())
        ]

    def _actor_failed(self, inst: ActorInstance, exc: BaseException) -> None:
        sup = actor_process(self.rt).supervisor
        if sup is not None:
            sup.actor_failed(inst, exc)

    async def _on_bootstrap(self, msg: Msg) -> None:
        """Run the owner's ``spawn_procs(bootstrap=fn)`` here, before any actor is spawned.

        On the proc's loop, as Monarch runs it on its actors' loop: state it
        leaves in this thread (a CUDA device, say) is where async endpoints run.
        An ``async def`` fn is awaited.
        """
        fn = await decode_body_async(msg.data)
        result = fn()
        if inspect.isawaitable(result):
            await result

    async def _on_log_mode(self, msg: Msg) -> None:
        apply_mode(loads(msg.data))  # the owner's ProcMesh.logging_option

    async def _on_stop_mesh(self, msg: Msg) -> None:
        uid = loads(msg.data)
        keys = [key for key, inst in self.actors.items() if inst.uid == uid]
        stopping = [inst for inst in (self.actors.pop(key, None) for key in keys) if inst]
        if stopping:  # a per_proc mesh's actors here stop side by side
            timeout = self.rt.settings.stop_timeout
            await asyncio.gather(*(inst.stop(timeout) for inst in stopping))

    async def _on_stop(self, msg: Msg) -> None:
        await self.stop_all()
        # A stop_mesh served beside this stop may still be stopping its actor (it
        # took the actor out of ``actors`` first): the process must not end before.
        others = [t for t in self._nested if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=self.rt.settings.stop_timeout)
        self.stopped.set()

    async def close(self) -> None:
        """Stop every actor here and the control task (the process goes on)."""
        await self.stop_all()
        self._task.cancel()

    async def stop_all(self) -> None:
        for uid in list(self.actors):
            inst = self.actors.pop(uid, None)
            if inst is not None:
                await inst.stop(self.rt.settings.stop_timeout)

    def handle(self, kind: str, handler: Callable[[Msg], Awaitable[Any]]) -> None:
        """Serve control messages of ``kind`` with ``handler`` too (the root's ``controller``)."""
        self._handlers[kind] = handler


def _own_copy(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A copy of a spawn's ``__init__`` arguments for the second and later actors of a
    ``per_proc`` mesh in one proc (they were decoded once: big ones travel out of band
    and are fetched once per proc). What cannot be copied is shared, with a warning."""
    try:
        return copy.deepcopy((args, kwargs))
    except Exception as e:
        log.warning("__init__ arguments could not be copied for each actor of this proc; "
                    "its actors share them (%r)", e)  # fmt: skip
        return args, kwargs


# Control kinds served beside the queue, not in its order (see ProcServer._take).
_NESTING_KINDS = frozenset({"stop", "stop_mesh"})

_local_server: ProcServer | None = None


def local_server(rt: Runtime) -> ProcServer:
    """The actor host of this process, created on first use (the client has none until then)."""
    global _local_server
    if _local_server is None or _local_server.rt is not rt:
        _local_server = ProcServer(rt)
        rt.on_close(_local_server.close)
    return _local_server
