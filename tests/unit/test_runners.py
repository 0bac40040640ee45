"""ThreadRunner and LoopRunner: an actor's items are handled one at a time, in order.

``ThreadRunner`` (actors with sync endpoints) handles items on the actor's own
thread and hands work to the loop through ``post``; ``LoopRunner`` (all-async
actors) handles them in a task on the loop. Both run ``Job`` items (a call to
make on the actor) and settle the job's loop future with its outcome, and both
stop at ``STOP``, leaving later items to ``take_pending``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import types
from collections.abc import Iterator

import pytest

from monarch.actors.hosting.mailbox import STOP, Job, LoopRunner, ThreadRunner
from monarch.settings import settings

WAIT = 10  # seconds: a bound on every wait, never an expectation


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own, as a proc's runtime loop does."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, name="test-loop", daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(WAIT)
    lp.close()


def on_loop(loop: asyncio.AbstractEventLoop, fn, *args):
    """Run ``fn(*args)`` on the loop and return its value."""

    async def call():
        return fn(*args)

    return asyncio.run_coroutine_threadsafe(call(), loop).result(WAIT)


def new_job(loop: asyncio.AbstractEventLoop, fn, *args) -> Job:
    return Job(fn, args, on_loop(loop, loop.create_future))


def outcome(loop: asyncio.AbstractEventLoop, fut: asyncio.Future):
    """The loop future's result, or its exception raised here (any BaseException)."""
    settled = threading.Event()
    on_loop(loop, fut.add_done_callback, lambda _: settled.set())
    assert settled.wait(WAIT), "the job's future was never settled"
    exc = on_loop(loop, fut.exception)
    if exc is not None:
        raise exc
    return fut.result()


# -- ThreadRunner ---------------------------------------------------------------------


@pytest.fixture
def thread_runner(loop):
    """A ThreadRunner whose handle records (item, thread) and whose tests close it."""
    handled: list[tuple[object, int]] = []
    runners: list[ThreadRunner] = []

    def start(handle=None) -> ThreadRunner:
        r = ThreadRunner(
            loop,
            "actor-thread",
            handle or (lambda item: handled.append((item, threading.get_ident()))),
            loop.call_soon_threadsafe,
        )
        runners.append(r)
        return r

    start.handled = handled  # type: ignore[attr-defined]
    yield start
    for r in runners:
        r.close()
        r.thread.join(WAIT)
        assert not r.thread.is_alive()


def test_thread_runner_handles_items_in_order_on_its_own_thread(thread_runner, loop):
    r = thread_runner()
    for i in range(100):
        r.put(i)
    r.close()
    r.thread.join(WAIT)
    items = [item for item, _ in thread_runner.handled]
    assert items == list(range(100))
    assert {tid for _, tid in thread_runner.handled} == {r.thread.ident}
    assert r.thread.ident != threading.get_ident()


def test_thread_runner_job_settles_its_future_with_the_result(thread_runner, loop):
    r = thread_runner()
    job = new_job(loop, lambda a, b: a + b, 2, 3)
    r.put(job)
    assert outcome(loop, job.done) == 5


def test_thread_runner_job_exception_reaches_its_future_and_the_runner_goes_on(thread_runner, loop):
    r = thread_runner()

    def boom():
        raise KeyError("no such thing")

    job = new_job(loop, boom)
    r.put(job)
    r.put("after")
    with pytest.raises(KeyError, match="no such thing"):
        outcome(loop, job.done)
    later = new_job(loop, lambda: "still running")
    r.put(later)
    assert outcome(loop, later.done) == "still running"
    assert [i for i, _ in thread_runner.handled] == ["after"]


def test_thread_runner_job_base_exception_is_an_outcome_not_the_threads_end(thread_runner, loop):
    r = thread_runner()

    def interrupt():
        raise KeyboardInterrupt

    job = new_job(loop, interrupt)
    r.put(job)
    with pytest.raises(KeyboardInterrupt):
        outcome(loop, job.done)
    later = new_job(loop, lambda: 1)
    r.put(later)
    assert outcome(loop, later.done) == 1


