"""``@endpoint`` and the adverbs used to message actors through one.

``@endpoint`` marks an actor method as callable from other processes. On an
actor mesh, ``mesh.method`` is an :class:`ActorEndpoint` whose adverbs say how
to deliver: ``call`` (all, gather a ValueMesh), ``call_one`` (exactly one
actor), ``choose`` (any one), ``broadcast`` (all, no reply), ``stream`` (all,
replies as they arrive). Arguments are checked against the method's signature
at the caller, so a wrong call fails with ``TypeError`` before anything is
sent.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from monarch.core.future import Future

if TYPE_CHECKING:
    from monarch.actors.calls.actor_mesh import ActorMesh
    from monarch.actors.meshes.value_mesh import ValueMesh

R = TypeVar("R")


class EndpointProperty(Generic[R]):
    """What ``@endpoint`` puts on the actor class: the method plus how to call it."""

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        propagate: Any = None,
        explicit_response_port: bool = False,
        instrument: bool = False,
        concurrent: bool = False,
    ) -> None:
        self._method = method
        self.name = method.__name__
        self.is_async = inspect.iscoroutinefunction(method)
        self.explicit_response_port = explicit_response_port
        self.concurrent = concurrent
        self.propagate = propagate
        self.signature = inspect.signature(method)
        self._fast_range = self._positional_range()
        functools.update_wrapper(self, method)  # type: ignore[arg-type]
        # ``actor.endpoint._method(actor)`` (TorchForge's tests run an actor's setup that
        # way on an instance built directly): the bound method below forwards unknown
        # attributes to its function, so the function names itself.
        with contextlib.suppress(AttributeError, TypeError):
            method._method = method  # type: ignore[attr-defined]

    @property
    def _explicit_response_port(self) -> bool:
        """Monarch's name: whether the reply leaves through a port rather than as the
        method's return when it returns (an explicit port, or a concurrent endpoint,
        whose reply is sent when its task ends; Monarch builds those on a port)."""
        return self.explicit_response_port or self.concurrent

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        # Inside the actor, ``self.method(...)`` is a plain local call.
        return types.MethodType(self._method, instance)

    def _positional_range(self) -> tuple[int, int] | None:
        """(fewest, most) positional arguments a call may pass, when only those can
        decide the binding (plain positional parameters, no keyword-only without
        default); None means "always use ``Signature.bind``"."""
        params = list(self.signature.parameters.values())[2 if self.explicit_response_port else 1 :]
        kinds = inspect.Parameter
        if any(p.kind not in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) for p in params):
            return None
        required = sum(1 for p in params if p.default is p.empty)
        return required, len(params)

    def check_args(self, qualname: str, args: tuple, kwargs: dict) -> None:
        """Raise ``TypeError`` at the caller if the arguments cannot bind."""
        fast = self._fast_range
        if not kwargs and fast is not None and fast[0] <= len(args) <= fast[1]:
            return  # the common case, decided without Signature.bind (which costs ~8 us)
        try:
            if self.explicit_response_port:
                self.signature.bind(None, None, *args, **kwargs)
            else:
                self.signature.bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{qualname}(): {e}") from None


@overload
def endpoint(method: Callable[..., R]) -> EndpointProperty[R]: ...
@overload
def endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = False
) -> Callable[[Callable[..., R]], EndpointProperty[R]]: ...


def endpoint(method: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Mark an actor method (sync or ``async``) as an endpoint.

    Sync endpoints run on the actor's own thread, so they may block (even on
    another actor's ``.get()``); async endpoints run on the proc's event loop.
    Either way an actor handles one message at a time, in arrival order.
    """
    if method is not None:
        return EndpointProperty(method, **options)
    return lambda m: EndpointProperty(m, **options)


