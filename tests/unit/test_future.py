"""Future: one result that sync code ``get``s and async code awaits, from any thread.

What it promises: the first outcome wins; ``get``/``result`` return it or raise
its exception; ``get(timeout)`` raises ``TimeoutError`` and leaves the future
usable; callbacks run once it is done (at once when it already is); ``await``
works on any loop; ``get`` on a runtime loop thread raises instead of
deadlocking; ``@returns_future`` bodies start when first observed.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from monarch.actor import Future, returns_future
from monarch.core.future import mark_loop_thread

WAIT = 10


def complete_later(fut: Future, value: object, after: threading.Event) -> threading.Thread:
    """Complete ``fut`` with ``value`` from another thread once ``after`` is set."""

    def run():
        after.wait(WAIT)
        fut.set_result(value)

    t = threading.Thread(target=run)
    t.start()
    return t


# -- completing and getting -------------------------------------------------------------


def test_get_and_result_return_the_value_set():
    fut: Future[int] = Future()
    assert not fut.done()
    fut.set_result(7)
    assert fut.done()
    assert fut.get() == 7
    assert fut.result() == 7
    assert fut.exception() is None


def test_from_value_is_done_with_that_value():
    assert Future.from_value([1, 2]).get(0) == [1, 2]


def test_none_is_a_value_like_any_other():
    fut = Future.from_value(None)
    assert fut.done() and fut.get(0) is None


def test_the_first_outcome_wins_and_later_ones_are_ignored():
    fut: Future[int] = Future()
    fut.set_result(1)
    fut.set_result(2)
    fut.set_exception(RuntimeError("late"))
    assert fut.get() == 1

    failed: Future[int] = Future()
    failed.set_exception(KeyError("first"))
    failed.set_result(3)
    with pytest.raises(KeyError, match="first"):
        failed.get()


def test_an_exception_is_raised_by_get_every_time_and_returned_by_exception():
    fut: Future[int] = Future()
    err = ValueError("bad input")
    fut.set_exception(err)
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            fut.get()
        assert info.value is err
    assert fut.exception() is err


def test_a_result_set_from_another_thread_wakes_a_blocked_get():
    fut: Future[str] = Future()
    go = threading.Event()
    t = complete_later(fut, "from a thread", go)
    go.set()
    assert fut.get(WAIT) == "from a thread"
    t.join(WAIT)


# -- timeouts -----------------------------------------------------------------------------


def test_get_with_a_timeout_raises_timeout_error_and_the_future_stays_usable():
    fut: Future[int] = Future()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)
    with pytest.raises(TimeoutError):
        fut.result(timeout=0)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0)
    assert not fut.done()
    fut.set_result(5)
    assert fut.get(0) == 5


def test_a_timeout_error_that_is_the_outcome_is_raised_as_the_outcome():
    fut: Future[int] = Future()
    err = TimeoutError("the remote operation timed out")
    fut.set_exception(err)
    with pytest.raises(TimeoutError) as info:
        fut.get(timeout=0.01)
    assert info.value is err


# -- callbacks ----------------------------------------------------------------------------


def test_a_callback_runs_once_with_the_future_when_it_completes():
    fut: Future[int] = Future()
    seen: list[object] = []
    fut.add_callback(lambda f: seen.append(f.get(0)))
    assert seen == []
    fut.set_result(3)
    fut.set_result(4)
    assert seen == [3]


def test_a_callback_added_to_a_done_future_runs_at_once():
    fut = Future.from_value("done")
    seen: list[object] = []
    fut.add_callback(lambda f: seen.append((f is fut, f.get(0))))
    assert seen == [(True, "done")]


def test_a_callback_sees_the_exception_of_a_failed_future():
    fut: Future[int] = Future()
    seen: list[object] = []
    fut.add_callback(lambda f: seen.append(f.exception()))
    err = OSError("gone")
    fut.set_exception(err)
    assert seen == [err]


# -- await ----------------------------------------------------------------------------------


def test_await_gives_the_value_set_from_another_thread():
    fut: Future[int] = Future()

    async def main():
        go = threading.Event()
        t = complete_later(fut, 11, go)
        go.set()
        value = await asyncio.wait_for(fut, WAIT)
        t.join(WAIT)
        return value

    assert asyncio.run(main()) == 11


def test_await_raises_the_exception_set():
    fut: Future[int] = Future()
    fut.set_exception(LookupError("nope"))

    async def main():
        await fut

    with pytest.raises(LookupError, match="nope"):
        asyncio.run(main())


def test_as_asyncio_is_an_asyncio_future_of_the_same_outcome():
    fut: Future[int] = Future()

    async def main():
        af = fut.as_asyncio()
        assert isinstance(af, asyncio.Future) and not af.done()
        fut.set_result(9)
        return await af

    assert asyncio.run(main()) == 9


def test_one_future_awaited_on_two_loops_gives_both_the_value():
    fut: Future[str] = Future()
    results: list[str] = []
    ready = threading.Barrier(3)

    def waiter():
        async def main():
            ready.wait(WAIT)
            return await asyncio.wait_for(fut, WAIT)

        results.append(asyncio.run(main()))

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    ready.wait(WAIT)
    fut.set_result("both")
    for t in threads:
        t.join(WAIT)
    assert results == ["both", "both"]


def test_an_await_that_times_out_leaves_the_future_usable():
    fut: Future[int] = Future()

    async def impatient():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(fut, 0.01)

    asyncio.run(impatient())
    assert not fut.done()
    fut.set_result(5)
    assert fut.get(0) == 5


def test_a_cancelled_awaiter_does_not_cancel_the_future_for_other_awaiters():
    fut: Future[int] = Future()

    async def main():
        first = asyncio.ensure_future(fut.as_asyncio())
        second = asyncio.ensure_future(fut.as_asyncio())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        fut.set_result(1)
        return await asyncio.wait_for(second, WAIT)

    assert asyncio.run(main()) == 1


# -- where get may block ---------------------------------------------------------------------


def test_get_on_a_runtime_loop_thread_raises_instead_of_deadlocking():
    fut: Future[int] = Future()
    done = Future.from_value("ready")
    outcome: list[object] = []

    def loop_thread():
        mark_loop_thread()  # this thread now counts as a runtime loop's (until it ends)
        try:
            fut.get(WAIT)
        except RuntimeError as e:
            outcome.append(str(e))
        outcome.append(done.get())  # a done future never blocks: allowed anywhere

    t = threading.Thread(target=loop_thread)
    t.start()
    t.join(WAIT)
    assert len(outcome) == 2 and "await" in outcome[0] and outcome[1] == "ready"


def test_a_new_thread_is_not_a_loop_thread_even_with_an_ended_loop_threads_id():
    """Thread ids are reused once a thread ends: the mark must end with its thread."""

    def ident_of(target) -> int:
        t = threading.Thread(target=target)
        t.start()
        t.join(WAIT)
        return t.ident  # type: ignore[return-value]

    marked = ident_of(mark_loop_thread)
    outcomes: dict[int, str] = {}

    def plain_thread():
        try:
            Future().get(timeout=0)
        except TimeoutError:
            outcomes[threading.get_ident()] = "timeout"
        except RuntimeError:
            outcomes[threading.get_ident()] = "refused as a loop thread"

    for _ in range(20):  # the next thread usually gets the ended thread's id at once
        ident_of(plain_thread)
        if marked in outcomes:
            break
    assert set(outcomes.values()) == {"timeout"}


# -- @returns_future -------------------------------------------------------------------------


def test_returns_future_gives_a_future_that_get_and_await_both_complete():
    @returns_future
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert add(1, 2).get(WAIT) == 3

    async def main():
        return await add(3, 4)

    assert asyncio.run(main()) == 7


def test_returns_future_body_starts_only_when_observed():
    ran: list[int] = []

    @returns_future
    async def side_effect(x: int) -> int:
        ran.append(x)
        return x

    fut = side_effect(1)
    side_effect(2)  # never observed: never runs
    assert ran == []
    assert fut.get(WAIT) == 1
    assert ran == [1]


def test_returns_future_propagates_the_bodys_exception():
    @returns_future
    async def fails():
        raise ZeroDivisionError("in the body")

    with pytest.raises(ZeroDivisionError, match="in the body"):
        fails().get(WAIT)


def test_returns_future_get_inside_another_body_raises_instead_of_deadlocking():
    @returns_future
    async def inner() -> int:
        return 1

    @returns_future
    async def outer() -> str:
        try:
            inner().get(WAIT)
        except RuntimeError as e:
            return str(e)
        return "no error"

    assert "await it there" in outer().get(WAIT)


def test_returns_future_refuses_a_plain_function():
    with pytest.raises(TypeError, match="async def"):
        returns_future(lambda: 1)  # type: ignore[arg-type]
