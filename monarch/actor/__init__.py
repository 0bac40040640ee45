"""The Monarch actor API (``from monarch.actor import Actor, endpoint, this_host``).

This module only re-exports; the work lives in :mod:`monarch.actors`. The
support table in docs/support.md says, name by name, what is supported.

Layer: the public facade, above every runtime layer; below the job layer
(``monarch.job``, ``monarch.spmd``, ``monarch.elastic``) and the CLI.
"""

from monarch import settings as config
from monarch.actors.calls.actor import Actor
from monarch.actors.calls.actor_mesh import ActorMesh, MessageTooLargeError
from monarch.actors.calls.context import (
    Context,
    Instance,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from monarch.actors.calls.endpoint import (
    Accumulator,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    send,
)
from monarch.actors.calls.endpoint import ActorEndpoint as Endpoint
from monarch.actors.calls.ports import Channel, Port, PortReceiver
from monarch.actors.calls.user_spans import span, traced
from monarch.actors.client import attach, shutdown_context
from monarch.actors.client import default_unhandled_fault_hook as unhandled_fault_hook
from monarch.actors.client import set_fault_hook_source as _set_fault_hook_source
from monarch.actors.compat import (
    ChannelTransport,
    debug_controller,
    gpu_direct_rdma_supported,
    local_proc_mesh,
    proc_mesh,
    sim_proc_mesh,
)
from monarch.actors.errors import (
    ActorError,
    BrokerLostError,
    MalformedMessageError,
    MeshStoppedError,
    MessageLostError,
    NoActorError,
    NotAnEndpointError,
    ProcStartError,
    RemoteException,
    SpawnError,
    SupervisionError,
)
from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.meshes.value_mesh import ValueMesh
from monarch.actors.procs.command_launcher import default_bootstrap_cmd
from monarch.actors.procs.controllers import get_or_spawn_controller
from monarch.actors.procs.host_mesh import HostMesh, this_host
from monarch.actors.procs.proc_mesh import ProcMesh, this_proc
from monarch.broker.connections.connect import BrokerConnectionError
from monarch.config.transport import enable_transport
from monarch.core.future import Future
from monarch.core.ids import ProcId, Uid
from monarch.core.returns_future import returns_future
from monarch.hosts.attach import (
    attach_to_workers,
    hosts_from_config,
    run_worker_loop_forever,
    run_worker_loop_until_shutdown,
    start_worker_loop_forever,
)
from monarch.supervision.failure import MeshFailure
from monarch.telemetry.meter import get_meter

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "attach",
    "ActorMesh",
    "BrokerConnectionError",
    "BrokerLostError",
    "MalformedMessageError",
    "MessageLostError",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Instance",
    "MeshStoppedError",
    "MessageTooLargeError",
    "NoActorError",
    "NotAnEndpointError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "ProcStartError",
    "RemoteException",
    "SpawnError",
    "SupervisionError",
    "Uid",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "debug_controller",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "gpu_direct_rdma_supported",
    "hosts_from_config",
    "local_proc_mesh",
    "proc_mesh",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "start_worker_loop_forever",
    "send",
    "shutdown_context",
    "sim_proc_mesh",
    "span",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]

# Users replace the hook as in Monarch (``monarch.actor.unhandled_fault_hook = fn``):
# the root looks it up here at each failure that reaches it.
_set_fault_hook_source(lambda: globals()["unhandled_fault_hook"])
