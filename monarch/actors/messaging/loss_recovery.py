"""Plugging loss recovery (:mod:`monarch.actors.messaging.lost_replies`, :mod:`monarch.actors.messaging.lost_sends`)
into a process's runtime, right after it connects.

The core runtime only carries messages; what the actor protocol does about
messages a dead broker node took with it is this layer's, handed to the
runtime as control kinds and connection listeners.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from monarch.actors.messaging.lost_replies import CallProber, ReplyLedger
from monarch.actors.messaging.lost_sends import SendCounter
from monarch.actors.process_state import ActorProcess, actor_process
from monarch.broker.bodies.codec import loads
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)


def start_loss_recovery(rt: Runtime) -> None:
    """The replier's ledger, the caller's prober and the send counters of this process."""
    state = actor_process(rt)
    state.replies = ReplyLedger(rt)
    state.prober = CallProber(rt)
    state.sends = SendCounter(rt)
    rt.connection_listeners.append(state.replies.connection_changed)
    rt.connection_listeners.append(state.sends.connection_changed)
    # In arrival order, before the proc's server: after the calls a probe asks about.
    rt.handle_ctl_kind("probe", state.replies.answer_probe)
    rt.handle_ctl_kind("lost", lambda msg: _on_lost(state, msg))
    state.prober.start()
    state.sends.start()


def _on_lost(state: ActorProcess, msg: Msg) -> None:
    """An actor found a hole in this process's messages to it (see monarch.actors.messaging.lost_sends)."""
    try:
        mesh_uid, rank, count, subject = loads(msg.data)
        st = state.mesh_states.get(mesh_uid)
        if st is not None:
            st.note_lost(int(rank), int(count), str(subject))
    except Exception as e:
        log.warning("malformed loss report on %s: %r", msg.subject, e)
