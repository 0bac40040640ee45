"""Busy polling for one-to-one calls: which messages ask for it, and how it stops."""

from __future__ import annotations

import asyncio

import pytest

from monarch.actor import this_host
from monarch.core.busy_poll import WAIT_HEADER, BusyPoll
from monarch.core.runtime import LocalMsg
from monarch.settings import Settings
from tests.actors.actors_for_tests import Echo
from tests.helpers import captured_traffic


def run_loop_for(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_poll_keeps_the_loop_turning_for_its_window_then_sleeps(loop):
    poll = BusyPoll(loop, window_us=10_000_000)
    poll._cores = 1_000  # never crowded here: this test is about the window
    poll.poke()
    run_loop_for(loop, 0.05)
    assert poll.running and poll.turns > 10  # still inside its 10 s window
    poll.until = 0.0  # the window has passed
    run_loop_for(loop, 0.05)
    assert not poll.running  # the loop sleeps in epoll again
    after = poll.turns
    run_loop_for(loop, 0.02)
    assert poll.turns == after
    short = BusyPoll(loop, window_us=20_000)
    short._cores = 1_000
    short.poke()
    run_loop_for(loop, 0.5)
    assert not short.running and short.turns > 0  # a 20 ms window ends by itself
    poll.close()
    short.close()


def test_only_messages_of_one_to_one_calls_start_polling(loop):
    poll = BusyPoll(loop, window_us=50_000)
    poll.on_message(LocalMsg("s", b"", "", {"Mon-Kind": "call"}))
    poll.on_message(LocalMsg("s", b"", "", None))
    assert not poll.running
    poll.on_message(LocalMsg("s", b"", "", {WAIT_HEADER: "one"}))
    assert poll.running
    poll.close()
    run_loop_for(loop, 0.01)
    assert not poll.running


def test_zero_window_never_polls_and_a_crowded_machine_stops_it(loop):
    off = BusyPoll(loop, window_us=0)
    off.poke()
    assert not off.running
    crowded = BusyPoll(loop, window_us=1_000_000)
    crowded._cores = 0  # any runnable thread (this one) is now a crowd
    crowded.poke()
    run_loop_for(loop, 0.01)
    assert not crowded.running and crowded.turns == 0  # gave up at once, not after 1 s
    crowded.close()


def test_setting_is_validated():
    assert Settings().busy_poll_us == 0  # off unless asked for (NOTES 26)
    assert Settings(busy_poll_us=1000).busy_poll_us == 1000
    with pytest.raises(ValueError):
        Settings(busy_poll_us=-1)


def test_call_one_and_its_reply_carry_the_wait_header_a_mesh_call_does_not(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with captured_traffic(nats_url) as captured:
            mesh = procs.spawn("waitecho", Echo)
            assert mesh.ping.call(1).get(timeout=30).item(gpus=1) == 1
            assert mesh.slice(gpus=1).ping.call_one(2).get(timeout=30) == 2
    finally:
        procs.stop().get(timeout=30)
    calls = [h for s, h, _ in captured if ".act.waitecho." in s and h.get("Mon-Endpoint") == "ping"]
    replies = [h for s, h, _ in captured if ".port." in s and h.get("Mon-Kind") == "reply"]
    # The mesh call is one message to the whole mesh; call_one one to a single actor.
    assert [h.get(WAIT_HEADER) for h in calls] == [None, "one"]
    assert sorted(str(h.get(WAIT_HEADER)) for h in replies) == ["None", "None", "one"]
