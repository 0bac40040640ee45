"""A call to a proc's whole ``per_proc`` group, begun for all its idle actors in one pass.

A call to every actor of a mesh reaches each proc once, on the group's shared
subscription (:mod:`monarch.actors.hosting.group_fanout`). Handed to each actor
through the general path (delivery, mailbox, dispatch, encoding, reply), it cost
~70 Python calls an actor, ~10 us at 1,024 actors a proc, most of them asking what
is the same for the whole group: which endpoint, its arguments, whether the
replies merge or gather, whether the caller waits. :func:`handle_group_call` asks
that once and leaves each actor only its own part, in rank order:

* its lost-message check (:meth:`SequenceCheck.check_number`, per actor as always; the
  message's number is read once);
* its activity record (begun and ended as in :meth:`Dispatch._invoke_async`);
* its endpoint's first step in its runner's task and context, as eager start does
  for a single call (:meth:`LoopRunner.step`): an endpoint that suspends is handed
  to its runner's task with the rest of its handling (:meth:`Dispatch._go_on_async`);
* its reply: gathered with its siblings' into one message, merged if the call
  reduces (:mod:`monarch.actors.hosting.reduce`), or sent by :meth:`Replying._respond`
  as before when it is an error, big, or not plain msgpack.

It is taken only where the general path would start the call at once for that
actor too (:meth:`LoopRunner.ready_to_start`: eager start on, nothing queued or
running, called from the intake); an actor that is busy, stopping or failed gets
the message through the general path at its turn. What an actor sees, and what its
caller gets back, are unchanged. The whole message goes the general way when it
is not a plain call to the whole mesh (a send, a slice's call, a caller that
blocks, an explicit response port, a concurrent or sync endpoint, arguments that
are changeable or travel out of band), or while someone records calls
(``call_listeners``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from monarch.actors.calls.activity import call_listeners
from monarch.actors.calls.context import use_context
from monarch.actors.hosting.mailbox import Resume
from monarch.actors.hosting.reduce import IMMUTABLE, Unencoded, group_reducer
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.lost_sends import numbering
from monarch.broker.bodies.codec import dumps, plain_msgpack
from monarch.core.runtime import Runtime
from monarch.rdma.bulk import stays_inline

if TYPE_CHECKING:  # annotations only
    from monarch.actors.hosting.group_fanout import SharedReading
    from monarch.actors.hosting.instance import ActorInstance

log = logging.getLogger(__name__)


def handle_group_call(
    rt: Runtime, members: tuple[ActorInstance, ...], msg: Msg, reading: SharedReading
) -> bool:
    """Deliver ``msg`` (on a group's shared subject) to ``members`` as a group call;
    False: not one (nothing was delivered, the caller delivers it actor by actor)."""
    headers = msg.headers
    if call_listeners or not members or not headers or not msg.reply:
        return False
    if headers.get(m.KIND) != "call" or m.WAIT in headers:
        return False
    name = headers.get(m.ENDPOINT, "")
    # The group's actors are of one class (one mesh): the first one's endpoint is each one's
    # (an actor's own table only ever adds ad-hoc endpoints under names it lacks).
    prop = members[0].endpoints.get(name)
    if prop is None or not prop.is_async or prop.concurrent or prop.explicit_response_port:
        return False
    arguments = reading.whole_mesh_arguments(msg)
    if arguments is None:
        return False
    args, kwargs = arguments
    method = prop._method
    merged = reading.merged
    reducer = group_reducer(rt)
    max_payload = rt.max_payload
    gathered: list[ActorInstance] = []  # plain replies, leaving as one message
    bodies: list[bytes] = []
    numbered = numbering(msg)  # the same for each actor: read once
    for inst in members:
        runner: Any = inst._runner  # a LoopRunner: only all-async actors share a subject
        if inst._stopping or inst.failed is not None or not runner.ready_to_start():
            _deliver(inst, msg)  # the general path, at its turn
            continue
        if numbered is not None:
            hole = inst._sequence.check_number(*numbered)
            if hole is not None and inst._lost_before(msg, *hole):
                continue  # refused, its caller told
        activity = inst.activity
        call = activity.begin(name, False, msg)
        try:
            coro, value = runner.step(_first_step, inst, method, args, kwargs)
            if coro is None:  # returned without suspending (the common case)
                body = Unencoded(value) if merged and type(value) in IMMUTABLE else dumps(value)
        except BaseException as e:  # SystemExit, CancelledError too (as _invoke_async has them)
            activity.end(call, False)
            inst._respond(msg, *inst._failure(prop, e), prop, inst.rank)
        else:
            if coro is not None:  # suspended: the runner's task does the rest
                rest = inst._go_on_async(prop, msg, call, Resume(coro, value))
                runner.go_on(rest, runner.step(rest.send, None))
                continue
            activity.end(call, True)
            if merged:
                reducer.add(inst, msg, body)
            elif stays_inline(len(body)) and len(body) <= max_payload and plain_msgpack(body):
                gathered.append(inst)
                bodies.append(body)
            else:
                inst._respond(msg, True, body, prop, inst.rank)
        if inst._stop_requested:
            inst._stop_requested = False
            inst._stop_soon()
    reducer.gather_all(msg, gathered, bodies)
    return True


def _first_step(
    inst: ActorInstance, method: Callable[..., Any], args: tuple | list, kwargs: dict
) -> tuple[Any, Any]:
    """In the actor's runner: its endpoint run up to its first suspension.
    ``(None, return value)``, or ``(the coroutine, what it yielded)``."""
    use_context(inst.own_context)
    coro = method(inst.obj, *args, **kwargs)
    try:
        return coro, coro.send(None)
    except StopIteration as done:
        return None, done.value


def _deliver(inst: ActorInstance, msg: Msg) -> None:
    try:
        inst.deliver(msg)
    except Exception:  # one actor's intake must not keep the message from the rest
        log.exception("actor %s: delivery of %s failed", inst.actor_id, msg.subject)
