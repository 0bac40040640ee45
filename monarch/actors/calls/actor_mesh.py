"""``ActorMesh``: a reference to actors spawned on a proc mesh, and how messages reach them.

A mesh reference is a view (see :mod:`monarch.actors.meshes.shape`) plus the shared
:class:`MeshState` of the actors behind it. Sending encodes the arguments on
the caller's thread (so a bad value fails right there), then hands one closure
to the runtime loop, which publishes once per subject token list of the view
(usually once: the server fans it out). Replies come back to a port of the
caller's proc and are gathered by a :class:`~monarch.actors.calls.gather.Gather`.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from monarch.actors.calls.actor import class_ref, resolve_class
from monarch.actors.calls.context import sender_id
from monarch.actors.calls.endpoint import ActorEndpoint, EndpointProperty, endpoints_of
from monarch.actors.calls.gather import Gather
from monarch.actors.calls.instance import ADHOC
from monarch.actors.calls.tracing import traced_call, traced_cast
from monarch.actors.errors import (
    MeshStoppedError,
    MessageLostError,
    NotAnEndpointError,
    SpawnError,
    SupervisionError,
    describe_actor,
)
from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Extent, Point, View
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT, FlowControl, flow_settings
from monarch.actors.messaging.rpc import request_all
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.codec import dumps
from monarch.broker.bodies.ext import register_ext
from monarch.broker.vocabulary import subjects
from monarch.broker.vocabulary.headers import TRACE
from monarch.core.future import Future
from monarch.core.runtime import LocalMsg, Runtime, runtime
from monarch.rdma.bulk import encode_body
from monarch.telemetry import recorder as _tel

if TYPE_CHECKING:
    pass

A = TypeVar("A")
_log = logging.getLogger(__name__)


class MessageTooLargeError(ValueError):
    """An encoded message exceeds the broker's ``max_payload``."""