def test_thread_runner_job_that_returns_a_coroutine_runs_it_on_the_loop(thread_runner, loop):
    r = thread_runner()
    loop_thread = on_loop(loop, threading.get_ident)

    async def body(x):
        await asyncio.sleep(0)
        return x * 2, threading.get_ident()

    job = new_job(loop, body, 21)
    r.put(job)
    assert outcome(loop, job.done) == (42, loop_thread)


def test_thread_runner_job_whose_future_was_cancelled_does_not_break_the_runner(
    thread_runner, loop
):
    r = thread_runner()
    job = new_job(loop, lambda: "late")
    on_loop(loop, job.done.cancel)
    r.put(job)
    later = new_job(loop, lambda: "next")
    r.put(later)
    assert outcome(loop, later.done) == "next"
    assert job.done.cancelled()


def test_thread_runner_posts_run_on_the_loop_in_the_order_posted(loop):
    order: list[tuple[int, int]] = []
    done = threading.Event()
    runner_box: list[ThreadRunner] = []

    def handle(item):
        r = runner_box[0]
        for i in range(50):
            r.post(lambda i=i: order.append((i, threading.get_ident())))
        r.post(done.set)

    r = ThreadRunner(loop, "poster", handle, loop.call_soon_threadsafe)
    runner_box.append(r)
    try:
        r.put("go")
        assert done.wait(WAIT)
        loop_thread = on_loop(loop, threading.get_ident)
        assert [i for i, _ in order] == list(range(50))
        assert {t for _, t in order} == {loop_thread}
    finally:
        r.close()
        r.thread.join(WAIT)


def test_thread_runner_is_idle_only_while_handling_the_last_item(thread_runner):
    gate = threading.Event()
    seen: list[tuple[object, bool]] = []
    box: list[ThreadRunner] = []

    second_seen = threading.Event()

    def handle(item):
        if item == "first":
            gate.wait(WAIT)
        seen.append((item, box[0].idle()))
        if item == "second":
            second_seen.set()

    r = thread_runner(handle)
    box.append(r)
    r.put("first")
    r.put("second")
    gate.set()
    assert second_seen.wait(WAIT)
    assert seen == [("first", False), ("second", True)]


def test_thread_runner_stops_at_stop_and_leaves_later_items_pending(thread_runner):
    gate = threading.Event()
    handled: list[object] = []

    def handle(item):
        gate.wait(WAIT)
        handled.append(item)

    r = thread_runner(handle)
    r.put(1)
    r.close()
    r.put(2)
    r.put(3)
    gate.set()
    r.thread.join(WAIT)
    assert not r.thread.is_alive()
    assert handled == [1]
    assert r.take_pending() == [2, 3]
    assert r.take_pending() == []


def test_thread_runner_run_async_returns_the_coroutines_value_or_raises(thread_runner, loop):
    results: list[object] = []
    box: list[ThreadRunner] = []

    async def fails():
        raise ValueError("async failure")

    async def value():
        return "v"

    def handle(item):
        results.append(box[0].run_async(value()))
        try:
            box[0].run_async(fails())
        except ValueError as e:
            results.append(str(e))

    r = thread_runner(handle)
    box.append(r)
    r.put("x")
    r.close()
    r.thread.join(WAIT)
    assert results == ["v", "async failure"]


# -- LoopRunner -----------------------------------------------------------------------


TASK = "actor-task"


def start_loop_runner(loop, handle) -> LoopRunner:
    return on_loop(loop, LoopRunner, loop, TASK, handle)


def wait_task_end(loop) -> None:
    """Until the runner's task (known by the name it was given) has ended."""

    async def gone():
        while any(t.get_name() == TASK for t in asyncio.all_tasks()):
            await asyncio.sleep(0.001)

    asyncio.run_coroutine_threadsafe(asyncio.wait_for(gone(), WAIT), loop).result(WAIT + 1)


def finish(loop, r: LoopRunner) -> None:
    on_loop(loop, r.close)
    wait_task_end(loop)


