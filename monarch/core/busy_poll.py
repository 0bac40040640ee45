"""Keep a process's event loop polling, not sleeping, while a caller waits on it.

Why: a call is a chain of hand-overs (caller thread -> loop -> broker -> the
callee's loop -> its actor thread and back), and each one that lands on a
sleeping core waits for that core to wake. On the virtual machines we measure
on that costs ~60-70 us per hand-over, more than the work itself (NOTES 16).
So when a message of a one-to-one conversation leaves or arrives (a call to a
single actor and its reply carry the ``Mon-Wait: one`` header), the loop keeps
running for ``MONARCH_BUSY_POLL_US`` microseconds (the next message usually
comes sooner), yielding the CPU (``sched_yield``) and the GIL on every turn.

Polling only pays while cores are otherwise idle; it takes CPU time from
processes that have work. That is why a call to many actors does not poll
(four procs polling on two cores cost a broadcast-and-gather 15-30% of its
rate, NOTES 16), and why each turn reads the kernel's count of runnable
threads (``/proc/loadavg``, under 1 us) and stops polling when it exceeds
three times the cores we may use. 0 turns polling off.

Off by default: whether it pays depends on the machine. On the guest of NOTES
16 handing work to a sleeping thread cost 64-76 us a round trip and polling
took ``call_one`` from 646 to 432 us; on the guest of NOTES 26 that round trip
is 15-30 us and polling *doubled* ``call_one`` (750 -> 1,500 us): the spinning
loops take CPU and the GIL from the threads that have the work. A probe of the
wake-up cost at start was tried as an automatic switch and dropped: under load
it read 26-47 us here, too close to the line to decide on.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from monarch.broker.vocabulary import headers as hdr

WAIT_HEADER = hdr.WAIT  # value "one": a caller blocks on this single reply

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class BusyPoll:
    """Loop-thread only: ``poke()`` on traffic; the loop stays awake ``window_us`` after."""

    __slots__ = ("loop", "window", "until", "running", "turns", "_cores", "_loadavg")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int) -> None:
        self.loop = loop
        self.window = window_us / 1e6
        self.until = 0.0
        self.running = False
        self.turns = 0  # how many times the loop went round without sleeping
        self._cores = _cores()
        try:
            self._loadavg: int | None = os.open("/proc/loadavg", os.O_RDONLY)
        except OSError:  # not Linux: no way to tell whether we crowd others out
            self._loadavg = None
            self.window = 0.0

    def on_message(self, msg: Any) -> None:
        """Every message received: poll if it belongs to a one-to-one call (sends poke directly)."""
        headers = msg.headers
        if headers and WAIT_HEADER in headers:
            self.poke()

    def poke(self) -> None:
        if not self.window:
            return
        self.until = time.perf_counter() + self.window
        if not self.running:
            self.running = True
            self.loop.call_soon(self._turn)

    def _crowded(self) -> bool:
        """More than three runnable threads per usable core on the machine (we count too)."""
        if self._loadavg is None:
            return True
        try:
            fields = os.pread(self._loadavg, 128, 0).split()
            return int(fields[3].split(b"/")[0]) > 3 * self._cores
        except (OSError, ValueError, IndexError):
            return True

    def _turn(self) -> None:
        # A ready callback makes the loop poll its sockets without blocking, then
        # come back here; when the window has passed it sleeps in epoll again.
        if time.perf_counter() < self.until and not self._crowded():
            self.turns += 1
            _yield()
            self.loop.call_soon(self._turn)
        else:
            self.running = False

    def close(self) -> None:
        self.window = 0.0
        self.until = 0.0
        if self._loadavg is not None:
            os.close(self._loadavg)
            self._loadavg = None
