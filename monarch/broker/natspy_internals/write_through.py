"""Writing a message to the broker's socket within its publish, not on nats-py's flusher's turn.

nats-py's publish appends the message's bytes to a list and wakes a
*flusher* task, which writes the list to the socket on its next turn of the
event loop: a task switch on every leg of every call. :func:`install`
replaces the connection's ``_flush_pending`` (what a publish calls) so that
the first publish of a loop turn writes the list at once, and what later
publishes of the same turn queue is written together at the start of the
next turn: one message leaves at once, a burst costs two writes, not one per
message (writing every message at once cost pipelined calls 20-50% of their
rate in a first trial, benchmarks/NOTES.md entry 30).

nats-py's flusher still does the writing, as before and with its
back-pressure (it awaits the transport's ``drain``), whenever the connection
is not up (the bytes wait for the reconnect, as in nats-py), its flusher has
ended, a full buffer forces a flush, or more than :data:`WRITE_THROUGH_LIMIT`
bytes already wait in the transport (a slow broker or network). The bytes
always leave from nats-py's own list, in the order they were queued,
whichever of the two writes them.

What this touches are nats-py internals (``Client._flush_pending``,
``_pending``, ``_pending_data_size``, ``_flusher_task``, the transport's
``_io_writer``): :func:`install` checks that they are there and otherwise
leaves the connection as nats-py made it, as it does when
``MONARCH_WRITE_THROUGH=0``. ``tests/broker/test_write_through.py`` runs it
against a real nats-server, through a burst, back-pressure and a restart.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from nats.aio.client import Client

from monarch.broker.natspy_internals.inline import run_inline
from monarch.broker.settings import settings

log = logging.getLogger(__name__)

# Bytes waiting in the transport (not yet taken by the kernel) above which a
# publish leaves the writing to nats-py's flusher, which waits for them to drain.
WRITE_THROUGH_LIMIT = 64 * 1024


class WriteThrough:
    """Replaces one connection's ``_flush_pending``; ``nc._monarch_write_through`` after install."""

    def __init__(self, nc: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self.loop = loop
        self.turn_end_due = False  # bytes queued until then leave at the next turn

    def can_write(self) -> bool:
        nc = self.nc
        flusher = nc._flusher_task
        if not nc.is_connected or flusher is None or flusher.done():
            return False
        try:
            return nc._transport._io_writer.transport.get_write_buffer_size() <= WRITE_THROUGH_LIMIT
        except Exception:  # no transport (closing): nats-py's flusher decides
            return False

    def write(self) -> bool:
        """Write everything nats-py has queued; False if the transport refused."""
        nc = self.nc
        try:
            nc._transport.writelines(nc._pending)
        except Exception:
            return False
        nc._pending = []
        nc._pending_data_size = 0
        return True

    async def flush_pending(self, force_flush: bool = False) -> Any:
        """nats-py's ``_flush_pending``, writing at once where it safely can."""
        if force_flush or not self.can_write():
            return await Client._flush_pending(self.nc, force_flush)
        if not self.flush_now():
            return await Client._flush_pending(self.nc, force_flush)
        return None

    def flush_now(self) -> bool:
        """Write what is queued if no publish of this turn did; False if the transport refused.

        For a caller that checked :meth:`can_write`. A later publish of the
        same turn leaves with the rest at the start of the next turn.
        """
        if self.turn_end_due:
            return True  # a publish of this turn wrote already: this one leaves with the rest
        self.turn_end_due = True
        self.loop.call_soon(self.turn_end)
        return not self.nc._pending_data_size or self.write()

    def hand_to_flusher(self) -> None:
        """Let nats-py's flusher write what is queued (from plain code)."""
        run_inline(Client._flush_pending(self.nc), self.loop, self.flush_failed)

    def turn_end(self) -> None:
        self.turn_end_due = False
        if not self.nc._pending_data_size:
            return
        if not self.can_write() or not self.write():
            self.hand_to_flusher()

    @staticmethod
    def flush_failed(e: Exception) -> None:
        log.warning("nats: could not hand queued messages to the flusher: %r", e)


def _has_internals(nc: Client) -> bool:
    transport = getattr(nc, "_transport", None)
    return (
        inspect.iscoroutinefunction(getattr(Client, "_flush_pending", None))
        and all(hasattr(nc, a) for a in ("_pending", "_pending_data_size", "_flusher_task"))
        and hasattr(transport, "writelines")
        and hasattr(getattr(getattr(transport, "_io_writer", None), "transport", None),
                    "get_write_buffer_size")
    )  # fmt: skip


def install(nc: Client) -> bool:
    """Write ``nc``'s messages within their publish; False (nc untouched) where it cannot.

    Call it on the loop that runs ``nc``, once it is connected; a second call
    does nothing.
    """
    if getattr(nc, "_monarch_write_through", None) is not None:
        return True
    if not settings().write_through or not nc.is_connected or not _has_internals(nc):
        return False
    through = WriteThrough(nc, asyncio.get_running_loop())
    nc._monarch_write_through = through  # type: ignore[attr-defined]
    nc._flush_pending = through.flush_pending  # type: ignore[method-assign]
    return True