def test_loop_runner_handles_each_item_to_its_end_before_the_next(loop):
    events: list[str] = []

    async def handle(item):
        events.append(f"start {item}")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        events.append(f"end {item}")

    r = start_loop_runner(loop, handle)
    for i in range(3):
        on_loop(loop, r.put, i)
    finish(loop, r)
    assert events == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]


def test_loop_runner_async_job_settles_its_future(loop):
    async def handle(item):
        pass

    r = start_loop_runner(loop, handle)

    async def body(x):
        await asyncio.sleep(0)
        return x + 1

    job = new_job(loop, body, 1)
    on_loop(loop, r.put, job)
    assert outcome(loop, job.done) == 2
    finish(loop, r)


def test_loop_runner_sync_job_runs_off_the_loop_and_settles_its_future(loop):
    async def handle(item):
        pass

    r = start_loop_runner(loop, handle)
    loop_thread = on_loop(loop, threading.get_ident)
    job = new_job(loop, threading.get_ident)
    on_loop(loop, r.put, job)
    ran_on = outcome(loop, job.done)
    assert ran_on != loop_thread
    finish(loop, r)


def test_loop_runner_job_exception_reaches_its_future_and_the_runner_goes_on(loop):
    handled: list[object] = []

    async def handle(item):
        handled.append(item)

    r = start_loop_runner(loop, handle)

    async def boom():
        raise RuntimeError("hook failed")

    job = new_job(loop, boom)
    on_loop(loop, r.put, job)
    on_loop(loop, r.put, "after")
    with pytest.raises(RuntimeError, match="hook failed"):
        outcome(loop, job.done)
    finish(loop, r)
    assert handled == ["after"]


def test_loop_runner_stops_at_stop_and_leaves_later_items_pending(loop):
    handled: list[object] = []

    async def handle(item):
        handled.append(item)

    r = start_loop_runner(loop, handle)

    def put_all():
        r.put(1)
        r.close()
        r.put(2)
        r.put(STOP)

    on_loop(loop, put_all)
    wait_task_end(loop)
    assert handled == [1]
    assert on_loop(loop, r.take_pending) == [2, STOP]


def test_loop_runner_cancel_ends_an_item_in_progress(loop):
    started = threading.Event()
    cancelled: list[object] = []

    async def handle(item):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    r = start_loop_runner(loop, handle)
    on_loop(loop, r.put, "forever")
    on_loop(loop, r.put, "never")
    assert started.wait(WAIT)
    on_loop(loop, r.cancel)
    wait_task_end(loop)
    assert cancelled == ["forever"]
    assert on_loop(loop, r.take_pending) == ["never"]


def test_loop_runner_wakes_for_each_item_put_while_it_waits_and_cancels_while_idle(loop):
    handled: list[object] = []
    got = threading.Event()

    async def handle(item):
        handled.append(item)
        got.set()

    r = start_loop_runner(loop, handle)
    for i in range(3):  # each put finds the runner waiting on an empty mailbox
        got.clear()
        on_loop(loop, r.put, i)
        assert got.wait(WAIT)
    assert handled == [0, 1, 2]
    on_loop(loop, r.cancel)  # idle: nothing in progress, nothing left
    wait_task_end(loop)
    on_loop(loop, r.put, "late")  # after the end: kept, not handled, no error
    assert on_loop(loop, r.take_pending) == ["late"]
    assert handled == [0, 1, 2]


# -- LoopRunner: a call that finds it idle starts at once ------------------------------

seen_var: contextvars.ContextVar[str] = contextvars.ContextVar("seen_var", default="unset")


def call(name: object) -> types.SimpleNamespace:
    """An item with a reply subject, as a call's message has."""
    return types.SimpleNamespace(name=name, reply=f"inbox.{name}")


def name_of(item: object) -> object:
    return getattr(item, "name", item)


