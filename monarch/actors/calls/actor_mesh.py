"""``ActorMesh``: a reference to actors spawned on a proc mesh, and how messages reach them.

A mesh reference is a view (see :mod:`monarch.actors.meshes.shape`) plus the
shared :class:`~monarch.actors.calls.mesh_state.MeshState` of the actors behind
it. Sending encodes the arguments on the caller's thread (so a bad value fails
right there), then hands one closure to the runtime loop, which publishes once
per subject token list of the view (usually once: the server fans it out).
Replies come back to a port of the caller's proc and are gathered by a
:class:`~monarch.actors.calls.gather.Gather`.

The reference's wire form (its msgpack ext, and pickling) stays here, beside
the class: encoding and decoding need :class:`ActorMesh` and ``__reduce__``
needs them, so apart they would import each other.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Generic, TypeVar

from monarch.actors.calls.actor import class_ref, resolve_class
from monarch.actors.calls.context import sender_id
from monarch.actors.calls.endpoint import ActorEndpoint
from monarch.actors.calls.gather import Gather
from monarch.actors.calls.mesh_state import MeshState
from monarch.actors.calls.tracing import traced_call, traced_cast
from monarch.actors.errors import NotAnEndpointError, SupervisionError
from monarch.actors.meshes.mesh_ops import MeshShapeOps
from monarch.actors.meshes.shape import Extent, View
from monarch.actors.messaging import messages as m
from monarch.actors.messaging.flow import FLOW_ENDPOINT
from monarch.actors.process_state import actor_process
from monarch.broker.bodies.ext import register_ext
from monarch.broker.vocabulary.headers import ADHOC, TRACE
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.rdma.bulk import encode_body
from monarch.telemetry import recorder as _tel

A = TypeVar("A")
_log = logging.getLogger(__name__)


class MessageTooLargeError(ValueError):
    """An encoded message exceeds the broker's ``max_payload``."""


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

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._class_name} {self._view.extent!r}>"

    def __reduce__(self) -> tuple:
        """Pickle as a reference (the fields of its ext type), so a mesh travels inside
        any picklable value (a dataclass, an object holding a list of meshes...)."""
        return (_decode_mesh, (_encode_mesh(self),))

    @property
    def initialized(self) -> Future[None]:
        """Completes (None) once the mesh was spawned on its procs, as Monarch 0.7's.

        Here that is once the actors' ``__init__`` ran (a spawn is answered
        then); Monarch's completes earlier, when the mesh exists. As in
        Monarch, an ``__init__`` that raised is not reported here but to
        supervision and to the mesh's calls.
        """
        st = self._state
        return Future(st.rt.run_coro(st.wait_settled()))

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
        fold: tuple[Any, Any, str] | None = None,
    ) -> Any:
        """Send a call; its future (or, for ``stream``, one per rank).

        ``fold`` (gather ``"fold"``, an Accumulator given a reducer): the identity, the
        combine, and the ``Mon-Reduce`` header's value."""
        if _tel.ON and trace is None and flow:  # telemetry off: this check is all it costs
            return traced_call(self, endpoint, args, kwargs, gather, adhoc, fold)
        if flow:  # a user's call (not a flow marker) learns of earlier losses
            self._state.raise_if_lost()
        body, headers = self._encode(endpoint, args, kwargs, "call", adhoc)
        tokens, expected = self._targets("choose" if gather == "choose" else "all")
        if flow and len(expected) == 1 and gather not in ("stream", "fold"):
            headers[m.WAIT] = "one"  # one reply that a caller waits on: busy-poll for it
        if fold is not None:
            headers[m.REDUCE] = fold[2]
        g = Gather(
            self._state, self._view, expected, gather, endpoint,
            fold[:2] if fold is not None else None,
        )  # fmt: skip
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
