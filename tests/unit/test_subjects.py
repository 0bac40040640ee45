"""Subjects: names that NATS routes on, and the addressing of mesh members by them.

What they promise: every subject lives under ``mon.<namespace>``; names that would
break a subject are refused; each wildcard subscription matches exactly the
subjects it is for; and an actor's ``point_subscriptions`` together with a view's
``subject_tokens`` deliver each publish to exactly the view's members, once each.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from monarch.actors.meshes.shape import Extent, View
from monarch.broker.vocabulary import subjects

NS = "job1"


def nats_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def test_the_matcher_used_here_follows_nats_rules():
    assert nats_matches("a.*.c", "a.b.c") and not nats_matches("a.*.c", "a.b.b.c")
    assert nats_matches("a.>", "a.b.c") and not nats_matches("a.>", "a")
    assert not nats_matches("a.b", "a.b.c")


# -- tokens ------------------------------------------------------------------------------


@given(st.from_regex(r"\A[A-Za-z0-9_-]+\Z"))
def test_any_name_of_letters_digits_dash_and_underscore_is_a_token(name):
    if name == subjects.WILDCARD:
        with pytest.raises(ValueError):
            subjects.check_token(name, "mesh name")
    else:
        assert subjects.check_token(name, "mesh name") == name


@given(st.text(min_size=0, max_size=12).filter(lambda t: not re.fullmatch(r"[A-Za-z0-9_-]+", t)))
@example("0\n")  # a trailing newline: a regex's "$" matches before it (found by this test)
def test_a_name_that_would_break_a_subject_is_refused_naming_it(name):
    with pytest.raises(ValueError) as info:
        subjects.check_token(name, "mesh name")
    assert repr(name) in str(info.value) and "mesh name" in str(info.value)


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "_", "", "a\nb", "a\n", None, 3])
def test_separators_wildcards_the_lone_underscore_and_non_strings_are_refused(bad):
    with pytest.raises(ValueError, match="cannot be used in a NATS subject"):
        subjects.check_token(bad, "name")  # type: ignore[arg-type]


def test_new_uids_are_tokens_and_differ():
    uids = {subjects.new_uid() for _ in range(100)}
    assert len(uids) == 100
    for uid in uids:
        assert subjects.check_token(uid, "uid") == uid and len(uid) == 8


# -- subjects and their wildcards -------------------------------------------------------------


def test_every_subject_lives_under_the_namespace_root():
    made = [
        subjects.actor(NS, "m", "u1", ["0", "_"]),
        subjects.port(NS, "p1", 3),
        subjects.ctl_proc(NS, "p1"),
        subjects.ctl_host(NS, "h1"),
        subjects.heartbeat(NS, "p1"),
        subjects.supervision(NS, "o1"),
        subjects.log(NS, "p1"),
        subjects.telemetry(NS, "p1"),
        subjects.ps_subject(NS),
        subjects.stats_subject(NS),
        subjects.stacks_subject(NS, "p1"),
    ]
    root = subjects.root(NS)
    assert all(s.startswith(root + ".") for s in made)
    assert len(set(made)) == len(made)
    other = subjects.root("job2")
    assert not any(nats_matches(other + ".>", s) for s in made)


def test_a_procs_port_wildcard_matches_its_ports_only():
    wild = subjects.port_wildcard(NS, "p1")
    assert nats_matches(wild, subjects.port(NS, "p1", 0))
    assert nats_matches(wild, subjects.port(NS, "p1", "flow"))
    assert not nats_matches(wild, subjects.port(NS, "p2", 0))
    assert not nats_matches(wild, subjects.ctl_proc(NS, "p1"))


def test_an_actor_mesh_wildcard_matches_its_members_subjects_only():
    wild = subjects.actor_mesh_wildcard(NS, "m", "u1")
    assert nats_matches(wild, subjects.actor(NS, "m", "u1", ["1", "_"]))
    assert nats_matches(wild, subjects.actor(NS, "m", "u1", ["_"]))
    assert not nats_matches(wild, subjects.actor(NS, "m", "u2", ["1"]))
    assert not nats_matches(wild, subjects.actor(NS, "m2", "u1", ["1"]))


def test_the_telemetry_wildcard_matches_every_procs_telemetry():
    wild = subjects.telemetry_wildcard(NS)
    assert nats_matches(wild, subjects.telemetry(NS, "p1"))
    assert not nats_matches(wild, subjects.log(NS, "p1"))


# -- addressing: publishes reach exactly a view's members, once ------------------------------


def test_an_actor_listens_on_two_to_the_d_subjects():
    subs = subjects.point_subscriptions(NS, "m", "u", [1, 2, 3])
    assert len(subs) == 8 == len(set(subs))
    assert subjects.actor(NS, "m", "u", ["1", "2", "3"]) in subs
    assert subjects.actor(NS, "m", "u", ["_", "_", "_"]) in subs
    assert subjects.point_subscriptions(NS, "m", "u", []) == [subjects.actor(NS, "m", "u", [])]


@st.composite
def views(draw):
    """A random extent and a random chain of slices (and maybe a flatten) of it."""
    ndims = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(1, 4), min_size=ndims, max_size=ndims))
    labels = [f"d{i}" for i in range(ndims)]
    view = View.full(Extent(labels, sizes))
    if draw(st.booleans()):
        view = view.flatten("flat")
    for _ in range(draw(st.integers(0, 2))):
        label = draw(st.sampled_from(view.extent.labels))
        size = view.extent[label]
        if draw(st.booleans()) and len(view.extent) > 1:
            view = view.slice(**{label: draw(st.integers(0, size - 1))})
        else:
            start = draw(st.integers(0, size - 1))
            stop = draw(st.integers(start + 1, size))
            step = draw(st.integers(1, 3))
            view = view.slice(**{label: slice(start, stop, step)})
    return view


@given(views())
def test_a_views_publishes_reach_exactly_its_members_once_each(view):
    base = view.base
    publishes = [subjects.actor(NS, "m", "u", toks) for toks in view.subject_tokens()]
    members = set(view.ranks)
    for rank in range(base.nelements):
        listens = set(subjects.point_subscriptions(NS, "m", "u", base.coords(rank)))
        received = sum(1 for s in publishes if s in listens)
        assert received == (1 if rank in members else 0), (rank, publishes)


@given(views())
def test_a_views_publishes_are_fewest_for_a_whole_mesh(view):
    if len(view) == view.base.nelements:
        assert view.subject_tokens() == [["_"] * len(view.base)]


@pytest.mark.parametrize("text", ["job\n", "a<ff>\n", "name\r\n"])
def test_uids_and_labels_with_a_trailing_newline_are_refused(text):
    from monarch.core.ids import Uid

    with pytest.raises(ValueError):
        Uid.from_string(text)
    with pytest.raises(ValueError):
        Uid.instance(text)


def test_a_stacks_target_with_a_trailing_newline_is_refused():
    from monarch.cli.stacks import BadInput, parse_target

    assert parse_target("trainers[3]") == ("trainers", 3)
    with pytest.raises(BadInput):
        parse_target("trainers\n")
