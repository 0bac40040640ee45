"""FlowControl: a sender's window of unanswered flow markers toward one destination.

Pure tests of what it promises: when a marker is due (every ``batch`` messages or
``max_bytes / window`` bytes), when a sender must wait or hold, that held sends
go out in order as answers come, and that it fails with ``BackpressureError``
instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from monarch.actors.messaging.flow import BackpressureError, FlowControl

BIG = 1 << 62


def make(batch: int = 3, window: int = 2, **kw) -> FlowControl:
    kw.setdefault("timeout", 5.0)
    return FlowControl("m", batch=batch, window=window, **kw)


def markers_due(flow: FlowControl, sizes: list[int]) -> list[int]:
    """The positions (1-based) of the messages after which a marker was due."""
    return [i for i, n in enumerate(sizes, 1) if flow.count(n)]


# -- when a marker is due ---------------------------------------------------------------


def test_a_marker_is_due_after_every_batch_of_messages():
    flow = make(batch=3, window=100)
    assert markers_due(flow, [0] * 10) == [3, 6, 9]
    assert flow.outstanding == 3


def test_a_batch_of_one_makes_every_message_a_marker():
    flow = make(batch=1, window=100)
    assert markers_due(flow, [0] * 4) == [1, 2, 3, 4]


def test_a_marker_is_due_after_the_window_share_of_bytes_even_within_a_batch():
    # 1000 bytes over a window of 4: a marker at least every 250 bytes.
    flow = make(batch=1000, window=4, max_bytes=1000)
    assert markers_due(flow, [100, 100, 100, 100, 100, 100]) == [3, 6]


def test_one_message_bigger_than_the_share_is_followed_by_a_marker_at_once():
    flow = make(batch=1000, window=4, max_bytes=1000)
    assert markers_due(flow, [10_000, 1, 1]) == [1]


def test_the_byte_count_restarts_after_a_marker_due_to_the_batch():
    flow = make(batch=2, window=1, max_bytes=100)
    # message 2 closes a batch (90 bytes so far); message 3 alone is under 100.
    assert markers_due(flow, [45, 45, 60]) == [2]


def test_a_window_bigger_than_the_byte_bound_still_sends_a_marker_per_byte():
    flow = make(batch=1000, window=16, max_bytes=4)  # share rounds up to 1 byte
    assert markers_due(flow, [1, 1, 0]) == [1, 2]


# -- the window -------------------------------------------------------------------------


def test_a_sender_must_hold_exactly_when_the_window_is_full():
    flow = make(batch=1, window=2)
    assert not flow.must_hold()
    flow.count()
    assert not flow.must_hold()
    flow.count()
    assert flow.must_hold()
    flow.acknowledged()
    assert not flow.must_hold()
    assert flow.outstanding == 1


def test_sharing_keeps_to_a_share_of_the_full_window_and_never_less_than_one():
    flow = make(window=16)
    flow.shared_by(4)
    assert flow.window == 4
    flow.shared_by(100)
    assert flow.window == 1
    flow.shared_by(0)  # a nonsensical count is one sender
    assert flow.window == 16
    flow.shared_by(1)
    assert flow.window == 16


def test_a_mesh_answer_keeps_to_the_share_of_its_busiest_actor_and_counts_one_answer():
    flow = make(batch=1, window=12)
    flow.count()
    answer = SimpleNamespace(get=lambda timeout: {0: 2, 1: 6, 2: "not a count"})
    flow.mesh_answered(answer)
    assert flow.window == 2
    assert flow.outstanding == 0


def test_a_failed_mesh_answer_still_counts_as_answered_and_keeps_the_share():
    flow = make(batch=1, window=12)
    flow.shared_by(3)
    flow.count()

    def gone(timeout):
        raise RuntimeError("an actor is gone")

    flow.mesh_answered(SimpleNamespace(get=gone))
    assert flow.outstanding == 0
    assert flow.window == 4


# -- a thread that waits for room ---------------------------------------------------------


def test_waiting_returns_at_once_with_room_or_when_told_not_to_block():
    flow = make(batch=1, window=1, timeout=0.01)
    flow.wait_for_room(can_block=True)
    flow.count()
    flow.wait_for_room(can_block=False)  # the loop never blocks, even with the window full
    assert flow.waits == 0


def test_a_waiting_thread_goes_on_when_an_answer_comes():
    flow = make(batch=1, window=1, timeout=30)
    flow.count()
    done = threading.Event()

    def sender():
        flow.wait_for_room(can_block=True)
        done.set()

    t = threading.Thread(target=sender)
    t.start()
    assert not done.wait(0.05)  # still held back
    flow.acknowledged()
    t.join(10)
    assert done.is_set()
    assert flow.waits == 1


def test_a_thread_that_waits_past_the_timeout_gets_backpressure_error_naming_the_mesh():
    flow = make(batch=1, window=1, timeout=0.01)
    flow.count()
    with pytest.raises(BackpressureError, match="'m' has not kept up"):
        flow.wait_for_room(can_block=True)


# -- sends held on the event loop ---------------------------------------------------------


def test_held_sends_go_out_in_order_as_room_comes_and_no_further():
    flow = make(batch=1, window=1)
    sent: list[int] = []

    def sender(i: int):
        def send():
            sent.append(i)
            flow.count()  # a released send counts (and here is followed by a marker)

        return send

    flow.count()
    for i in range(3):
        assert flow.must_hold()
        flow.hold(10, sender(i))
    assert sent == [] and flow.held_bytes == 30 and flow.holds == 3
    flow.acknowledged()  # no loop given: the owner calls release
    flow.release()
    assert sent == [0]  # the released one filled the window again
    flow.acknowledged()
    flow.release()
    flow.acknowledged()
    flow.release()
    assert sent == [0, 1, 2]
    assert flow.held_bytes == 0 and not flow.held


def test_sends_queue_behind_held_ones_even_with_room():
    flow = make(batch=1, window=2)
    flow.count()
    flow.count()
    flow.hold(1, lambda: None)
    flow.acknowledged()
    assert flow.outstanding < flow.window
    assert flow.must_hold()  # order: a new send may not overtake the held one


def test_a_send_that_fails_on_release_does_not_stop_the_ones_behind_it():
    flow = make(batch=1, window=1)
    sent: list[str] = []

    def broken():
        raise OSError("connection closed")

    flow.count()
    flow.hold(1, broken)
    flow.hold(1, lambda: sent.append("next"))
    flow.acknowledged()
    flow.release()
    assert sent == ["next"]
    assert not flow.held


def test_holding_past_the_byte_bound_raises_and_keeps_the_held_ones():
    flow = make(batch=1, window=1, hold_bytes=100)
    flow.count()
    flow.hold(60, lambda: None)
    with pytest.raises(BackpressureError, match="MONARCH_FLOW_HOLD_BYTES"):
        flow.hold(50, lambda: None)
    assert len(flow.held) == 1 and flow.held_bytes == 60


def test_the_first_held_message_may_exceed_the_byte_bound_alone():
    flow = make(batch=1, window=1, hold_bytes=10)
    flow.count()
    flow.hold(1000, lambda: None)  # else a big message could never be sent from the loop
    assert flow.held_bytes == 1000


def test_holding_after_a_timeout_without_progress_raises(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    flow = make(batch=1, window=1, timeout=10)
    flow.count()
    flow.hold(1, lambda: None)
    now[0] += 5
    flow.hold(1, lambda: None)  # within the timeout
    now[0] += 6
    with pytest.raises(BackpressureError, match="MONARCH_FLOW_TIMEOUT"):
        flow.hold(1, lambda: None)
    assert len(flow.held) == 2


def test_an_answer_while_holding_counts_as_progress(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    flow = make(batch=1, window=1, timeout=10)
    flow.count()
    flow.count()  # two markers out, window of one
    flow.hold(1, lambda: None)
    now[0] += 9
    flow.acknowledged()  # still one out: the held one stays, but the mesh moved
    now[0] += 9
    flow.hold(1, lambda: None)
    assert len(flow.held) == 2


def test_with_a_loop_an_answer_releases_held_sends_on_that_loop():
    loop = asyncio.new_event_loop()
    try:
        flow = make(batch=1, window=1, loop=loop)
        threads: list[int] = []
        flow.count()
        flow.hold(1, lambda: threads.append(threading.get_ident()))
        t = threading.Thread(target=flow.acknowledged)  # answers may come from any thread
        t.start()
        t.join(10)
        assert threads == []  # released on a later loop turn, not inside acknowledged
        loop.run_until_complete(asyncio.sleep(0))
        assert threads == [threading.get_ident()]
    finally:
        loop.close()


def test_a_hold_with_room_already_back_is_released_on_the_next_loop_turn():
    loop = asyncio.new_event_loop()
    try:
        flow = make(batch=1, window=1, loop=loop)
        sent: list[int] = []
        flow.count()
        flow.acknowledged()  # the answer came between must_hold() and hold()
        flow.hold(1, lambda: sent.append(1))
        loop.run_until_complete(asyncio.sleep(0))
        assert sent == [1]
    finally:
        loop.close()
