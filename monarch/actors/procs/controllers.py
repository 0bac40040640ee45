"""Named singletons: ``get_or_spawn_controller(name, Cls, *args)``.

Every caller under one root client gets the same actor. Requests go to the
root client's control subject, whose control messages are handled one at a
time, so creation is race-free; the registry itself is a JetStream KV bucket
(``monarch-<ns>-controllers``, key ``<root-uid>.<name>``) that a person can
read with ``nats kv get``. The controller runs in the root client's process.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from nats.aio.msg import Msg
from nats.js.errors import KeyWrongLastSequenceError

from monarch.actors.calls.actor import check_actor_class, class_ref, resolve_class
from monarch.actors.calls.actor_mesh import ActorMesh
from monarch.actors.calls.mesh_state import MeshState
from monarch.actors.hosting.supervisor import supervisor_of
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.messaging import messages as m
from monarch.actors.procs.control_wait import ControlWait
from monarch.actors.procs.proc_mesh import this_proc
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.jetstream_setup import replicas
from monarch.broker.vocabulary import subjects
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)
A = TypeVar("A")


def bucket_name(namespace: str) -> str:
    return f"monarch-{namespace}-controllers"


def get_or_spawn_controller(
    name: str, Class: type[A], *args: Any, **kwargs: Any
) -> Future[ActorMesh[A]]:
    """The actor named ``name`` under this root client, spawning ``Class(*args)`` if none exists."""
    subjects.check_token(name, "controller name")
    cls = check_actor_class(Class)
    rt = runtime()
    body = dumps({"name": name, "cls": class_ref(cls), "args": list(args), "kwargs": kwargs})

    async def run() -> ActorMesh[A]:
        target = subjects.ctl_proc(rt.namespace, rt.root_uid)
        # A slow __init__ is waited for while the root is alive (control_wait).
        sup = supervisor_of(rt)
        wait = ControlWait(
            rt, f"spawning controller {name!r}", [rt.root_uid],
            lambda uid: None if sup is None else sup.watcher.last_heard(uid),
            unread_since=None if sup is None else sup.watcher.unread_since,
        )  # fmt: skip
        (reply,) = await wait.run([target], body, {m.KIND: "controller"}, rt.settings.spawn_timeout)
        if (reply.headers or {}).get(m.KIND) == "error":
            raise m.decode_error(reply.data, actor_id=name, rank=0, endpoint="__init__")
        return loads(reply.data)

    return Future(rt.run_coro(run()))


async def _bucket(rt: Runtime) -> Any:
    js = rt.nc.jetstream()
    return await js.create_key_value(
        bucket=bucket_name(rt.namespace), history=1, replicas=replicas(rt.nc)
    )


async def get_or_spawn_here(server: Any, msg: Msg) -> ActorMesh:
    """At the root client: the existing controller, or a new one in this process."""
    rt: Runtime = server.rt
    spec = loads(msg.data)
    name = spec["name"]
    existing = server.controllers.get(name)
    if existing is not None:
        return existing
    cls = resolve_class(spec["cls"])
    uid = subjects.new_uid()
    extent = Extent([], [])
    # A controller runs in the root client's process: that is its proc mesh, as in Monarch.
    inst = await server.spawn_instance(
        name, uid, 0, extent, cls, tuple(spec["args"]), spec["kwargs"], proc_mesh=this_proc
    )
    state = MeshState(rt, name, uid, cls, cls.__name__, extent)
    state.proc_uids = [rt.proc_uid]
    state.local = inst
    state.mark_ready()
    mesh: ActorMesh = ActorMesh(state, View.full(extent))
    server.controllers[name] = mesh
    try:
        kv = await _bucket(rt)
        await kv.create(f"{rt.proc_uid}.{name}", dumps(mesh))
    except KeyWrongLastSequenceError:
        log.warning("controller %s was already registered under this root", name)
    except Exception as e:  # the registry is for inspection; the actor works without it
        log.warning("could not record controller %s in JetStream KV: %r", name, e)
    return mesh
