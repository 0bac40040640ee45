"""Argument checks at the caller: a call that cannot reach an endpoint fails before sending.

``EndpointProperty.check_args`` binds the arguments against the method's
signature (less ``self``, and less the response port of an explicit-response-port
endpoint) and raises ``TypeError`` naming ``Class.endpoint``; every adverb of an
endpoint checks first, so nothing is sent. The class itself is checked at
``spawn`` (``check_actor_class``), a value that cannot be encoded fails at the
caller (``encode_body``), and ``@concurrent_endpoint`` refuses what it cannot run.
"""

from __future__ import annotations

import inspect
import threading
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, concurrent_endpoint, endpoint
from monarch.actors.calls.actor import check_actor_class
from monarch.actors.calls.endpoint import ActorEndpoint, EndpointProperty, send
from monarch.broker.bodies.codec import EncodeError
from monarch.rdma.bulk import encode_body

QUAL = "Worker.ep"


class Worker(Actor):
    @endpoint
    def two(self, a, b):
        return a + b

    @endpoint
    def defaults(self, a, b=1, c=2):
        return a

    @endpoint
    def keyword_only(self, a, *, scale):
        return a

    @endpoint
    def positional_only(self, a, /, b):
        return a

    @endpoint
    def anything(self, *args, **kwargs):
        return args

    @endpoint(explicit_response_port=True)
    def with_port(self, port, x):
        port.send(x)


def check(prop: EndpointProperty, *args, **kwargs) -> None:
    prop.check_args(QUAL, args, kwargs)


# -- check_args ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "args", "kwargs"),
    [
        (Worker.two, (1, 2), {}),
        (Worker.two, (1,), {"b": 2}),
        (Worker.two, (), {"a": 1, "b": 2}),
        (Worker.defaults, (1,), {}),
        (Worker.defaults, (1, 2, 3), {}),
        (Worker.defaults, (1,), {"c": 5}),
        (Worker.keyword_only, (1,), {"scale": 2}),
        (Worker.positional_only, (1, 2), {}),
        (Worker.positional_only, (1,), {"b": 2}),
        (Worker.anything, (), {}),
        (Worker.anything, (1, 2, 3), {"x": 4}),
        (Worker.with_port, (7,), {}),
    ],
)
def test_arguments_that_bind_pass(prop, args, kwargs):
    check(prop, *args, **kwargs)


@pytest.mark.parametrize(
    ("prop", "args", "kwargs", "says"),
    [
        (Worker.two, (1,), {}, "missing a required argument: 'b'"),
        (Worker.two, (), {}, "missing a required argument: 'a'"),
        (Worker.two, (1, 2, 3), {}, "too many positional arguments"),
        (Worker.two, (1, 2), {"c": 3}, "unexpected keyword argument 'c'"),
        (Worker.two, (1,), {"a": 1, "b": 2}, "multiple values for argument 'a'"),
        (Worker.defaults, (), {}, "missing a required argument: 'a'"),
        (Worker.defaults, (1, 2, 3, 4), {}, "too many positional arguments"),
        (Worker.keyword_only, (1,), {}, "missing a required argument: 'scale'"),
        (Worker.keyword_only, (1, 2), {}, "too many positional arguments"),
        (Worker.positional_only, (), {"a": 1, "b": 2}, "'a'"),
        (Worker.with_port, (), {}, "missing a required argument: 'x'"),
        (Worker.with_port, (1, 2), {}, "too many positional arguments"),
    ],
)
def test_arguments_that_do_not_bind_raise_type_error_naming_the_endpoint(prop, args, kwargs, says):
    with pytest.raises(TypeError) as info:
        check(prop, *args, **kwargs)
    assert str(info.value).startswith(f"{QUAL}(): ")
    assert says in str(info.value)


# A signature: how many plain parameters, how many of them have defaults, and
# whether there are *args, keyword-only ones or **kwargs.
signatures = st.builds(
    lambda n, d, var, kwonly, varkw: (n, min(d, n), var, kwonly, varkw),
    st.integers(0, 4),
    st.integers(0, 4),
    st.booleans(),
    st.integers(0, 2),
    st.booleans(),
)
calls = st.tuples(
    st.integers(0, 6),
    st.sets(st.sampled_from(["p0", "p1", "p2", "p3", "k0", "k1", "zz"]), max_size=4),
)


def make_method(shape) -> object:
    n, d, var, kwonly, varkw = shape
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD)]
    for i in range(n):
        default = 0 if i >= n - d else P.empty
        params.append(P(f"p{i}", P.POSITIONAL_OR_KEYWORD, default=default))
    if var:
        params.append(P("args", P.VAR_POSITIONAL))
    params += [P(f"k{i}", P.KEYWORD_ONLY) for i in range(kwonly)]
    if varkw:
        params.append(P("kwargs", P.VAR_KEYWORD))

    def method(*args, **kwargs):
        return None

    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return method


