"""A proc: an OS process that connects to NATS and hosts actors.

Started as ``python -m monarch.actors.proc --uid UID --ready SUBJECT`` by
whoever owns it (the client, or a host agent). It connects, subscribes to
its control subject, reports ``ready`` to its owner, and then serves control
messages (``spawn``, ``stop_mesh``, ``stop``) one at a time, in order, until
told to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import sys
import threading
from typing import Any

from nats.aio.msg import Msg

import monarch.actors.actor_mesh  # noqa: F401  (registers the actor mesh reference type)
from monarch.actors import messages as m
from monarch.actors.actor import resolve_class
from monarch.actors.controllers import get_or_spawn_here
from monarch.actors.instance import ActorInstance
from monarch.actors.logs import apply_mode, install_forwarding
from monarch.actors.loss_recovery import start_loss_recovery
from monarch.actors.process_state import actor_process
from monarch.actors.shape import Extent
from monarch.actors.supervisor import start_supervision
from monarch.broker import subjects
from monarch.broker.codec import dumps, loads
from monarch.broker.config import settings
from monarch.core.proc_registry import register_proc
from monarch.core.runtime import Runtime, install_runtime, new_event_loop
from monarch.rdma.bulk import fetch_async

log = logging.getLogger("monarch.proc")


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
        rt.set_ctl_handler(self._ctl.put_nowait)

    async def _serve(self) -> None:
        while True:
            msg: Msg = await self._ctl.get()
            kind = (msg.headers or {}).get(m.KIND, "")
            try:
                handler = getattr(self, f"_on_{kind}", None)
                if handler is None:
                    raise ValueError(f"unknown control message kind {kind!r}")
                result = await handler(msg)
                self._reply(msg, True, dumps(result))
            except Exception as e:
                log.debug("control %s failed: %r", kind, e)
                self._reply(msg, False, m.encode_error(e))
            if self.stopped.is_set():
                return

    def _reply(self, msg: Msg, ok: bool, body: bytes) -> None:
        if msg.reply:
            rank = (msg.headers or {}).get(m.RANK, "0")
            headers = {m.KIND: "ok" if ok else "error", m.RANK: rank, m.FROM: self.rt.proc_uid}
            self.rt.publish(msg.reply, body, headers)

    async def _on_ping(self, msg: Msg) -> str:
        return self.rt.proc_uid

    async def _on_spawn(self, msg: Msg) -> None:
        body = await fetch_async(msg.data)  # big __init__ arguments travel out of band
        spec = loads(body, take=body is not msg.data)
        rank = int((msg.headers or {})[m.RANK])
        extent = Extent(spec["labels"], spec["sizes"])
        owner_proc, owner_actor = spec.get("owner") or (self.rt.root_uid, "client")
        await self.spawn_instance(
            spec["name"],
            spec["uid"],
            rank,
            extent,
            resolve_class(spec["cls"]),
            tuple(spec["args"]),
            spec["kwargs"],
            owner=(owner_proc, owner_actor),
        )

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
    ) -> ActorInstance:
        """Construct one actor here and subscribe it to its 2^d subjects."""
        inst = ActorInstance(self.rt, name=name, uid=uid, rank=rank, extent=extent, cls=cls)
        inst.owner_proc, inst.owner_actor = owner or (self.rt.proc_uid, "client")
        await inst.construct(args, kwargs)
        inst.on_stopped = self._forget
        inst.on_failure = self._actor_failed
        self.actors[uid] = inst
        coords = extent.coords(rank)
        for subject in subjects.point_subscriptions(self.rt.namespace, name, uid, coords):
            inst.subscriptions.append(await self.rt.subscribe_mesh(subject, inst.deliver))
        return inst

    def _forget(self, inst: ActorInstance) -> None:
        if self.actors.get(inst.uid) is inst:
            del self.actors[inst.uid]

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

    async def _on_log_mode(self, msg: Msg) -> None:
        apply_mode(loads(msg.data))  # the owner's ProcMesh.logging_option

    async def _on_stop_mesh(self, msg: Msg) -> None:
        uid = loads(msg.data)
        inst = self.actors.pop(uid, None)
        if inst is not None:
            await inst.stop(self.rt.settings.stop_timeout)

    async def _on_stop(self, msg: Msg) -> None:
        await self.stop_all()
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

    async def _on_controller(self, msg: Msg) -> Any:
        """Get or spawn the named singleton (only the root client receives these)."""
        return await get_or_spawn_here(self, msg)


_local_server: ProcServer | None = None


def local_server(rt: Runtime) -> ProcServer:
    """The actor host of this process, created on first use (the client has none until then)."""
    global _local_server
    if _local_server is None or _local_server.rt is not rt:
        _local_server = ProcServer(rt)
        rt.on_close(_local_server.close)
    return _local_server


async def serve(uid: str, ready: str, url: str) -> None:
    rt = Runtime(proc_uid=uid, loop=asyncio.get_running_loop(), cfg=settings())
    rt.root_uid = os.environ.get("MONARCH_ROOT_PROC") or uid
    install_runtime(rt)
    await rt.connect(url)
    start_loss_recovery(rt)
    install_forwarding(rt)
    await start_supervision(
        rt,
        create_streams=False,
        owner_proc=os.environ.get("MONARCH_OWNER_PROC"),
        find_actor=lambda actor_id: local_server(rt).find(actor_id),
    )
    server = local_server(rt)
    register_proc(rt, server.list_actors)  # a registry entry, and answers to `monarch ps`
    rt.publish(ready, dumps(os.getpid()), {m.KIND: "ready", m.FROM: uid})
    await server.stopped.wait()
    await rt.close()


def preimport_torch() -> None:
    """Import torch now if it is installed (and not yet imported).

    Otherwise the first tensor a proc decodes imports it on the event loop:
    seconds on a busy machine during which the loop serves nothing (heartbeats
    go on from their own thread, see :mod:`monarch.supervision.liveness`).
    """
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    try:
        import torch  # noqa: F401
    except Exception as e:  # a broken install fails later, where a tensor is used
        log.warning("torch is installed but does not import: %r", e)


def preimport_torch_in_background() -> None:
    """:func:`preimport_torch` on a thread of its own, which ends when it is done.

    Off the start-up's path: the proc connects and says ready meanwhile (a
    tensor decoded before the import is done waits for it, as it would have
    imported torch anyway). Waiting for it would add its seconds of CPU to
    every spawn.
    """
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        threading.Thread(target=preimport_torch, name="monarch-import-torch", daemon=True).start()


def main(argv: list[str] | None = None, *, preimport: bool = True) -> None:
    """Run a proc until it is told to stop.

    ``preimport``: start importing torch (when installed) at once, in the
    background. The zygote passes False: it imports torch itself once it is
    idle, so a fork has it already or, forked before that, does not spend its
    first seconds on it.
    """
    parser = argparse.ArgumentParser(prog="python -m monarch.actors.proc")
    parser.add_argument("--uid", required=True, help="this proc's unique id (a subject token)")
    parser.add_argument("--ready", required=True, help="subject to report readiness to")
    args = parser.parse_args(argv)
    url = settings().nats_url
    if not url:
        sys.exit(
            "monarch proc: MONARCH_NATS_URL is not set; procs are started by a client or host agent"
        )
    logging.basicConfig(
        level=os.environ.get("MONARCH_LOG_LEVEL", "WARNING"),
        format=f"[{args.uid}] %(levelname)s %(name)s: %(message)s",
    )
    # The script that defined our actor classes is not our __main__; cloudpickle
    # brings classes by value, so nothing else is needed here.
    if preimport:
        preimport_torch_in_background()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(args.uid, args.ready, url))
    except KeyboardInterrupt:
        pass
    finally:
        _cancel_remaining(loop)
        loop.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of actors stuck in an endpoint must not keep a stopped proc alive.
    os._exit(0)


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: module state (the
    # process's actor host) must be the one every other module sees.
    from monarch.actors.proc import main as _main

    _main()
