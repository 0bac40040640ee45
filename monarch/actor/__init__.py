"""The Monarch actor API (``from monarch.actor import Actor, endpoint, this_host``).

This module only re-exports; the work lives in :mod:`monarch.actors`.
"""

from monarch.actors.actor import Actor
from monarch.actors.actor_mesh import ActorMesh, MessageTooLargeError
from monarch.actors.context import (
    Context,
    Instance,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from monarch.actors.endpoint import ActorEndpoint as Endpoint
from monarch.actors.endpoint import endpoint
from monarch.actors.errors import (
    ActorError,
    MeshStoppedError,
    NoActorError,
    NotAnEndpointError,
    ProcStartError,
    RemoteException,
    SpawnError,
    SupervisionError,
)
from monarch.actors.future import Future
from monarch.actors.host_mesh import HostMesh, this_host
from monarch.actors.proc_mesh import ProcMesh
from monarch.actors.shape import Extent, Point
from monarch.actors.value_mesh import ValueMesh

__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Instance",
    "MeshStoppedError",
    "MessageTooLargeError",
    "NoActorError",
    "NotAnEndpointError",
    "Point",
    "ProcMesh",
    "ProcStartError",
    "RemoteException",
    "SpawnError",
    "SupervisionError",
    "ValueMesh",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "this_host",
]
