"""The Python each message costs at the NATS connection, per path, on one connection.

    python benchmarks/bench_wire_python.py [--messages 20000] [--repeat 7]

No round trip and no other process's time: one tuned connection (``connect()``,
as every runtime has) to an embedded nats-server, one ordered subscription
(``subscribe_ordered``) and a call-sized message with the headers a call
carries. Per message, in microseconds (median of ``--repeat`` timings of
``--messages`` messages each):

* receive: one whole ``HMSG`` frame, as a socket delivers it, through nats-py's
  parser (its ``parse``, ``_process_msg`` and header coroutines) against
  :func:`monarch.broker.natspy_internals.fast_delivery.deliver_chunk`; both end in the same
  intake (``Msg`` built, handed to the subscription's handler);
* publish: nats-py's ``publish`` coroutine run to its end (as the runtime ran
  it before NOTES 31) against :func:`monarch.broker.natspy_internals.sync_publish.publisher`;
  both queue the same bytes. The queued bytes are thrown away every 1,000
  messages, not sent: only the Python is measured.

With ``MONARCH_NATS_JOB_KEY`` set, publishing includes the job's tag (both
paths). No assertion: figures for benchmarks/NOTES.md (entry 31).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

from monarch.broker.connections.auth import TAG, MessageAuth, auth_of
from monarch.broker.connections.connect import connect
from monarch.broker.connections.server import EmbeddedBroker
from monarch.broker.natspy_internals import sync_publish
from monarch.broker.natspy_internals.fast_delivery import deliver_chunk
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.settings import settings

SUBJECT, REPLY = "mon.bench.port.p-1.0", "_INBOX.r.1"
HEADERS = {"Mon-Kind": "call", "Mon-Endpoint": "ping", "Mon-From": "client-7f3a.0", "Mon-Seq": "17"}
BODY = b"\x93\xa4ping\x91\x11\x80" + b"x" * 24  # about a small call's msgpack body


def _frame(sid: int, auth: MessageAuth | None) -> bytes:
    """The frame nats-server would send for a call (signed where the job has a key)."""
    headers = dict(HEADERS)
    if auth is not None:
        headers[TAG] = auth.tag(SUBJECT, REPLY, headers, BODY)
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    block += b"\r\n"
    size = (len(block), len(block) + len(BODY))
    head = b"HMSG %s %d %s %d %d\r\n" % (SUBJECT.encode(), sid, REPLY.encode(), *size)
    return head + block + BODY + b"\r\n"


def _drive(coro) -> None:  # type: ignore[no-untyped-def]
    try:
        coro.send(None)
    except StopIteration:
        return
    raise RuntimeError("the coroutine waited")


def _per_message_us(
    one: Callable[[], None], n: int, repeat: int, reset: Callable[[], None]
) -> float:
    times = []
    for _ in range(repeat):
        reset()
        t = time.perf_counter()
        for i in range(n):
            one()
            if i % 1000 == 999:
                reset()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


async def main(messages: int, repeat: int) -> None:
    os.environ.setdefault("MONARCH_OPEN_BROKER_OK", "1")  # a loopback broker of its own
    broker = EmbeddedBroker().start()
    nc = await connect(broker.url, settings(), name="bench-wire")
    try:
        got = 0

        def handler(msg) -> None:  # type: ignore[no-untyped-def]
            nonlocal got
            got += 1

        sub = await subscribe_ordered(nc, SUBJECT, handler)
        await nc.flush()
        frame = _frame(sub._id, auth_of(nc))

        def nothing() -> None:
            pass

        nats_py_read = _per_message_us(
            lambda: _drive(nc._ps.parse(frame)), messages, repeat, nothing
        )
        fast_read = _per_message_us(lambda: deliver_chunk(nc, frame), messages, repeat, nothing)
        assert got == 2 * messages * repeat, got  # every frame reached the handler

        def drop_queued() -> None:
            nc._pending, nc._pending_data_size = [], 0

        plain = sync_publish.publisher(nc)
        assert plain is not None
        through = nc._monarch_write_through
        through.turn_end_due = True  # as after a turn's first write: later ones only queue

        def nats_py_publish() -> None:
            _drive(nc.publish(SUBJECT, BODY, reply=REPLY, headers=HEADERS))

        def plain_publish() -> None:
            if not plain(SUBJECT, BODY, REPLY, HEADERS):
                raise RuntimeError("the plain publish declined")

        nats_py_pub = _per_message_us(nats_py_publish, messages, repeat, drop_queued)
        plain_pub = _per_message_us(plain_publish, messages, repeat, drop_queued)
        drop_queued()
        through.turn_end_due = False
    finally:
        await nc.close()
        broker.stop()
    print(f"per message, us (median of {repeat} x {messages:,}); frame {len(frame)} bytes")
    print(f"receive  nats-py parser {nats_py_read:6.2f}   fast_delivery {fast_read:6.2f}")
    print(f"publish  nats-py        {nats_py_pub:6.2f}   sync_publish  {plain_pub:6.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    asyncio.run(main(args.messages, args.repeat))
