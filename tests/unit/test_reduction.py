"""The wire form of merged and gathered replies: ``Mon-Ranks`` ranges, the ``Mon-Reduce``
header, and a gathered reply's body."""

from __future__ import annotations

import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actors.messaging.reduction import (
    decode_ranks,
    decode_reducer,
    encode_ranks,
    encode_reducer,
    gathered_body,
)
from monarch.broker.bodies.codec import dumps, loads, plain_msgpack


@given(st.sets(st.integers(min_value=0, max_value=5000), min_size=1))
def test_ranks_round_trip(ranks):
    assert decode_ranks(encode_ranks(ranks)) == sorted(ranks)


def test_runs_are_written_as_ranges():
    assert encode_ranks([5, 0, 1, 2, 3, 8, 9]) == "0-3,5,8-9"
    assert encode_ranks(range(1024)) == "0-1023"


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "3-1", "1,1", "0-3,2", "1.5", "0-99999999"])
def test_malformed_ranks_are_refused(text):
    with pytest.raises(ValueError):
        decode_ranks(text)


def test_ranks_written_out_of_order_are_read_as_written():
    """Ours are written ascending; another writer's disjoint runs in any order still read."""
    assert decode_ranks("8-9,0-3,5") == [8, 9, 0, 1, 2, 3, 5]


def test_the_header_names_the_reducer_and_carries_it():
    text = encode_reducer(operator.add)
    assert text.startswith("_operator.add ") or text.startswith("operator.add ")
    assert decode_reducer(text)(2, 3) == 5
    assert decode_reducer(encode_reducer(lambda a, b: max(a, b)))(2, 3) == 3
    assert "\n" not in encode_reducer(lambda a, b: a) and " " in encode_reducer(max)


def test_a_header_that_carries_no_function_is_refused():
    with pytest.raises(TypeError, match="not a function"):
        decode_reducer(encode_reducer(operator.add).split(" ")[0] + " " + _b64(b"\x03"))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_with_pickle_off_a_reducer_is_refused_at_the_caller_and_on_the_proc(monkeypatch):
    from monarch.broker.bodies.codec import DecodeError, PicklingForbiddenError
    from monarch.settings import settings

    header = encode_reducer(lambda a, b: a * b)  # made while pickle is on
    monkeypatch.setenv("MONARCH_PICKLE", "0")
    settings.cache_clear()
    decode_reducer.cache_clear()
    try:
        with pytest.raises(PicklingForbiddenError, match="MONARCH_PICKLE=1"):
            encode_reducer(operator.add)
        with pytest.raises(DecodeError):  # a proc with pickle off: an error reply, no call
            decode_reducer(header)
    finally:
        monkeypatch.undo()
        settings.cache_clear()
        decode_reducer.cache_clear()


VALUES = [1, "a", (1, (2, "b")), [3, None], {"k": (1,)}, 2**70, b"raw", 1.5, True]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65_536])  # each msgpack array header size
def test_a_gathered_body_decodes_as_the_list_of_the_bodies_values(n):
    values = (VALUES * (n // len(VALUES) + 1))[:n]
    bodies = [dumps(v, wire="msgpack") for v in values]
    assert all(plain_msgpack(b) for b in bodies)
    assert loads(gathered_body(bodies)) == values


def test_json_bodies_and_frames_of_raw_bytes_are_never_gathered():
    import torch

    assert not plain_msgpack(dumps(5, wire="json"))  # b"5\n"
    assert not plain_msgpack(dumps(torch.zeros(3), wire="msgpack"))  # a frame
    assert not plain_msgpack(dumps(bytearray(b"x"), wire="msgpack"))
    assert not plain_msgpack(b"")
    assert plain_msgpack(dumps(5, wire="msgpack"))  # one byte, a positive fixint
