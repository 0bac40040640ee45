"""A call the broker answered "no responders" (``Status: 503``): a reconnect, or no actor.

The broker answers so when nobody was subscribed to the call's subject: the
call ran nowhere. Either the actor is gone (stopped, crashed, never spawned)
or its proc is not connected right now: a broker restart or a dead cluster
node, after which the caller's connection and the procs' come back at
different moments. A reconnect is no death, so the call is not failed at
once; :func:`no_responders` asks each proc of the missing ranks whether it is
connected (an empty ``probe``, which a connected proc answers, and the broker
answers "no responders" for one that is not) and sends the call again after
a short wait (``RESEND_FIRST`` seconds, doubling up to ``RESEND_MAX``):

* the copy sent again reaches the actor: the call completes as usual;
* the procs answered before the copy left, and still nobody listens: the
  actor is gone (a proc's subscriptions come back with its connection, all
  at once), :class:`~monarch.actors.errors.NoActorError`, within ~0.1 s;
* the procs stay unreachable: the heartbeat watcher declares them dead
  (``MONARCH_HEARTBEAT_TIMEOUT``, a ``SupervisionError``), or after
  ``MONARCH_BROKER_LOST_TIMEOUT`` the call raises ``NoActorError`` saying so.

Only a call that went to one subject (the whole mesh, or one rank) is sent
again; a call to several subjects reached the others, so a copy would run
twice there: its missing ranks are left to the prober
(:mod:`monarch.actors.messaging.lost_replies`), which raises
``MessageLostError`` naming them once their procs answer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from monarch.actors.errors import NoActorError
from monarch.actors.messaging import messages as m
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps
from monarch.broker.vocabulary import subjects

if TYPE_CHECKING:
    from monarch.actors.calls.gather import Gather

RESEND_FIRST = 0.05  # seconds before the first copy; doubling...
RESEND_MAX = 0.5  # ...up to this: below the prober's first probe (1 s after a copy)
ASK_TIMEOUT = 5.0  # an "are you connected" port stays open this long


class _Waiting:
    """One call's wait for its actor's proc to come back."""

    __slots__ = ("since", "delay", "answered", "procs_were_up")

    def __init__(self, now: float) -> None:
        self.since = now
        self.delay = RESEND_FIRST
        self.answered: set[str] = set()
        self.procs_were_up = False  # every proc asked had answered when the last copy left


def no_responders(gather: Gather) -> None:
    """The broker says nobody heard ``gather``'s call (on the loop)."""
    st = gather.state
    if gather not in st.inflight:
        return
    ranks = [r for r in gather.expected if r not in gather.values and r < len(st.proc_uids)]
    procs = {st.proc_uids[r] for r in ranks}
    if gather.resend is not None and procs:
        _wait_and_resend(gather, procs)
    elif not procs:  # procs unknown here: nobody to ask whether they are merely away
        gather.fail(_no_actor(gather, "stopped, crashed, or never spawned"))
    # else: several subjects; the prober asks the missing ranks' procs.


def _no_actor(gather: Gather, why: str) -> NoActorError:
    return NoActorError(
        f"no actor of mesh {gather.state.name!r} is listening for {gather.endpoint!r} ({why})"
    )


def _wait_and_resend(gather: Gather, procs: set[str]) -> None:
    rt = gather.state.rt
    now = time.monotonic()
    waiting = gather.waiting
    if waiting is None:
        waiting = gather.waiting = _Waiting(now)
    elif waiting.procs_were_up:
        gather.fail(
            _no_actor(
                gather,
                "stopped, crashed, or never spawned: its procs are connected but none of them "
                "has it",
            )
        )
        return
    bound = rt.settings.broker_lost_timeout
    if now - waiting.since > bound:
        gather.fail(
            _no_actor(
                gather,
                f"nobody has listened for {bound:.0f} s (MONARCH_BROKER_LOST_TIMEOUT) and its "
                f"procs {sorted(procs)} have not answered: cut off from the broker, or gone; "
                "the call ran nowhere",
            )
        )
        return
    waiting.answered = set()
    for uid in procs:
        _ask(rt, uid, waiting)
    rt.loop.call_later(waiting.delay, _resend, gather, procs)
    waiting.delay = min(waiting.delay * 2, RESEND_MAX)


def _ask(rt: Any, uid: str, waiting: _Waiting) -> None:
    """An empty probe: a connected proc answers it; for one that is not, the broker does (503)."""

    def on_answer(msg: Any) -> None:
        if (msg.headers or {}).get("Status") == "503":
            return
        rt.close_port(port_id)
        waiting.answered.add(uid)

    port_id, reply = rt.open_port(on_answer)
    rt.loop.call_later(ASK_TIMEOUT, rt.close_port, port_id)
    headers = {m.KIND: "probe", m.FROM: rt.proc_uid}
    rt.publish(subjects.ctl_proc(rt.namespace, uid), dumps([]), headers, reply)


def _resend(gather: Gather, procs: set[str]) -> None:
    st = gather.state
    if gather not in st.inflight or gather.waiting is None or gather.resend is None:
        return  # answered, or failed (its proc declared dead, the mesh stopped) meanwhile
    gather.waiting.procs_were_up = procs <= gather.waiting.answered
    actor_process(st.rt).prober.restart(gather)  # the prober's clock starts again with this copy
    subject, body, headers = gather.resend
    st.rt.publish(subject, body, headers, gather.subject, gather.fail)