class MeshState:
    """What every view of one actor mesh shares. Mutated on the runtime loop only."""

    def __init__(
        self, rt: Runtime, name: str, uid: str, cls: type | None, class_name: str, base: Extent
    ) -> None:
        self.rt = rt
        self.name = name
        self.uid = uid
        self.cls = cls
        self.class_name = class_name
        self.base = base
        self.endpoints: dict[str, EndpointProperty] = endpoints_of(cls) if cls is not None else {}
        self.ready = False
        self.error: BaseException | None = None
        self.stopped: str | None = None  # why, once stopped
        self.dead: dict[int, BaseException] = {}  # base rank -> why
        self._queued: list[tuple] = []
        self.inflight: set[Gather] = set()
        self.proc_uids: list[str] = []  # per rank, where known (owner side)
        self.local: Any = None  # the ActorInstance when the whole mesh is in this process
        self.settled = threading.Event()  # spawned (or failed): references may leave now
        self.flow = FlowControl(name, loop=rt.loop, **flow_settings(rt.settings))
        self.owner_proc = rt.proc_uid  # where the owner lives, and who it is
        self.owner_actor = "client"
        # (rank, count, subject) for messages from here that its actors never got
        # (monarch.actors.messaging.lost_sends): appended on the loop, taken by the next sender.
        self.lost: collections.deque[tuple[int, int, str]] = collections.deque()
        actor_process(rt).mesh_states[uid] = self

    def actor_id(self, rank: int) -> str:
        return f"{self.name}.{self.uid}[{rank}]"

    def note_lost(self, rank: int, count: int, subject: str) -> None:
        """An actor of this mesh reports messages from this process that never reached it."""
        _log.warning(
            "%d message(s) from this process to rank %d of actor mesh %r were lost on the way "
            "(on %s; a broker node died?): they were not run. The next call or send on this "
            "mesh raises MessageLostError.",
            count,
            rank,
            self.name,
            subject,
        )
        self.lost.append((rank, count, subject))

    def raise_if_lost(self) -> None:
        """Raise :class:`MessageLostError` for losses reported since the last call or send."""
        if not self.lost:
            return
        counts: dict[int, int] = {}
        while self.lost:
            rank, count, _ = self.lost.popleft()
            counts[rank] = counts.get(rank, 0) + count
        total = sum(counts.values())
        raise MessageLostError(
            f"{total} message(s) this process sent to actor mesh {self.name!r} were lost on the "
            f"way and never run (lost per rank: {dict(sorted(counts.items()))}); a broker node "
            "died? The mesh goes on; this call or send was not made.",
            mesh=self.name,
            counts=counts,
        )

    # -- lifecycle (loop) ---------------------------------------------------

    def mark_ready(self) -> None:
        while self._queued:
            queued, self._queued = self._queued, []
            for args in queued:
                self._publish(*args)
        # Only now: a caller's thread that sees it may write its call itself
        # (send_from_thread), which must not overtake the queued ones.
        self.ready = True
        self.settled.set()

    def mark_failed(self, exc: BaseException) -> None:
        self.error = exc
        self.settled.set()
        queued, self._queued = self._queued, []
        for _tokens, _body, _headers, gather, _reply in queued:
            if gather is not None:
                gather.fail(exc)

    def stopped_error(self, endpoint: str | None = None) -> MeshStoppedError:
        """What a call to this stopped mesh raises, in Monarch's words (a supervision
        event with the status ``stopped: <why>``), naming the call when known."""
        actor = describe_actor(self.cls, self.class_name, self.name, Point(0, self.base))
        text = f"Supervision event: actor {actor} has status:\n  stopped: {self.stopped}"
        if endpoint:
            text = f"Endpoint call {self.name}.{endpoint}() failed, {text}"
        return MeshStoppedError(text)

    def mark_stopped(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
        exc = self.stopped_error()
        self.mark_failed(exc)
        for gather in list(self.inflight):
            gather.fail(exc)

    def mark_dead(self, ranks: list[int], exc: BaseException) -> None:
        for r in ranks:
            self.dead[r] = exc
        for gather in list(self.inflight):
            if gather.waiting_on(ranks):
                gather.fail(exc)

    # -- sending (caller's thread) --------------------------------------------

    def send_from_thread(
        self, tokens: list[list[str]], body: bytes, headers: dict, gather: Gather
    ) -> bool:
        """A gathered call to one subject, written by the caller's thread itself; False:
        nothing sent, hand it to the loop (:meth:`send`).

        Only on the common path (a mesh that is up, not in this process, no rank
        of the call known dead, no earlier call to it still unanswered: a
        pipelining caller's burst is cheaper as the loop's one or two writes
        than as a write per call), and only while the runtime has nothing queued
        before it (:meth:`Runtime.publish_from_thread`): what the loop would do
        for it here is open the reply port and stamp the count of sends so far,
        and both are safe from this thread. Saves the loop's wake-up before the
        write (benchmarks/NOTES.md 42).
        """
        if (
            not self.ready
            or self.inflight  # pipelined calls: the loop writes a burst in two writes, not one each
            or self.rt.on_loop_thread()
            or self.local is not None
            or self.stopped is not None
            or self.error is not None
            or len(tokens) != 1
            or any(r in self.dead for r in gather.expected)
        ):
            return False
        rt = self.rt
        gather.open()  # before the write: the reply may come back at once
        subject = subjects.actor(rt.namespace, self.name, self.uid, tokens[0])
        actor_process(rt).sends.stamp_count(subject, headers)
        gather.resend = (subject, body, headers)
        return rt.publish_from_thread(subject, body, headers, gather.subject)

    # -- sending (loop) -------------------------------------------------------

    def send(
        self,
        tokens: list[list[str]],
        body: bytes,
        headers: dict,
        gather: Gather | None,
        reply: str = "",
    ) -> None:
        if gather is not None:
            gather.open()
            for r in gather.expected:
                if r in self.dead:
                    gather.fail(self.dead[r])
                    return
        if self.stopped is not None:
            if gather is not None:
                gather.fail(self.stopped_error())
            return
        if self.error is not None:
            if gather is not None:
                gather.fail(self.error)
            return
        if not self.ready:
            self._queued.append((tokens, body, headers, gather, reply))
            return
        self._publish(tokens, body, headers, gather, reply)

    def _publish(
        self,
        tokens: list[list[str]],
        body: bytes,
        headers: dict,
        gather: Gather | None,
        reply: str = "",
    ) -> None:
        ns, rt = self.rt.namespace, self.rt
        if gather is not None:
            reply = gather.subject
        if self.local is not None:
            # Every actor of this mesh lives in this process: skip the broker. All
            # senders in this process take this path, so their order still holds.
            subject = subjects.actor(ns, self.name, self.uid, tokens[0])
            self.local.deliver(LocalMsg(subject, body, reply, headers))
            return
        on_error = gather.fail if gather is not None else None
        batchable = not reply  # a send: it may share one NATS message with its neighbours
        # Numbered per subject, in wire order (monarch.actors.messaging.lost_sends); a gathered
        # call is not counted, its loss is found by its caller (lost_replies).
        sends = actor_process(rt).sends
        stamp = sends.stamp if gather is None else sends.stamp_count
        for toks in tokens:
            subject = subjects.actor(ns, self.name, self.uid, toks)
            numbered = headers if len(tokens) == 1 else dict(headers)
            stamp(subject, numbered)
            if gather is not None and len(tokens) == 1:
                gather.resend = (subject, body, numbered)
            rt.publish(subject, body, numbered, reply, on_error, batchable)

    async def stop(self) -> None:
        await self.stop_actors()

    async def stop_actors(self, reason: str = "stopped by its owner") -> None:
        """Ask each proc hosting this mesh to stop its actor (owner side)."""
        if self.stopped is not None:
            return
        self.mark_stopped(reason)
        if not self.proc_uids:
            return

        requests = [  # ranks already dead have nobody to answer
            (subjects.ctl_proc(self.rt.namespace, uid), dumps(self.uid), {m.KIND: "stop_mesh"})
            for rank, uid in enumerate(self.proc_uids)
            if rank not in self.dead
        ]
        await request_all(self.rt, requests, self.rt.settings.stop_timeout + 5, absent_ok=True)


class NotAnEndpoint:
    """What ``mesh.name`` gives for a plain (non-endpoint) method of the actor class.

    Using it raises :class:`NotAnEndpointError`; ``as_endpoint(mesh.name)``
    turns it into an endpoint on purpose.
    """

    def __init__(self, mesh: ActorMesh, name: str) -> None:
        self._mesh = mesh
        self._name = name

    def _error(self) -> NotAnEndpointError:
        return NotAnEndpointError(
            f"{self._mesh._class_name}.{self._name} is not an endpoint: decorate it with "
            f"@endpoint, or wrap it with as_endpoint(mesh.{self._name}) to call it on the mesh"
        )

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise self._error()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error()


class ActorMesh(MeshShapeOps, Generic[A]):
    """A (view of a) mesh of actors; endpoints are attributes: ``mesh.train.call(...)``."""

    def __init__(self, state: MeshState, view: View) -> None:
        self._state = state
        self._view = view
        self._name = state.name
        self._class_name = state.class_name
        self._endpoint_cache: dict[str, ActorEndpoint] = {}

    def _new_with_view(self, view: View) -> ActorMesh[A]:
        return ActorMesh(self._state, view)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            # A private endpoint (``async def _numel``) is called like any other, as in
            # Monarch; any other private name (an attribute not set yet, a pickle probe) is
            # absent. ``__dict__`` directly: ``_state`` itself may not be set yet.
            state = self.__dict__.get("_state")
            if name.startswith("__") or state is None or name not in state.endpoints:
                raise AttributeError(name)
        cached = self._endpoint_cache.get(name)
        if cached is not None:
            return cached
        prop = self._state.endpoints.get(name)
        if prop is None:
            cls = self._state.cls
            if cls is not None and callable(getattr(cls, name, None)):
                return NotAnEndpoint(self, name)
            raise AttributeError(f"actor class {self._class_name} has no endpoint {name!r}")
        ep = ActorEndpoint(self, prop)
        self._endpoint_cache[name] = ep
        return ep

    def __len__(self) -> int:
        return len(self._view)

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._class_name} {self._view.extent!r}>"

    def __reduce__(self) -> tuple:
        """Pickle as a reference (the fields of its ext type), so a mesh travels inside
        any picklable value (a dataclass, an object holding a list of meshes...)."""
        return (_decode_mesh, (_encode_mesh(self),))

    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        """Stop these actors (not their procs): queued messages are handled, then ``__cleanup__``.

        ``reason`` is what a later call to the mesh is told (Monarch 0.7's argument).
        """
        st = self._state
        return Future(st.rt.run_coro(st.stop_actors(reason)))

    # -- sending (caller's thread) ---------------------------------------------

    def _encode(
        self, endpoint: str, args: tuple, kwargs: dict, kind: str, adhoc: str | None
    ) -> tuple[bytes, dict]:
        st = self._state
        if st.stopped is not None:
            raise st.stopped_error(endpoint)
        full = len(self._view) == st.base.nelements and self._view.extent == st.base
        view_spec = (
            None
            if full
            else [self._view.extent.labels, self._view.extent.sizes, list(self._view.ranks)]
        )
        # Big arguments stay here and travel out of band; each receiver fetches them.
        body = encode_body((args, kwargs, view_spec), readers=len(self._view))
        if len(body) > st.rt.max_payload:
            raise MessageTooLargeError(
                f"message to {self._class_name}.{endpoint} is {len(body)} bytes, over the broker's "
                f"max_payload of {st.rt.max_payload}"
            )
        headers = {m.KIND: kind, m.ENDPOINT: endpoint, m.FROM: sender_id()}
        if adhoc:
            headers[ADHOC] = adhoc
        return body, headers

    def _targets(self, selection: str) -> tuple[list[list[str]], list[int]]:
        view = self._view
        if selection == "choose":
            rank = random.choice(view.ranks)
            return [[str(c) for c in self._state.base.coords(rank)]], [rank]
        if selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
        return view.subject_tokens(), list(view.ranks)

    def _flow(self, nbytes: int) -> None:
        """Count a message of ``nbytes``; wait if too far ahead of the mesh; send a marker
        when due."""
        st = self._state
        if st.local is not None:
            return  # in-process delivery: the caller is never far ahead of a queue it fills
        st.flow.wait_for_room(can_block=not st.rt.on_loop_thread())
        if st.flow.count(nbytes):
            whole = ActorMesh(st, View.full(st.base))
            marker = whole._call(FLOW_ENDPOINT, (), {}, gather="mesh", flow=False)
            marker.add_callback(st.flow.mesh_answered)

    def _hold(
        self, tokens: list[list[str]], body: bytes, headers: dict, gather: Any, reply: str
    ) -> bool:
        """Called with the window full (or messages already held). On the event loop:
        keep the message in this process, in order, until markers come back
        (FlowControl.hold), as the loop must not block and a send must not fail for a
        slow receiver. False (send now) elsewhere: a caller's thread waits in
        :meth:`_flow` instead."""
        st = self._state
        if st.local is not None or not st.rt.on_loop_thread():
            return False
        st.flow.hold(len(body), lambda: self._release(tokens, body, headers, gather, reply))
        return True

    def _release(
        self, tokens: list[list[str]], body: bytes, headers: dict, gather: Any, reply: str
    ) -> None:
        self._state.send(tokens, body, headers, gather, reply)
        self._flow(len(body))

    def _call(
        self,
        endpoint: str,
        args: tuple,
        kwargs: dict,
        gather: str,
        adhoc: str | None = None,
        flow: bool = True,
        trace: str | None = None,
    ) -> Any:
        if _tel.ON and trace is None and flow:  # telemetry off: this check is all it costs
            return traced_call(self, endpoint, args, kwargs, gather, adhoc)
        if flow:  # a user's call (not a flow marker) learns of earlier losses
            self._state.raise_if_lost()
        body, headers = self._encode(endpoint, args, kwargs, "call", adhoc)
        tokens, expected = self._targets("choose" if gather == "choose" else "all")
        if flow and len(expected) == 1 and gather != "stream":
            headers[m.WAIT] = "one"  # one reply that a caller waits on: busy-poll for it
        g = Gather(self._state, self._view, expected, gather, endpoint)
        if trace:  # telemetry on (monarch.actors.calls.tracing): the spans of this call join up
            headers[TRACE] = g.trace = trace
            g.t_sent = time.time()
        st = self._state
        if flow and st.flow.must_hold() and self._hold(tokens, body, headers, g, ""):
            return g.futures if gather == "stream" else g.futures[0]
        if not st.send_from_thread(tokens, body, headers, g):
            st.rt.call_soon(st.send, tokens, body, headers, g)
        if flow:
            self._flow(len(body))
        return g.futures if gather == "stream" else g.futures[0]

    def _cast(
        self,
        endpoint: str,
        args: tuple,
        kwargs: dict,
        adhoc: str | None = None,
        port: Any = None,
        selection: str = "all",
        trace: str | None = None,
    ) -> None:
        """Send without gathering; replies (if ``port``) go straight to that port."""
        if _tel.ON and trace is None:  # telemetry off: this check is all it costs
            return traced_cast(self, endpoint, args, kwargs, adhoc, port, selection)
        self._state.raise_if_lost()
        body, headers = self._encode(endpoint, args, kwargs, "call" if port else "send", adhoc)
        if trace:
            headers[TRACE] = trace
        tokens, _ = self._targets(selection)
        reply = port.subject if port is not None else ""
        st = self._state
        if st.flow.must_hold() and self._hold(tokens, body, headers, None, reply):
            return
        st.rt.call_soon(st.send, tokens, body, headers, None, reply)
        self._flow(len(body))