def in_callback(loop: asyncio.AbstractEventLoop, fn, *args):
    """Run ``fn(*args)`` in a plain callback of the loop (no task current, as the
    broker's intake delivers) and return its value."""
    done = threading.Event()
    out: list = []

    def run():
        try:
            out.append(fn(*args))
        finally:
            done.set()

    loop.call_soon_threadsafe(run)
    assert done.wait(WAIT)
    return out[0]


def recording_runner(loop, handled: list):
    """A runner whose items are recorded as (name, the task that ran them), made idle."""

    async def handle(item):
        handled.append((name_of(item), asyncio.current_task().get_name()))

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)
    return r


def put_and_count(r: LoopRunner, handled: list, item) -> int:
    """Put ``item``; how many items were handled by the time put returned."""
    r.put(item)
    return len(handled)


def test_loop_runner_call_put_while_idle_is_handled_within_put_in_the_runners_task_and_context(
    loop,
):
    handled: list[tuple] = []

    async def handle(item):
        handled.append((item.name, asyncio.current_task().get_name(), seen_var.get()))
        seen_var.set(f"set by {item.name}")

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)

    def put_and_look(item):
        before = len(handled)
        r.put(item)
        return len(handled) - before, seen_var.get(), asyncio.current_task(loop)

    # handled before put returned, with the runner's task current, in the runner's context
    # (what call 0 set is what call 1 sees); the caller's context and task are its own again
    assert in_callback(loop, put_and_look, call(0)) == (1, "unset", None)
    assert in_callback(loop, put_and_look, call(1)) == (1, "unset", None)
    assert handled == [(0, TASK, "unset"), (1, TASK, "set by 0")]
    finish(loop, r)


def test_loop_runner_send_put_while_idle_is_queued_for_the_runners_task(loop):
    """A message without a reply (a send: they come in floods) waits for the runner's
    task, which takes what is queued one after another."""
    handled: list[tuple] = []
    r = recording_runner(loop, handled)
    assert in_callback(loop, put_and_count, r, handled, "a send") == 0
    finish(loop, r)
    assert handled == [("a send", TASK)]


def test_loop_runner_not_eager_queues_a_call_put_while_idle_for_its_task(loop, monkeypatch):
    """``MONARCH_EAGER_START=0``: every item waits for the runner's task (the switch is
    read when the runner is made)."""
    handled: list[tuple] = []
    monkeypatch.setenv("MONARCH_EAGER_START", "0")
    settings.cache_clear()
    try:
        r = recording_runner(loop, handled)
    finally:
        monkeypatch.delenv("MONARCH_EAGER_START")
        settings.cache_clear()
    assert in_callback(loop, put_and_count, r, handled, call("queued")) == 0
    finish(loop, r)
    assert handled == [("queued", TASK)]


def test_loop_runner_call_put_from_a_task_is_queued_for_the_runners_task(loop):
    """An actor calling another actor of its process puts from its own task: the call
    waits for the runner's task, so one start never runs inside another."""
    handled: list[tuple] = []
    r = recording_runner(loop, handled)
    assert on_loop(loop, put_and_count, r, handled, call("from a task")) == 0  # in a task
    finish(loop, r)
    assert handled == [("from a task", TASK)]


def test_loop_runner_call_that_suspends_at_its_start_ends_before_anything_put_meanwhile(loop):
    events: list[str] = []
    r: LoopRunner

    async def handle(item):
        name = name_of(item)
        events.append(f"start {name} in {asyncio.current_task().get_name()}")
        if name == 0:
            r.put(call("put by 0"))  # to itself, while its start runs
            await asyncio.sleep(0)
            await asyncio.sleep(0.01)
        events.append(f"end {name} in {asyncio.current_task().get_name()}")

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)

    def put_three():
        for name in (0, 1, 2):
            r.put(call(name))

    in_callback(loop, put_three)
    finish(loop, r)
    assert events == [
        f"start 0 in {TASK}", f"end 0 in {TASK}",
        f"start put by 0 in {TASK}", f"end put by 0 in {TASK}",
        f"start 1 in {TASK}", f"end 1 in {TASK}",
        f"start 2 in {TASK}", f"end 2 in {TASK}",
    ]  # fmt: skip


