"""MONARCH_WIRE=json: readable bodies that carry everything msgpack bodies do, and mix with them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from monarch.actors.calls.ports import Port
from monarch.broker.bodies.codec import DecodeError, PicklingForbiddenError, dumps, loads
from tests.helpers import captured_traffic
from tests.hosts.agents import ROOT


class Custom:  # pickled: not a type the codec knows
    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and other.x == self.x


VALUES = [
    None, True, 0, -1, 127, 2**70, -(2**70), 1.5, float("inf"), "héllo", b"\x00\xff", bytearray(b"ab"),
    [1, [2, (3, 4)]], (), (1, (2, b"x")), {"a": 1, "b": [1.0, None]}, {1: "int key", (1, 2): "tuple"},
    {"$tuple": [1, 2], "$": 0}, [{"$bytes": "not bytes"}], {5, 6}, Custom(3),
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_json_bodies_round_trip(value):
    body = dumps(value, wire="json")
    assert body.endswith(b"\n")
    json.loads(body)  # it is JSON
    back = loads(body)
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(),  # not contiguous
        torch.tensor([True, False]),
        torch.tensor([1 + 2j]),
        torch.empty(0, 3),
    ],
    ids=lambda t: str(t.dtype),
)
def test_tensors_travel_bit_exact(tensor):
    back = loads(dumps({"t": tensor}, wire="json"))["t"]
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


def test_arrays_and_registered_types():
    a = np.arange(10, dtype=np.int16).reshape(2, 5)[:, ::2]
    back = loads(dumps([a, Port("mon.default.port.p.3", 2)], wire="json"))
    assert back[0].dtype == a.dtype and np.array_equal(back[0], a)
    assert isinstance(back[1], Port) and (back[1].subject, back[1].rank) == (
        "mon.default.port.p.3",
        2,
    )


def test_either_wire_decodes_whatever_this_process_sends():
    for value in (5, 127, (1, "x"), {"k": b"v"}):
        assert loads(dumps(value, wire="msgpack")) == value
        assert loads(dumps(value, wire="json")) == value
    assert dumps(5, wire="msgpack") == b"\x05"  # one byte: never mistaken for JSON
    assert dumps(5, wire="json") == b"5\n"


def test_pickle_rules_hold_in_json_mode():
    with pytest.raises(PicklingForbiddenError):
        dumps(Custom(1), wire="json", allow_pickle=False)
    with pytest.raises(DecodeError, match="forbids pickle"):
        loads(dumps(Custom(1), wire="json"), allow_pickle=False)


@pytest.mark.parametrize(
    "body", [b'{"$tuple": [1]', b'{"$nope": 1}\n', b'{"$ext": 3, "value": 1}\n']
)
def test_malformed_json_bodies_raise_decode_error(body):
    with pytest.raises(DecodeError):
        loads(body)


def run_json_job(nats_url: str, tmp_path, source: str) -> tuple[str, list]:
    """Run ``source`` as a client script with ``MONARCH_WIRE=json`` (its procs inherit it);
    its stdout, and every message on the broker meanwhile."""
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MONARCH_WIRE="json")
    with captured_traffic(nats_url) as captured:
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
        )
    assert out.returncode == 0, out.stderr
    return out.stdout, captured


def test_a_job_in_json_mode_sends_readable_bodies(nats_url, tmp_path):
    """Client and procs both speak JSON: every actor message on the wire parses as JSON."""
    stdout, captured = run_json_job(
        nats_url,
        tmp_path,
        """
        import numpy as np
        from monarch.actor import Actor, endpoint, this_host

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return (x, np.ones(2))

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        e = procs.spawn("jsonecho", Echo)
        print(list(e.echo.call((1, b"b")).get(timeout=60).values()), flush=True)
        procs.stop().get(timeout=60)
        """,
    )
    assert "((1, b'b'), array([1., 1.]))" in stdout
    calls = [c for c in captured if ".act.jsonecho." in c[0]]
    replies = [
        c
        for c in captured
        if c[1].get("Mon-Kind") == "reply" and "jsonecho" in c[1].get("Mon-From", "")
    ]
    assert calls and len(replies) == 2
    for _, _, data in calls + replies:
        json.loads(data)
    assert '"$ndarray"' in replies[0][2].decode()


def test_a_per_proc_groups_replies_in_json_mode_stay_readable_one_by_one(nats_url, tmp_path):
    """A proc gathers its per_proc group's replies into one msgpack list only when
    every body is msgpack; in JSON mode each reply stays its own readable JSON body
    (no Mon-Ranks), and the call's values are the same."""
    stdout, captured = run_json_job(
        nats_url,
        tmp_path,
        """
        from monarch.actor import Actor, current_rank, endpoint, this_host

        class Echo(Actor):
            @endpoint
            async def echo(self, x):
                return (x, current_rank().rank)

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        e = procs.per_proc(workers=2).spawn("jsongroup", Echo)
        print(list(e.echo.call("a").get(timeout=60).values()), flush=True)
        procs.stop().get(timeout=60)
        """,
    )
    assert "[('a', 0), ('a', 1), ('a', 2), ('a', 3)]" in stdout
    replies = [
        c
        for c in captured
        if c[1].get("Mon-Kind") == "reply" and "jsongroup" in c[1].get("Mon-From", "")
    ]
    assert len(replies) == 4 and not [h for _, h, _ in replies if "Mon-Ranks" in h]
    assert sorted(json.loads(data)["$tuple"][1] for _, _, data in replies) == [0, 1, 2, 3]
