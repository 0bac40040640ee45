"""The one long-lived thread that starts this process's children.

Processes are started from it so the kernel's parent-death signal (see
:mod:`monarch.broker.connections._pdeathsig`) stays armed for their whole life:
that signal fires when the *thread* that started a child ends, so a child
started from a short-lived thread would die with it. If the client is
SIGKILLed its procs die with it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_jobs: queue.SimpleQueue | None = None
_jobs_lock = threading.Lock()


def _launcher() -> queue.SimpleQueue:
    """The one thread that starts procs: a plain daemon thread that lives as long as
    the process. Not an executor: ``concurrent.futures`` ends its threads at
    interpreter exit, before atexit handlers run, and the kernel would then kill
    every proc (parent-death signal) before the client could stop them in order."""
    global _jobs
    with _jobs_lock:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            jobs = _jobs

            def run() -> None:
                while True:
                    jobs.get()()

            threading.Thread(target=run, name="monarch-launcher", daemon=True).start()
        return _jobs


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if not fut.done():
        fut.set_result(None) if error is None else fut.set_exception(error)


def _forget_parent_after_fork() -> None:
    """In a forked child: the launcher thread did not survive the fork; a job put
    on the parent's queue would never run. Start our own on first use."""
    global _jobs, _jobs_lock
    _jobs, _jobs_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


async def on_launcher_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the launcher's one long-lived thread and wait for it (on ``loop``).

    Children started there get their parent-death signal from a thread that
    lives as long as the client, not from whichever thread asked.
    """
    done = loop.create_future()

    def job() -> None:
        try:
            fn()
            loop.call_soon_threadsafe(_settle, done, None)
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, done, e)

    _launcher().put(job)
    await done


def run_on_launcher_thread(fn: Callable[[], T], timeout: float = 60.0) -> T:
    """Run ``fn`` on the launcher's one long-lived thread and return its result (blocks).

    For children that must outlive the thread that asked: the embedded broker
    started by a client whose first use of monarch is on a short-lived thread
    (a thread pool's) would otherwise get its parent-death signal when that
    thread ends. Raises what ``fn`` raised, or TimeoutError after ``timeout``.
    """
    out: queue.SimpleQueue = queue.SimpleQueue()

    def job() -> None:
        try:
            out.put((True, fn()))
        except BaseException as e:
            out.put((False, e))

    _launcher().put(job)
    try:
        ok, value = out.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"the launcher thread did not run {fn!r} within {timeout} s") from None
    if not ok:
        raise value
    return value
