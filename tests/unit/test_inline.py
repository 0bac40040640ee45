"""Running a coroutine inline (:mod:`monarch.broker.natspy_internals.inline`): the task
that finishes one which waited is closed cleanly when destroyed pending."""

from __future__ import annotations

import asyncio
import warnings

from monarch.broker.natspy_internals.inline import _finish, run_inline


async def _waits(fut: asyncio.Future, log: list[str]) -> None:
    try:
        await fut
        log.append("resumed")
    finally:
        log.append("closed")


def test_a_finishing_coroutine_closed_while_it_waits_closes_the_one_it_drives():
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        log: list[str] = []
        inner = _waits(fut, log)
        waiting_on = inner.send(None)  # as run_inline does: up to its first wait
        outer = _finish(inner, waiting_on, log.append)
        assert outer.send(None) is fut  # it waits on the inner coroutine's future
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            outer.close()  # a pending task destroyed: no "coroutine ignored GeneratorExit"
        assert log == ["closed"]  # the inner one was closed, not resumed
        assert inner.cr_frame is None
    finally:
        loop.close()


def test_a_coroutine_that_waits_is_finished_by_its_task_with_the_outcome():
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        log: list[str] = []
        task = run_inline(_waits(fut, log), loop, lambda e: log.append(repr(e)))
        assert task is not None and log == []
        fut.set_result(None)
        await task
        return log

    assert asyncio.run(scenario()) == ["resumed", "closed"]
