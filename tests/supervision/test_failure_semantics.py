"""Failures answer as in Monarch 0.7: what fails, what the caller sees, what the hook gets.

Checked against the real Monarch (torchmonarch 0.7.0) with small scripts:
a ``BaseException`` from an endpoint fails the actor and its caller gets
``SupervisionError`` ("The actor ... and all its descendants have failed");
the root's ``unhandled_fault_hook`` runs once per failed rank; an ``__init__``
exception on a 2-rank mesh reaches the hook twice, with no call made.
"""

from __future__ import annotations

import re

import pytest

from monarch.actor import ActorError, MeshFailure, SpawnError, SupervisionError, this_host
from tests.helpers import proc_mesh_fixture, wait_until
from tests.supervision.failure_actors import (
    AsyncFatal,
    AwaitsWhileItsChildFails,
    CleanupExits,
    HandlesInitFailure,
    InitFails,
    Leaf,
    Relay,
    SuperviseExits,
    SyncFatal,
    slow_failing_bootstrap,
)
from tests.supervision.sup_actors import Owner

FAILED = "The actor .* and all its descendants have failed"


procs = proc_mesh_fixture({"gpus": 2})


@pytest.mark.parametrize("cls", [SyncFatal, AsyncFatal], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "Fatal"])
def test_base_exception_in_endpoint_fails_the_actor_and_its_caller_gets_supervision_error(
    procs, root_faults, cls, kind
):
    mesh = procs.spawn("fatal", cls)
    target = mesh.slice(gpus=1)
    with pytest.raises(SupervisionError, match=FAILED) as info:
        target.fatal.call_one(kind).get(timeout=30)
    text = str(info.value)
    assert f"{cls.__name__} fatal" in text  # the class and mesh name, as Monarch prints them
    assert f"{kind}: {kind} raised on purpose" in text
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "fatal" and failure.ranks == [1]
    assert failure.reason == "actor_failed" and kind in str(failure)
    report = failure.report()  # what the default hook prints, in Monarch's words
    assert report.startswith(
        f"The actor <root>.<tests.supervision.failure_actors.{cls.__name__} fatal{{'gpus': 1/2}}> "
        "and all its descendants have failed:"
    )
    assert f"{kind} raised on purpose" in report
    # The actor stays failed; the other rank lives on.
    with pytest.raises(SupervisionError, match=FAILED):
        target.check.call_one().get(timeout=30)
    with pytest.raises(SupervisionError, match=f"{FAILED}(?s:.*){kind}"):
        mesh.check.call().get(timeout=30)
    assert mesh.slice(gpus=0).check.call_one().get(timeout=30) == "healthy"
    assert len(root_faults.failures) == 1


def test_base_exception_in_a_broadcast_reaches_the_hook_once_per_rank(procs, root_faults):
    mesh = procs.spawn("fatal_bcast", SyncFatal)
    mesh.fatal.broadcast("Fatal")
    failures = root_faults.wait(2)
    assert sorted(f.ranks for f in failures) == [[0], [1]]
    assert all(f.mesh_name == "fatal_bcast" and "Fatal" in str(f) for f in failures)
    with pytest.raises(SupervisionError, match=FAILED):
        mesh.check.call().get(timeout=30)


def test_process_exit_in_flight_names_the_actor_and_the_exit_code(procs, root_faults):
    mesh = procs.spawn("exiting", SyncFatal)
    target = mesh.slice(gpus=1)
    with pytest.raises(SupervisionError, match=rf"{FAILED}(?s:.*)exited with code 7") as info:
        target.exit_process.call_one().get(timeout=30)
    assert "SyncFatal exiting" in str(info.value)
    # Monarch's words: the call, then the process status as its ProcStatus prints it
    assert str(info.value).startswith("Endpoint call exiting.exit_process() failed, The actor")
    assert "the process this actor was running on failed: Stopped(exit=7)" in str(info.value)
    (failure,) = root_faults.wait(1)
    assert failure.reason == "proc_died" and failure.ranks == [1]
    for later, endpoint in ((target.check.call_one(), "check"), (mesh.check.call(), "check")):
        with pytest.raises(SupervisionError, match=rf"{FAILED}(?s:.*)exited with code 7") as info:
            later.get(timeout=30)
        assert str(info.value).startswith(f"Endpoint call exiting.{endpoint}() failed, ")
    assert mesh.slice(gpus=0).check.call_one().get(timeout=30) == "healthy"


def test_init_exception_on_two_ranks_reaches_the_hook_once_per_rank_without_a_call(
    procs, root_faults
):
    procs.spawn("init_fails", InitFails)  # nobody calls it: the hook alone hears of it
    failures = root_faults.wait(2)
    assert sorted(f.ranks for f in failures) == [[0], [1]]
    for f in failures:
        assert isinstance(f, MeshFailure) and f.reason == "init_failed"
        assert "init_fails" in str(f) and "an exception from __init__" in str(f)
        assert re.search(rf"The actor .*InitFails init_fails\{{'gpus': {f.ranks[0]}/2\}}", str(f))


def test_slices_inherit_the_failures_of_their_parent_mesh(nats_url, root_faults):
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        mesh = pm.spawn("sliced", AsyncFatal)
        upper = mesh.slice(gpus=slice(1, 3))
        with pytest.raises(SupervisionError, match=FAILED):
            upper.fatal.call("Fatal", 2).get(timeout=30)  # fails base rank 2 only
        (failure,) = root_faults.wait(1)
        assert failure.ranks == [2]
        # A slice made afterwards, of a slice, over the failed rank: raises as the whole mesh does.
        for failed in (upper.slice(gpus=1), mesh.slice(gpus=2), upper, mesh):
            with pytest.raises(SupervisionError, match=FAILED):
                failed.check.call().get(timeout=30)
        healthy = mesh.slice(gpus=slice(0, 2)).check.call().get(timeout=30)
        assert list(healthy.values()) == ["healthy", "healthy"]
    finally:
        pm.stop().get(timeout=60)