class ActorEndpoint(Generic[R]):
    """One endpoint of one actor mesh (or a slice of it)."""

    def __init__(
        self, mesh: ActorMesh, prop: EndpointProperty[R], adhoc: str | None = None
    ) -> None:
        self._mesh = mesh
        self._prop = prop
        self._adhoc = adhoc  # set by as_endpoint(): the receiver accepts a plain method
        self._qualname = f"{mesh._class_name}.{prop.name}"

    @property
    def name(self) -> str:
        return self._prop.name

    def _check(self, args: tuple, kwargs: dict) -> None:
        self._prop.check_args(self._qualname, args, kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Send to every actor of the mesh; a future of all results as a ValueMesh."""
        self._check(args, kwargs)
        return self._mesh._call(self._prop.name, args, kwargs, gather="mesh", adhoc=self._adhoc)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the mesh's only actor; ``ValueError`` unless it has exactly one."""
        if len(self._mesh._view) != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor; {self._mesh._name} has "
                f"extent {self._mesh.extent!r}: slice it first or use call()"
            )
        self._check(args, kwargs)
        return self._mesh._call(self._prop.name, args, kwargs, gather="one", adhoc=self._adhoc)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to one actor of the mesh, picked by the runtime; a future of its result."""
        self._check(args, kwargs)
        return self._mesh._call(self._prop.name, args, kwargs, gather="choose", adhoc=self._adhoc)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; delivery order per actor still holds."""
        self._check(args, kwargs)
        self._mesh._cast(self._prop.name, args, kwargs, adhoc=self._adhoc)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every actor; yield one future per reply, in arrival order."""
        self._check(args, kwargs)
        futures = self._mesh._call(
            self._prop.name, args, kwargs, gather="stream", adhoc=self._adhoc
        )
        return iter(futures)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Tensor engine: call this endpoint on the procs where the tensors live; handles back.

        Imported lazily so that the actor API does not import torch
        (see :func:`monarch.tensors.remote.actor_rref`).
        """
        # A door into the tensor engine, a layer above (pyproject's import contract
        # names it): imported when used, so torch stays off the actor API's path.
        from monarch.tensors.remote import actor_rref

        return actor_rref(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self._qualname} is an endpoint of a remote actor mesh: use "
            f".call(...), .call_one(...), .choose(...), .broadcast(...) or .stream(...)"
        )

    def __repr__(self) -> str:
        return f"<endpoint {self._qualname} of {self._mesh!r}>"

    @property
    def mesh(self) -> Any:
        """The actor mesh (or slice of it) this endpoint is called on."""
        return self._mesh

    @property
    def qualname(self) -> str:
        """``Class.endpoint``, as errors name it."""
        return self._qualname


def concurrent_endpoint(method: Callable[..., Any] | None = None, **options: Any) -> Any:
    """An endpoint whose messages start in arrival order but may run concurrently.

    For ``async`` methods that wait on I/O or other actors: the actor takes its
    next message while this one awaits. Tasks still running when the actor
    stops are cancelled before ``__cleanup__`` runs. It takes ``@endpoint``'s
    options itself; as in Monarch, it raises ``ValueError`` where the class is
    defined if it wraps a sync method or an ``@endpoint``.
    """
    if method is not None:
        return _concurrent(method, options)
    return lambda m: _concurrent(m, options)


def _concurrent(method: Any, options: dict[str, Any]) -> EndpointProperty:
    if isinstance(method, EndpointProperty):
        raise ValueError(
            "concurrent_endpoint does not wrap @endpoint; pass endpoint options to "
            f"@concurrent_endpoint (on {method.name!r})"
        )
    if not inspect.iscoroutinefunction(method):
        raise ValueError(
            "concurrent_endpoint can only wrap async endpoints: make "
            f"{getattr(method, '__qualname__', method)!r} an async def, or use @endpoint"
        )
    return EndpointProperty(method, concurrent=True, **options)


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> ActorEndpoint:
    """Call a plain (undecorated) actor method through the endpoint adverbs.

    ``as_endpoint(mesh.helper).call(...)``: the caller opts in, and the message
    tells the receiving actor that it did.
    """
    mesh = getattr(not_an_endpoint, "_mesh", None)
    name = getattr(not_an_endpoint, "_name", None)
    if mesh is None or name is None:
        raise TypeError(f"as_endpoint() takes a method of an actor mesh, not {not_an_endpoint!r}")
    method = getattr(mesh._state.cls, name)
    prop = EndpointProperty(
        method, propagate=propagate, explicit_response_port=explicit_response_port
    )
    return ActorEndpoint(mesh, prop, adhoc="port" if explicit_response_port else "1")


