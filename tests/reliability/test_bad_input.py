"""Garbage on actor, port and control subjects: every proc keeps serving.

A property-based test (hypothesis) publishes malformed bodies, wrong or
missing headers, unknown endpoints and truncated msgpack straight onto the
subjects of a live actor mesh, with and without a reply subject. Senders that
wait for a reply get an error reply; nobody crashes; the mesh still answers
real calls afterwards.
"""

from __future__ import annotations

import asyncio

import msgpack
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import this_host
from monarch.broker.bodies.codec import dumps
from monarch.broker.vocabulary import subjects
from tests.actors.actors_for_tests import Echo

GOOD = dumps(((1,), {}, None))

bodies = st.one_of(
    st.binary(max_size=64),
    st.just(GOOD[: len(GOOD) // 2]),  # truncated msgpack
    st.just(msgpack.packb([1, 2, 3])),  # wrong shape
    st.just(msgpack.packb(msgpack.ExtType(99, b"x"))),  # unknown extension
    st.just(b""),
    st.just(msgpack.packb([[{"Mon-Kind": "send", "Mon-Endpoint": "ping"}, GOOD]] * 2)),
    st.just(msgpack.packb([[{"Mon-Kind": "send"}, b"\xc1"], [1, 2, 3]])),  # batch of junk
)
headers = st.one_of(
    st.none(),
    st.fixed_dictionaries({}),
    st.fixed_dictionaries({"Mon-Kind": st.sampled_from(["call", "send", "reply", "bogus"])}),
    st.fixed_dictionaries(
        {
            "Mon-Kind": st.just("call"),
            "Mon-Endpoint": st.sampled_from(["ping", "nope", "_x", "", "helper"]),
        }
    ),
    st.fixed_dictionaries({"Mon-Endpoint": st.just("ping"), "Mon-Adhoc": st.just("1")}),
    st.fixed_dictionaries(
        {"Mon-Kind": st.just("batch"), "Mon-Count": st.sampled_from(["1", "2", "x"])}
    ),
)


@pytest.fixture(scope="module")
def target(nats_url):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("fuzzed", Echo)
    mesh.ping.call(0).get(timeout=30)
    yield mesh
    pm.stop().get(timeout=60)


class Injector:
    """A raw nats-py client that throws messages and collects any replies."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.nc = self.loop.run_until_complete(nats.connect(url))
        self.tried = 0
        self.answered = 0

    def throw(self, subject: str, body: bytes, hdrs: dict | None, want_reply: bool) -> None:
        self.tried += 1

        async def go():
            if not want_reply:
                await self.nc.publish(subject, body, headers=hdrs)
                return
            try:
                reply = await self.nc.request(subject, body, timeout=10, headers=hdrs)
            except nats.errors.NoRespondersError:
                return
            assert (reply.headers or {}).get("Mon-Kind") in ("error", "reply", "ok")
            self.answered += 1

        self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()


def test_malformed_messages_never_break_a_proc(target, nats_url):
    st_ = target._state
    actor_subject = subjects.actor("default", st_.name, st_.uid, ["_"])
    point_subject = subjects.actor("default", st_.name, st_.uid, ["1"])
    ctl_subjects = [subjects.ctl_proc("default", uid) for uid in st_.proc_uids]
    inj = Injector(nats_url)
    try:

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            subject=st.sampled_from([actor_subject, point_subject, *ctl_subjects]),
            body=bodies,
            hdrs=headers,
            want_reply=st.booleans(),
        )
        def throw(subject, body, hdrs, want_reply):
            inj.throw(subject, body, hdrs, want_reply)

        throw()
        # Garbage to ports nobody owns, and to the client's own ports, is dropped.
        inj.throw(subjects.port("default", "nobody", 1), b"\xc1", {"Mon-Kind": "reply"}, False)
        print(f"malformed messages tried: {inj.tried}, error replies received: {inj.answered}")
        assert inj.tried >= 150
        assert inj.answered > 0
    finally:
        inj.close()
    # Every actor still serves, in order, after all that.
    assert list(target.ping.call(7).get(timeout=30).values()) == [7, 7]
    assert [v["rank"] for v in target.whoami.call().get(timeout=30).values()] == [0, 1]