def test_actor_error_reraised_by_a_nested_call_reaches_the_caller_whole(procs, root_faults):
    leaf = procs.spawn("leaf", Leaf)
    relay = procs.spawn("relay", Relay, leaf).slice(gpus=0)
    with pytest.raises(ActorError) as info:
        relay.relay.call_one("inner failure").get(timeout=60)
    outer = info.value
    assert outer.endpoint == "relay" and outer.actor_id.startswith("relay.")
    inner = outer.exception
    assert isinstance(inner, ActorError)  # as in Monarch: the nested call's ActorError, whole
    assert inner.endpoint == "boom" and inner.actor_id.startswith("leaf.")
    assert isinstance(inner.exception, ValueError) and str(inner.exception) == "inner failure"
    assert "raise ValueError(message)" in inner.traceback
    assert "inner failure" in str(outer)
    # Monarch's words: "Actor call <actor name>.<endpoint> failed." and its traceback header
    assert str(inner).startswith(
        "Actor call leaf.boom failed.\n Traceback of where the remote call failed "
        "(most recent call last):\n"
    )
    assert str(inner).endswith("ValueError: inner failure")
    assert str(outer).startswith("Actor call relay.relay failed.\n")
    assert relay.check.call_one().get(timeout=30) == "healthy"  # nobody failed
    assert root_faults.failures == []


def test_unhandled_nested_failure_reports_the_nested_actor_in_monarchs_words(
    procs, root_faults, tmp_path
):
    top = procs.spawn("top3", Owner, "top3", False, str(tmp_path / "log")).slice(gpus=0)
    top.break_leaf.call_one().get(timeout=60)  # its child mesh fails; nobody handles it
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "top3" and failure.reason == "owner_failed"
    report = failure.report()
    assert re.search(r"The actor .*sup_actors\.Owner top3\{'gpus': 0/2\}.* and all its", report)
    nested = r"The actor .*sup_actors\.Worker top3_leaf\{'gpus': \d/1\}.* and all its descendants"
    assert re.search(nested + r"(?s:.*)leaf failed", report)


def test_system_exit_from_cleanup_fails_only_that_actor(procs, root_faults):
    neighbour = procs.spawn("neighbour", SyncFatal)
    mesh = procs.spawn("cleanup_exits", CleanupExits)
    mesh.slice(gpus=0).fatal.broadcast("Fatal")
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "cleanup_exits" and failure.reason == "actor_failed"
    # The proc lives on: its other actors answer, and no proc death is reported.
    assert neighbour.slice(gpus=0).check.call_one().get(timeout=30) == "healthy"
    assert [f.reason for f in root_faults.failures] == ["actor_failed"]


def test_system_exit_from_supervise_fails_the_owner_and_reaches_the_root(procs, root_faults):
    owner = procs.spawn("sup_exits", SuperviseExits).slice(gpus=0)
    owner.break_child.call_one().get(timeout=60)
    (failure,) = root_faults.wait(1)
    assert failure.mesh_name == "sup_exits" and failure.reason == "owner_failed"
    assert "__supervise__ raised SystemExit: supervise exits" in failure.report()
    with pytest.raises(SupervisionError, match=FAILED):
        owner.break_child.call_one().get(timeout=30)


def test_owner_is_offered_an_init_failure_once_per_rank(procs, root_faults):
    owner = procs.spawn("init_owner", HandlesInitFailure).slice(gpus=0)
    assert wait_until(lambda: len(owner.offered.call_one().get(timeout=30)) >= 2, timeout=30)
    offered = owner.offered.call_one().get(timeout=30)
    assert sorted(ranks for _, ranks, _, _ in offered) == [[0], [1]]
    for mesh_name, _, reason, text in offered:
        assert mesh_name == "kid" and reason == "init_failed"
        assert re.search(r"The actor .*InitFails kid\{'gpus': \d/2\}", text)
        assert "an exception from __init__" in text
    assert root_faults.failures == []  # handled: nothing reaches the root


def test_an_async_owner_that_leaves_a_child_failure_unhandled_fails_its_callers_at_once(
    procs, root_faults
):
    # As in Monarch: __supervise__ runs beside the awaiting endpoint, the owner
    # fails, and the call waiting on it raises now (not when the 300 s sleep ends).
    owner = procs.spawn("impatient", AwaitsWhileItsChildFails).slice(gpus=0)
    with pytest.raises(SupervisionError, match=f"{FAILED}(?s:.*)doomed_child"):
        owner.fail_child_then_wait.call_one().get(timeout=60)
    failures = root_faults.wait(1)
    assert any(f.mesh_name == "impatient" for f in failures)


def test_a_mesh_on_procs_that_never_started_raises_at_its_calls_and_the_hook_hears_nothing(
    nats_url, root_faults
):
    # As in Monarch 0.7 (checked with a script: procs with a missing program, an actor
    # spawned and called on them): no actor was made, so none failed; the call raises
    # why the procs did not start and the client runs on. The actor mesh is asked for
    # before the start fails (its bootstrap takes a second) and another one after.
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=slow_failing_bootstrap)
    try:
        early = pm.spawn("early", Leaf)
        with pytest.raises(SpawnError, match="no scratch disk on this proc"):
            early.boom.call("x").get(timeout=60)
        with pytest.raises(SpawnError, match="no scratch disk on this proc"):
            pm.spawn("late", Leaf)
        assert not wait_until(lambda: root_faults.failures, timeout=2)
    finally:
        pm.stop().get(timeout=60)