def test_loop_runner_cancelled_before_going_on_with_a_started_call_cancels_that_call(loop):
    cancelled: list[object] = []
    waited_on: list[asyncio.Future] = []

    async def handle(item):
        fut = asyncio.get_running_loop().create_future()
        waited_on.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            cancelled.append(name_of(item))
            raise

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)

    def put_then_cancel():  # one loop turn: the runner's task never took the started call
        r.put(call("started"))
        r.put("queued")
        r.cancel()

    in_callback(loop, put_then_cancel)
    wait_task_end(loop)
    assert cancelled == ["started"]
    assert on_loop(loop, waited_on[0].cancelled)  # what it waited on, as a task's cancel does
    assert on_loop(loop, r.take_pending) == ["queued"]


def test_loop_runner_cancelled_before_going_on_closes_a_started_call_that_swallows_it(loop):
    """A handling that catches the cancellation and waits again is closed (its finally
    runs), as a task destroyed with its loop would be: nothing is left waiting."""
    events: list[str] = []

    async def handle(item):
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            events.append("swallowed the cancel")
            try:
                await asyncio.get_running_loop().create_future()
            finally:
                events.append("closed")

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)

    def put_then_cancel():
        r.put(call("stubborn"))
        r.cancel()

    in_callback(loop, put_then_cancel)
    wait_task_end(loop)
    assert events == ["swallowed the cancel", "closed"]


def test_loop_runner_error_escaping_a_started_call_is_logged_and_the_runner_goes_on(loop, caplog):
    handled: list[object] = []

    async def handle(item):
        if name_of(item) == "bad":
            raise RuntimeError("escaped the handler")
        handled.append(name_of(item))

    r = start_loop_runner(loop, handle)
    wait_until_idle(loop, r)
    with caplog.at_level(logging.ERROR, logger="monarch.actors.hosting.mailbox"):
        in_callback(loop, r.put, call("bad"))
        in_callback(loop, r.put, call("good"))
    finish(loop, r)
    assert handled == ["good"]
    assert "escaped the handler" in caplog.text


def wait_until_idle(loop, r: LoopRunner) -> None:
    """Until the runner's task waits for work (a call put now starts at once)."""

    async def idle():
        while r._waiter is None:  # noqa: SLF001  (the state put() reads)
            await asyncio.sleep(0.001)

    asyncio.run_coroutine_threadsafe(asyncio.wait_for(idle(), WAIT), loop).result(WAIT + 1)


def test_loop_runner_ready_to_start_only_when_idle_eager_and_called_from_a_callback(loop):
    """What a group call (monarch.actors.hosting.group_call) asks of each actor's runner
    before starting the call itself with ``step``, handing the rest to ``go_on``."""
    handled: list[tuple] = []
    r = recording_runner(loop, handled)
    assert in_callback(loop, r.ready_to_start) is True
    assert on_loop(loop, r.ready_to_start) is False  # inside a task

    def put_and_ask() -> bool:
        r.put("a send")  # queued: the runner's task has work
        return r.ready_to_start()

    assert in_callback(loop, put_and_ask) is False
    wait_until_idle(loop, r)
    assert in_callback(loop, r.ready_to_start) is True
    events: list[str] = []

    async def handling(name: str) -> None:
        events.append(f"{name} begins in {asyncio.current_task().get_name()}, {seen_var.get()}")
        await asyncio.sleep(0.01)
        events.append(f"{name} ends in {asyncio.current_task().get_name()}")

    def begin_outside() -> None:
        coro = handling("started")
        seen_var_token = r.step(seen_var.set, "the runner's")  # in the runner's context
        assert seen_var_token is not None and seen_var.get() == "unset"  # ours untouched
        r.go_on(coro, r.step(coro.send, None))  # suspended: its task does the rest
        r.put("queued meanwhile")

    in_callback(loop, begin_outside)
    finish(loop, r)
    assert events == [
        f"started begins in {TASK}, the runner's",
        f"started ends in {TASK}",
    ]
    assert handled == [("a send", TASK), ("queued meanwhile", TASK)]