def send(
    endpoint: ActorEndpoint,
    args: tuple,
    kwargs: dict,
    port: Any = None,
    selection: str = "all",
) -> None:
    """Send a message to ``endpoint``'s mesh; each actor's reply goes to ``port`` (if given).

    ``selection="choose"`` sends to one actor picked by the runtime instead of all.
    """
    endpoint._check(tuple(args), dict(kwargs))
    endpoint._mesh._cast(
        endpoint.name,
        tuple(args),
        dict(kwargs),
        adhoc=endpoint._adhoc,
        port=port,
        selection=selection,
    )


class Accumulator(Generic[R]):
    """Fold the replies of every actor of a mesh: ``Accumulator(mesh.ep, 0, add).accumulate(x)``.

    ``reducer`` (keyword, ours; Monarch's Rust accumulators have one, its Python
    ``Accumulator`` does not) merges two replies into one. Given it, the replies
    of the actors of a ``per_proc`` mesh that live in one proc are merged there
    and travel as one message (:mod:`monarch.actors.hosting.reduce`), so a
    call's replies grow with procs, not actors. It must be associative and
    commutative, and agree with ``combine``: ``combine(a, reducer(x, y)) ==
    combine(combine(a, x), y)`` (``sum``: ``operator.add`` for both). It travels
    with the call (pickled: a lambda is fine; ``MONARCH_PICKLE=0`` refuses it).
    If it raises on a proc, ``accumulate`` raises that error. Errors are never
    merged: a failing rank fails the call naming that rank, as without it.
    """

    def __init__(
        self,
        endpoint: ActorEndpoint,
        identity: Any,
        combine: Callable[[Any, Any], Any],
        *,
        reducer: Callable[[R, R], R] | None = None,
    ):
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine
        self._reducer = reducer
        self._header: str | None = None
        if reducer is not None:
            # Imported here: the wire form is the messaging layer's, and the codec is
            # only needed by an Accumulator that merges on the procs.
            from monarch.actors.messaging.reduction import encode_reducer

            self._header = encode_reducer(reducer)  # once: refused here if it cannot travel

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._header is not None:
            ep = self._endpoint
            ep._check(args, kwargs)
            fold = (self._identity, self._combine, self._header)
            return ep._mesh._call(ep._prop.name, args, kwargs, gather="fold", adhoc=ep._adhoc,
                                  fold=fold)  # fmt: skip
        futures = list(self._endpoint.stream(*args, **kwargs))
        result: Future[Any] = Future()
        state = {"value": self._identity, "left": len(futures)}
        lock = threading.Lock()
        if not futures:
            result.set_result(self._identity)

        def on_done(f: Future) -> None:
            with lock:
                fold(f)

        def fold(f: Future) -> None:
            if result.done():
                return
            try:
                value = f.get()
            except BaseException as e:
                result.set_exception(e)
                return
            try:
                state["value"] = self._combine(state["value"], value)
            except BaseException as e:
                result.set_exception(e)
                return
            state["left"] -= 1
            if state["left"] == 0:
                result.set_result(state["value"])

        for f in futures:
            f.add_callback(on_done)
        return result


def endpoints_of(cls: type) -> dict[str, EndpointProperty]:
    """All endpoints an actor class defines or inherits, by name."""
    found: dict[str, EndpointProperty] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            elif name in found:
                del found[name]  # overridden by a plain attribute
    return found
