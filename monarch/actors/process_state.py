"""What the actor layer keeps per process, beside the core :class:`~monarch.core.runtime.Runtime`.

The runtime is the core's and knows nothing of actors; the actor layer's
per-process state (the meshes this process knows, failure routing, the
loss-recovery books) lives here, one :class:`ActorProcess` per runtime,
found with :func:`actor_process`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch.core.runtime import Runtime

if TYPE_CHECKING:  # annotations only: these modules use this one
    from monarch.actors.hosting.reduce import GroupReducer
    from monarch.actors.hosting.supervisor import Supervisor
    from monarch.actors.messaging.lost_replies import CallProber, ReplyLedger
    from monarch.actors.messaging.lost_sends import SendCounter
    from monarch.actors.messaging.port_flow import PortFlows


@dataclass(eq=False)
class ActorProcess:
    """The actor layer's state of one process."""

    # actor mesh uid -> MeshState of every mesh this process knows (owns or calls)
    mesh_states: dict[str, Any] = field(default_factory=dict)
    # heartbeats, liveness watching and failure routing (monarch.actors.hosting.supervisor)
    supervisor: Supervisor | None = None
    # what recovers lost calls, replies and sends (monarch.actors.messaging.lost_replies / lost_sends)
    replies: ReplyLedger | None = None
    prober: CallProber | None = None
    sends: SendCounter | None = None
    # flow control of port sends, per destination proc (monarch.actors.messaging.port_flow)
    port_flows: PortFlows | None = None
    # replies of a per_proc group merged on this proc (monarch.actors.hosting.reduce)
    group_reducer: GroupReducer | None = None
    # this_proc()'s one-proc mesh, made on first use (monarch.actors.procs.proc_mesh)
    this_proc_mesh: Any = None


_states: weakref.WeakKeyDictionary[Runtime, ActorProcess] = weakref.WeakKeyDictionary()
_last: tuple[Runtime | None, ActorProcess | None] = (None, None)  # the usual one, without a lookup


def actor_process(rt: Runtime) -> ActorProcess:
    """The actor layer's state for ``rt`` (made on first use)."""
    global _last
    last_rt, last_state = _last
    if last_rt is rt:
        return last_state  # type: ignore[return-value]
    state = _states.get(rt)
    if state is None:
        state = _states[rt] = ActorProcess()
    _last = (rt, state)
    return state
