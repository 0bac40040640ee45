"""SIGINT and SIGTERM end a long-running host process once, and cleanly.

A host agent or a dial-in worker stops on the first SIGINT or SIGTERM and then
takes a while to leave (procs stopped, registry entry removed, socket file
unlinked). A second signal on that way out is common: a supervisor's SIGTERM
crosses the client's shutdown, or a user presses Ctrl-C twice. It must not
turn the clean exit into death by signal.

Not ``loop.add_signal_handler``: removing such a handler, which the loop's
``close()`` also does, puts the signal back to ``SIG_DFL``, so a signal that
arrives after it (or between that and setting ``SIG_IGN``) kills the process.
A worker sent a stream of SIGTERMs died so in 15 runs of 20. Here the handler
is a plain Python one that asks the loop to stop; from the first signal on,
both signals are ignored, by one swap each, and nothing restores ``SIG_DFL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> bool:
    """Have the first SIGINT or SIGTERM set ``stop`` on ``loop``, and any later one do nothing.

    Returns False where signals cannot be handled here (not the main thread):
    the caller then stops only for its other reasons.
    """

    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        # Python runs a pending handler at any bytecode boundary, this one's too: a
        # burst of signals would nest it without end before the swap below lands.
        nonlocal stopping
        if stopping:
            return
        stopping = True
        ignore_stop_signals()
        with contextlib.suppress(RuntimeError):  # the loop closed: stopped already
            loop.call_soon_threadsafe(stop.set)

    try:
        for sig in SIGNALS:
            signal.signal(sig, handler)
    except ValueError:  # only the main thread may set signal handlers
        return False
    return True


def ignore_stop_signals() -> None:
    """Stopping already (for whatever reason): SIGINT and SIGTERM no longer matter."""
    for sig in SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: nothing was set
            signal.signal(sig, signal.SIG_IGN)
