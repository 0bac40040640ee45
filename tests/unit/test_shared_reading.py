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
