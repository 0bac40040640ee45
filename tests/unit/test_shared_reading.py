"""What a ``per_proc`` group's actors may share of a message (monarch.actors.hosting.group_fanout)."""

from __future__ import annotations

import pytest

from monarch.actors.hosting.group_fanout import SharedReading, unchangeable
from monarch.actors.messaging import messages as m
from monarch.core.runtime import LocalMsg


@pytest.mark.parametrize(
    "args, kwargs",
    [((), {}), ((1, 2.5, "s", b"b", None, True, 1j), {}), (((1, ("a", None)),), {"k": "v"})],
)
def test_numbers_strings_bytes_none_and_tuples_of_them_are_shared(args, kwargs):
    assert unchangeable(args, kwargs)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (([1],), {}),
        (((1, [2]),), {}),
        ((), {"k": {"a": 1}}),
        ((bytearray(b"x"),), {}),
        ((frozenset(),), {}),
        ((object(),), {}),
    ],
)
def test_anything_an_actor_could_change_is_decoded_by_each_actor(args, kwargs):
    # frozenset and object(): not changeable in place, but not worth telling apart
    assert not unchangeable(args, kwargs)


def test_a_reducing_call_is_marked_merged_once_for_the_group():
    call = LocalMsg("mon.x.mesh.m.u._", b"", "mon.x.port.p.1", {m.REDUCE: "add AAAA"})
    no_reply = LocalMsg("mon.x.mesh.m.u._", b"", "", {m.REDUCE: "add AAAA"})
    plain = LocalMsg("mon.x.mesh.m.u._", b"", "mon.x.port.p.1", {m.KIND: "call"})
    assert [SharedReading(x).merged for x in (call, no_reply, plain)] == [True, False, False]
    assert SharedReading(call).args is None  # not decoded until an actor reads it


def test_a_whole_mesh_calls_arguments_are_read_once_and_only_when_shareable():
    from monarch.rdma.bulk import encode_body

    def reading(value, data: bytes | None = None) -> tuple[SharedReading, LocalMsg]:
        body = encode_body(value, readers=1) if data is None else data
        msg = LocalMsg("mon.x.mesh.m.u._", body, "mon.x.port.p.1", {m.KIND: "call"})
        return SharedReading(msg), msg

    whole, msg = reading(((1, "a"), {"k": (2,)}, None))
    assert whole.whole_mesh_arguments(msg) == ((1, "a"), {"k": (2,)})
    assert whole.args == ((1, "a"), {"k": (2,)}, None)  # the group's actors take these
    first = whole.whole_mesh_arguments(msg)
    assert whole.whole_mesh_arguments(msg)[0] is first[0]  # decoded once
    sliced, msg = reading(((1,), {}, [["w"], [2], [0, 1]]))
    assert sliced.whole_mesh_arguments(msg) is None  # each actor its place in the slice
    assert sliced.args == ((1,), {}, [["w"], [2], [0, 1]])
    changeable, msg = reading((([1],), {}, None))
    assert changeable.whole_mesh_arguments(msg) is None and changeable.args is False
    for bad in (b"\xc1 not a body", None):
        unreadable, msg = reading(("args", "kwargs", None), bad)
        assert unreadable.whole_mesh_arguments(msg) is None
        assert unreadable.args is None  # each actor reads (and reports) it itself
