"""The one door through which a connection gets the nats-py fast paths.

Each fast path replaces a piece of one nats-py connection (never nats-py
itself) and checks first that the internals it needs are there
(:mod:`.names` lists them all); each has a ``MONARCH_*`` switch (the
``direct_read``, ``fast_delivery``, ``write_through``, ``sync_publish`` and
``direct_write`` settings of :mod:`monarch.broker.settings`). They build on
one another, so they go on in this order:

1. :mod:`.fast_headers`: cheaper header code for what the connection sends and reads;
2. :mod:`.direct_read`: what arrives is parsed at once, not on a task's next
   turn (with :mod:`.fast_delivery` for whole plain frames);
3. :mod:`.write_through`: what it sends leaves within the publish
   (:mod:`.sync_publish` builds on it, made by the runtime on first use);
4. with ``thread_writes``, :mod:`.direct_write`: a thread may write its message
   itself when nothing waits (needs 1 and 3).
"""

from __future__ import annotations

from nats.aio.client import Client

from monarch.broker.natspy_internals import direct_read, direct_write, fast_headers, write_through


def install(nc: Client, *, thread_writes: bool = False) -> None:
    """Give ``nc`` every fast path its nats-py and the settings allow; a second call adds nothing.

    Call it on the loop that runs ``nc``, once it is connected. ``thread_writes``
    also lets other threads write to its socket (:mod:`.direct_write`): for the
    connections :func:`monarch.broker.connections.connect.connect` makes, whose
    runtime publishes from threads.
    """
    fast_headers.install(nc)
    direct_read.install(nc)
    write_through.install(nc)
    if thread_writes:
        direct_write.install(nc)
