"""Lost sends: SendCounter numbers a sender's messages per subject; SequenceCheck finds holes.

Properties: in-order delivery reports nothing; each hole is reported once, with
its size, at the next numbered message from that sender on that subject; a count
so far (``Mon-Sent``, on gathered calls and sync markers) reveals the sends lost
before it; duplicates and late arrivals are not losses; senders and subjects are
independent; malformed numbers are ignored, never a crash.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from monarch.actors.messaging.lost_sends import SendCounter, SequenceCheck
from monarch.broker.vocabulary.headers import SENT, SEQ

SUBJECT = "mon.ns.act.m.u.0"


def msg(headers: dict | None, subject: str = SUBJECT) -> SimpleNamespace:
    return SimpleNamespace(headers=headers, subject=subject)


def counter(uid: str = "p1") -> SendCounter:
    return SendCounter(SimpleNamespace(proc_uid=uid))


def sent(c: SendCounter, subject: str = SUBJECT) -> dict:
    """The headers of a send (numbered) that ``c`` makes to ``subject``."""
    h: dict = {}
    c.stamp(subject, h)
    return h


def gathered(c: SendCounter, subject: str = SUBJECT) -> dict:
    """The headers of a gathered call (carries the count so far) to ``subject``."""
    h: dict = {}
    c.stamp_count(subject, h)
    return h


# -- SendCounter --------------------------------------------------------------------


def test_sends_are_numbered_from_one_per_subject_with_the_senders_uid():
    c = counter("abc")
    assert [sent(c, "a")[SEQ] for _ in range(3)] == ["1@abc", "2@abc", "3@abc"]
    assert sent(c, "b")[SEQ] == "1@abc"


def test_a_gathered_call_carries_the_count_so_far_and_is_not_counted():
    c = counter("abc")
    assert gathered(c) == {}  # nothing sent yet: nothing to reveal
    sent(c)
    sent(c)
    assert gathered(c) == {SENT: "2@abc"}
    assert gathered(c) == {SENT: "2@abc"}
    assert sent(c)[SEQ] == "3@abc"


# -- SequenceCheck: examples --------------------------------------------------------


def test_messages_in_order_show_no_loss():
    c, check = counter(), SequenceCheck()
    assert [check.check(msg(sent(c))) for _ in range(5)] == [None] * 5


def test_a_hole_is_reported_once_with_its_size_at_the_next_message():
    c, check = counter("s"), SequenceCheck()
    assert check.check(msg(sent(c))) is None
    sent(c)
    sent(c)  # two lost
    assert check.check(msg(sent(c))) == ("s", 2)
    assert check.check(msg(sent(c))) is None


def test_losing_the_first_messages_is_a_hole_too():
    c, check = counter("s"), SequenceCheck()
    sent(c)
    assert check.check(msg(sent(c))) == ("s", 1)


def test_a_count_so_far_reveals_sends_lost_before_it_and_only_once():
    c, check = counter("s"), SequenceCheck()
    check.check(msg(sent(c)))
    sent(c)
    sent(c)  # lost, and no send follows: a gathered call (or sync marker) shows it
    assert check.check(msg(gathered(c))) == ("s", 2)
    assert check.check(msg(gathered(c))) is None
    assert check.check(msg(sent(c))) is None  # number 4 follows the count of 3


def test_a_count_so_far_with_nothing_lost_reports_nothing():
    c, check = counter("s"), SequenceCheck()
    for _ in range(3):
        check.check(msg(sent(c)))
    assert check.check(msg(gathered(c))) is None


def test_a_duplicate_or_late_message_is_not_a_loss_and_does_not_move_back_the_count():
    c, check = counter("s"), SequenceCheck()
    one, two, three = sent(c), sent(c), sent(c)
    assert check.check(msg(one)) is None
    assert check.check(msg(three)) == ("s", 1)  # two looks lost
    assert check.check(msg(two)) is None  # it was only late
    assert check.check(msg(three)) is None  # a duplicate
    assert check.check(msg(sent(c))) is None  # four follows three


def test_senders_and_subjects_are_counted_apart():
    a, b, check = counter("a"), counter("b"), SequenceCheck()
    assert check.check(msg(sent(a, "x"), "x")) is None
    assert check.check(msg(sent(b, "x"), "x")) is None
    assert check.check(msg(sent(a, "y"), "y")) is None
    sent(a, "x")  # lost
    assert check.check(msg(sent(b, "x"), "x")) is None
    assert check.check(msg(sent(a, "y"), "y")) is None
    assert check.check(msg(sent(a, "x"), "x")) == ("a", 1)


def test_unnumbered_and_malformed_messages_are_ignored():
    check = SequenceCheck()
    for headers in (None, {}, {"Mon-Kind": "send"}, {SEQ: "x@s"}, {SEQ: ""}, {SENT: "@s"}):
        assert check.check(msg(headers)) is None
    assert check.check(msg({SEQ: "1@s"})) is None  # the malformed ones counted nothing


def test_a_sender_uid_with_at_signs_keeps_its_own_count():
    check = SequenceCheck()
    assert check.check(msg({SEQ: "1@a@b"})) is None
    assert check.check(msg({SEQ: "3@a@b"})) == ("a@b", 1)


def test_very_large_numbers_do_not_wrap_around():
    check = SequenceCheck()
    big = 2**64
    assert check.check(msg({SEQ: f"{big}@s"})) == ("s", big - 1)
    assert check.check(msg({SEQ: f"{big + 1}@s"})) is None
    assert check.check(msg({SEQ: f"{big + 3}@s"})) == ("s", 1)


# -- SequenceCheck: properties --------------------------------------------------------


@st.composite
def deliveries(draw):
    """n sends, each kept or lost; the kept ones in order, and whether a sync follows."""
    n = draw(st.integers(min_value=0, max_value=60))
    kept = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return kept, draw(st.booleans())


@given(deliveries())
def test_every_lost_send_is_reported_exactly_once_by_the_next_numbered_message(case):
    kept, sync = case
    c, check = counter("s"), SequenceCheck()
    reported = 0
    for keep in kept:
        headers = sent(c)
        if keep:
            found = check.check(msg(headers))
            if found is not None:
                assert found[0] == "s" and found[1] > 0
                reported += found[1]
    last_kept = max((i + 1 for i, k in enumerate(kept) if k), default=0)
    assert reported == last_kept - sum(kept)  # losses before the last kept one
    if sync and kept:
        found = check.check(msg(gathered(c)))  # a sync marker carries the count so far
        reported += found[1] if found else 0
        assert reported == len(kept) - sum(kept)  # every loss, once


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=80))
def test_any_arrival_order_reports_the_numbers_skipped_by_each_new_highest(numbers):
    """Duplicates and late arrivals report nothing; a number above all before it reports
    the numbers it skipped, even ones that arrive later (those are logged false alarms)."""
    check = SequenceCheck()
    reported = 0
    for n in numbers:
        found = check.check(msg({SEQ: f"{n}@s"}))
        if found is not None:
            assert found[1] > 0
            reported += found[1]
    highest, raised = 0, 0
    for n in numbers:
        if n > highest:
            highest, raised = n, raised + 1
    assert reported == highest - raised
