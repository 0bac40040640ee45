"""Tests run two at a time (pytest-xdist's ``-n 2``, in pyproject's ``addopts``); one
marked ``alone`` runs with no other test beside it.

Run one at a time, the suite keeps this 2-core machine's CPUs 60% idle (``/proc/stat``
over tests/actors, unit, reliability and supervision: 40% busy): tests wait on real
timeouts, failovers, broker restarts and stalls. Two workers (``--dist loadfile``: a
file's tests share one worker, in order, so module fixtures and order-dependent tests
are as before) take the suite from ~12 minutes to ~7.5 here (1,198 tests). A few tests
make the machine busy on purpose (CPU burners, a 1 GiB tensor, container images and
broker failovers) or need it quiet to produce what they check (a socket filling while
its broker is stopped); ``@pytest.mark.alone`` on those takes the whole machine for them.

The two workers share a readers-writer lock made of two ``flock`` files in the run's
base temporary folder: a test takes the room shared, an ``alone`` one takes it whole.
A test waiting to be alone holds the turnstile while it waits, so the other worker
starts nothing new meanwhile and the wait ends with the test in progress. A worker that
dies drops its locks with its file descriptors. Run without workers (``-n 0``), nothing
is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def forget_the_workers_terminal(config: pytest.Config) -> None:
    """An xdist worker sets ``COLUMNS=80`` and ``LINES=24`` for its own output: programs the
    tests start must not inherit them (``monarch top``, in a tmux pane of the test's size,
    reads them before the pane's, and drew 80 columns in a 200-column pane)."""
    if hasattr(config, "workerinput"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


@contextlib.contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold ``item``'s place in the room while it is set up, run and torn down."""
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: nothing beside it
        yield
        return
    # A worker's base temporary folder is <the run's>/popen-gwN: its parent is shared.
    folder: Path = item.config._tmp_path_factory.getbasetemp().parent
    alone = item.get_closest_marker("alone") is not None
    with open(folder / "turnstile.lock", "a") as turnstile, open(folder / "room.lock", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