def spawn_error(name: str, rank: int, err: BaseException) -> SpawnError:
    e = SpawnError(f"spawning actor mesh {name!r} failed on rank {rank}: {err}")
    e.__cause__ = err
    return e


# -- references travel as their own msgpack extension type ------------------------
#
# At top level and inside lists, dicts and tuples a reference is this ext; inside
# anything that falls back to cloudpickle, ``ActorMesh.__reduce__`` hands pickle the
# same fields and ``_decode_mesh`` as the function that rebuilds it, so both paths
# make the same reference where it lands.

_MESH_EXT = 16


def _encode_mesh(mesh: ActorMesh) -> list:
    st, view = mesh._state, mesh._view
    if not st.settled.is_set() and not st.rt.on_loop_thread():
        # A reference handed out while the actors are still being spawned would
        # be taken for a ready mesh elsewhere: wait (bounded) until they exist.
        st.settled.wait(st.rt.settings.spawn_timeout)
    cls_ref = class_ref(st.cls) if st.cls is not None else None
    return [
        st.name,
        st.uid,
        cls_ref,
        st.class_name,
        st.base.labels,
        st.base.sizes,
        view.extent.labels,
        view.extent.sizes,
        list(view.ranks),
        list(st.proc_uids),
    ]


def _decode_mesh(fields: list) -> ActorMesh:
    name, uid, cls_ref, class_name, blabels, bsizes, vlabels, vsizes, ranks = fields[:9]
    proc_uids = fields[9] if len(fields) > 9 else []
    rt = runtime()
    st = actor_process(rt).mesh_states.get(uid)
    if st is None:
        cls = resolve_class(cls_ref) if cls_ref is not None else None
        st = MeshState(rt, name, uid, cls, class_name, Extent(blabels, bsizes))
        st.proc_uids = list(proc_uids)
        st.mark_ready()  # it existed when the reference was made
        actor_process(rt).mesh_states[uid] = st
        rt.call_soon(_watch_procs, st)
    base = st.base
    return ActorMesh(st, View(Extent(vlabels, vsizes), base, ranks))


def _watch_procs(st: MeshState) -> None:
    """A holder of a reference learns of a dead proc too, so its calls in flight fail."""
    sup = actor_process(st.rt).supervisor
    if sup is None or not st.proc_uids:
        return
    for uid in set(st.proc_uids):
        ranks = [r for r, u in enumerate(st.proc_uids) if u == uid]

        def dead(uid: str, why: str, ranks: list[int] = ranks) -> None:
            st.mark_dead(
                ranks,
                SupervisionError(
                    f"proc {uid} hosting rank(s) {ranks} of actor mesh {st.name!r} is gone: {why}",
                    actor_id=st.actor_id(ranks[0]),
                    rank=ranks[0],
                ),
            )

        st.rt.loop.create_task(sup.watcher.watch(uid, dead))


register_ext(_MESH_EXT, ActorMesh, _encode_mesh, _decode_mesh)