@given(signatures, calls)
def test_check_args_accepts_exactly_what_the_method_would_accept(shape, call):
    method = make_method(shape)
    npos, names = call
    args, kwargs = tuple(range(npos)), {name: 0 for name in names}
    try:
        inspect.signature(method).bind(None, *args, **kwargs)
        binds = True
    except TypeError:
        binds = False
    prop = EndpointProperty(method)  # type: ignore[arg-type]
    if binds:
        prop.check_args(QUAL, args, kwargs)
    else:
        with pytest.raises(TypeError, match=r"^Worker\.ep\(\): "):
            prop.check_args(QUAL, args, kwargs)


# -- every adverb checks before it sends ---------------------------------------------------


class FakeMesh:
    """Stands in for an actor mesh's sending side: records what would be sent."""

    def __init__(self, size: int = 1) -> None:
        self._class_name = "Worker"
        self._name = "workers"
        self._view = list(range(size))
        self.extent = {"gpus": size}
        self.sent: list[tuple] = []

    def _call(self, name, args, kwargs, **options):
        self.sent.append((name, args, kwargs))
        return [SimpleNamespace()] if options.get("gather") == "stream" else SimpleNamespace()

    def _cast(self, name, args, kwargs, **options):
        self.sent.append((name, args, kwargs))


ADVERBS = {
    "call": lambda ep, *a, **k: ep.call(*a, **k),
    "call_one": lambda ep, *a, **k: ep.call_one(*a, **k),
    "choose": lambda ep, *a, **k: ep.choose(*a, **k),
    "broadcast": lambda ep, *a, **k: ep.broadcast(*a, **k),
    "stream": lambda ep, *a, **k: list(ep.stream(*a, **k)),
    "send": lambda ep, *a, **k: send(ep, a, k),
}


@pytest.mark.parametrize("adverb", sorted(ADVERBS))
def test_every_adverb_refuses_bad_arguments_before_sending(adverb):
    mesh = FakeMesh()
    ep = ActorEndpoint(mesh, Worker.two)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Worker\.two\(\): "):
        ADVERBS[adverb](ep, 1, 2, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        ADVERBS[adverb](ep, 1, 2, extra=3)
    assert mesh.sent == []
    ADVERBS[adverb](ep, 1, b=2)
    assert mesh.sent == [("two", (1,), {"b": 2})]


def test_call_one_on_a_mesh_of_several_actors_raises_before_sending():
    mesh = FakeMesh(size=4)
    ep = ActorEndpoint(mesh, Worker.two)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one actor"):
        ep.call_one(1, 2)
    assert mesh.sent == []


def test_calling_a_remote_endpoint_like_a_function_says_which_adverbs_to_use():
    ep = ActorEndpoint(FakeMesh(), Worker.two)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Worker\.two is an endpoint.*\.call\(\.\.\.\)"):
        ep(1, 2)


def test_inside_the_actor_an_endpoint_is_a_plain_method_call():
    assert Worker().two(1, 2) == 3


# -- values that cannot travel ---------------------------------------------------------------


@pytest.mark.parametrize("value", [threading.Lock(), (x for x in range(3))])
def test_an_argument_that_cannot_be_encoded_fails_at_the_caller_naming_its_type(value):
    with pytest.raises(EncodeError, match="cannot encode|pickl") as info:
        encode_body(((1, value), {}, None), readers=1)
    assert type(value).__name__.split("_")[-1].lower() in str(info.value).lower()


# -- the class, at spawn --------------------------------------------------------------------


def test_spawn_refuses_what_is_not_an_actor_class():
    for thing in (object, Worker(), "Worker", 3):
        with pytest.raises(TypeError, match="subclass of monarch.actor.Actor"):
            check_actor_class(thing)
    assert check_actor_class(Worker) is Worker


def test_spawn_refuses_a_class_that_mixes_sync_and_async_endpoints():
    class Mixed(Actor):
        @endpoint
        def a(self):
            pass

        @endpoint
        async def b(self):
            pass

    with pytest.raises(ValueError, match=r"mixes both async and sync endpoints.*\['a'\].*\['b'\]"):
        check_actor_class(Mixed)


def test_spawn_refuses_hooks_of_the_other_kind_than_the_endpoints():
    class AsyncWithSyncCleanup(Actor):
        @endpoint
        async def a(self):
            pass

        def __cleanup__(self, exc):
            pass

    class SyncWithAsyncSupervise(Actor):
        @endpoint
        def a(self):
            pass

        async def __supervise__(self, failure):
            return True

    with pytest.raises(ValueError, match="synchronous __cleanup__"):
        check_actor_class(AsyncWithSyncCleanup)
    with pytest.raises(ValueError, match="async __supervise__"):
        check_actor_class(SyncWithAsyncSupervise)


def test_an_inherited_endpoint_overridden_by_a_plain_method_no_longer_counts():
    class Base(Actor):
        @endpoint
        async def a(self):
            pass

    class Child(Base):
        def a(self):  # a plain method now: not an endpoint, so no sync endpoint either
            pass

        @endpoint
        def b(self):
            pass

    assert check_actor_class(Child) is Child


def test_concurrent_endpoint_refuses_a_sync_method_or_an_endpoint():
    def sync(self):
        pass

    async def coro(self):
        pass

    with pytest.raises(ValueError, match="only wrap async endpoints"):
        concurrent_endpoint(sync)
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        concurrent_endpoint(endpoint(coro))
    assert concurrent_endpoint(coro).concurrent
