"""What the broker sends is parsed in the socket's callback, in order, through every fault.

Each test runs a real nats-server. The checks that matter for a user: every
message arrives once and in wire order (across subjects, TCP reads and large
messages), a parse that has to wait does not reorder or lose what arrives
behind it, and a lost server or a broken byte stream ends in a reconnect that
reads directly again, never in a connection that hears nothing.
"""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client

from monarch.broker.connections.connect import connect
from monarch.broker.connections.server import EmbeddedBroker, free_port
from monarch.broker.natspy_internals import direct_read
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.settings import settings
from tests.helpers import ForwardingProxy, run_in_own_loop, until


def _reader_task_parked(nc: Client) -> bool:
    waiter = nc._transport._io_reader._waiter
    return waiter is not None and not waiter.done()


def test_a_message_reaches_its_handler_in_the_callback_that_brought_it(nats_url, monkeypatch):
    """No task runs the handler (it is the socket's callback); without direct reading, one does."""

    async def handler_tasks(direct: bool) -> list[object]:
        receiver = await nats.connect(nats_url)
        sender = await nats.connect(nats_url)
        tasks: list[object] = []
        try:
            await subscribe_ordered(
                receiver, "direct.where", lambda m: tasks.append(asyncio.current_task())
            )
            await receiver.flush()
            for i in range(20):
                await sender.publish("direct.where", b"%d" % i)
            await until(lambda: len(tasks) == 20, "20 messages")
            if direct:
                assert receiver._monarch_direct_read.reader is receiver._transport._io_reader
                assert not receiver._transport._io_reader._buffer  # nothing left for nats-py
                assert _reader_task_parked(receiver)  # nats-py's task still waits for EOF
        finally:
            await sender.close()
            await receiver.close()
        return tasks

    assert set(run_in_own_loop(handler_tasks(direct=True))) == {None}
    monkeypatch.setenv("MONARCH_DIRECT_READ", "0")
    settings.cache_clear()
    try:
        (task,) = set(run_in_own_loop(handler_tasks(direct=False)))
    finally:
        monkeypatch.undo()
        settings.cache_clear()
    assert isinstance(task, asyncio.Task)  # nats-py's reader task


def test_order_holds_across_subjects_reads_and_large_messages(nats_url):
    async def main() -> dict[str, list[int]]:
        receiver = await connect(nats_url, settings(), name="direct-order")
        sender = await nats.connect(nats_url)
        got: dict[str, list[int]] = {"a": [], "b": [], "all": []}
        try:
            for name in ("a", "b"):

                def handler(msg, name=name):  # type: ignore[no-untyped-def]
                    n = int(msg.data[:8])
                    assert len(msg.data) == 8 + (200_000 if n % 97 == 0 else n % 300)
                    got[name].append(n)
                    got["all"].append(n)

                await subscribe_ordered(receiver, f"direct.order.{name}", handler)
            await receiver.flush()
            for n in range(3000):  # every 97th message is 200 kB: many TCP reads
                body = b"%08d" % n + b"x" * (200_000 if n % 97 == 0 else n % 300)
                await sender.publish(f"direct.order.{'ab'[n % 2]}", body)
            await until(lambda: len(got["all"]) == 3000, "3000 messages")
            assert receiver._monarch_direct_read.reader is receiver._transport._io_reader
        finally:
            await sender.close()
            await receiver.close()
        return got

    got = run_in_own_loop(main())
    assert got["all"] == list(range(3000))  # one connection, one order, as sent
    assert got["a"] == list(range(0, 3000, 2)) and got["b"] == list(range(1, 3000, 2))


def test_a_parse_that_waits_loses_and_reorders_nothing(nats_url, monkeypatch):
    """A slow nats-py subscription makes the parser await the error callback mid-chunk.

    What arrives meanwhile queues behind that parse (and pauses the socket past
    the limit, lowered here); once the callback returns everything is handled
    in order, and the next message is parsed directly again.
    """
    monkeypatch.setattr(direct_read, "PAUSE_READING_AT", 4096)

    async def main() -> tuple[list[int], int, int, int, bool]:
        waited: list[bool] = []
        paused: list[bool] = []

        async def error_cb(e: Exception) -> None:  # the parse waits here
            await asyncio.sleep(0.05)  # meanwhile the sender goes on: bytes queue, reading stops
            waited.append(nc._monarch_direct_read.parsing is not None)
            paused.append(not nc._transport._io_writer.transport.is_reading())

        nc = await nats.connect(nats_url, error_cb=error_cb)
        sender = await nats.connect(nats_url)
        got: list[int] = []
        try:
            assert direct_read.install(nc)
            await until(lambda: nc._monarch_direct_read.reader is not None, "reader taken")

            async def slow(msg):  # type: ignore[no-untyped-def]
                await asyncio.sleep(1)

            await nc.subscribe("direct.slow", cb=slow, pending_msgs_limit=1)
            await subscribe_ordered(nc, "direct.fast", lambda m: got.append(int(m.data[:8])))
            await nc.flush()
            for n in range(2000):
                if n % 100 == 0:  # overflow the slow one: an error callback, a wait
                    for _ in range(3):
                        await sender.publish("direct.slow", b"")
                await sender.publish("direct.fast", b"%08d" % n + b"y" * 64)
            await sender.flush()
            direct = nc._monarch_direct_read
            await until(lambda: len(got) == 2000 and direct.parsing is None, "all 2000")
            await sender.publish("direct.fast", b"%08d" % 2000)
            await until(lambda: len(got) == 2001, "one more")
            return (
                got,
                len(waited),
                sum(waited),
                sum(paused),
                not nc._transport._io_writer.transport.is_reading(),
            )
        finally:
            await sender.close()
            await nc.close()

    got, callbacks, waited_in_task, paused, paused_at_end = run_in_own_loop(main())
    assert got == list(range(2001))
    assert callbacks > 0 and waited_in_task == callbacks  # each wait was finished by a task
    assert paused > 0 and not paused_at_end  # reading stopped while it waited, and resumed


def test_reading_is_taken_over_again_after_the_broker_comes_back():
    port = free_port()
    broker = EmbeddedBroker(port=port).start()

    async def main() -> tuple[list[bytes], int]:
        reconnects = []

        async def reconnected() -> None:
            reconnects.append(1)

        nc = await connect(
            broker.url, settings(), name="direct-reconnect", reconnected_cb=reconnected
        )
        got: list[bytes] = []
        tasks: set[object] = set()
        try:
            first_reader = nc._transport._io_reader

            def handler(msg):  # type: ignore[no-untyped-def]
                got.append(msg.data)
                tasks.add(asyncio.current_task())

            await subscribe_ordered(nc, "direct.again", handler)
            await nc.publish("direct.again", b"before")
            await until(lambda: got == [b"before"], "a message before")
            await asyncio.get_running_loop().run_in_executor(None, broker.stop)
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await until(lambda: reconnects, "a reconnect")
            await nc.publish("direct.again", b"after")
            await until(lambda: got == [b"before", b"after"], "a message after")
            assert nc._transport._io_reader is not first_reader
            assert nc._monarch_direct_read.reader is nc._transport._io_reader
            assert tasks == {None}
            # The dead socket's reader, should it still get bytes, feeds nothing in:
            # the new connection's parser (and the same subscription id) never sees them.
            sid = next(iter(nc._subs))
            first_reader.feed_data(b"MSG direct.again %d 5\r\nstale\r\n" % sid)
            await nc.publish("direct.again", b"last")
            await until(lambda: got[-1] == b"last", "the last message")
            return got, len(reconnects)
        finally:
            await nc.close()

    try:
        got, reconnects = run_in_own_loop(main())
    finally:
        broker.stop()
    assert got == [b"before", b"after", b"last"] and reconnects == 1


def _garbling(garble: asyncio.Event):  # type: ignore[no-untyped-def]
    """A proxy's ``to_client``: once ``garble`` is set, the next bytes the client gets
    are bytes no NATS server sends, in the middle of the stream (what a broken or
    hostile hop would do)."""

    async def inject(data: bytes, dst: asyncio.StreamWriter) -> None:
        if garble.is_set():
            garble.clear()
            data = b"NOT-NATS AT ALL\r\n" + data
        dst.write(data)
        await dst.drain()

    return inject


def test_bytes_that_break_the_protocol_end_in_a_reconnect_not_a_deaf_connection(nats_url):
    upstream = int(nats_url.rsplit(":", 1)[1])
    token = nats_url.split("//", 1)[1].split("@", 1)[0] if "@" in nats_url else None

    async def main() -> tuple[list[bytes], int]:
        garble = asyncio.Event()
        reconnects = []

        async def reconnected() -> None:
            reconnects.append(1)

        async with ForwardingProxy(upstream, _garbling(garble)) as proxy:
            url = f"nats://{token + '@' if token else ''}127.0.0.1:{proxy.port}"
            nc = await connect(url, settings(), name="direct-garbled", reconnected_cb=reconnected)
            got: list[bytes] = []
            try:
                await subscribe_ordered(nc, "direct.garbled", lambda m: got.append(m.data))
                await until(lambda: nc._monarch_direct_read.reader is not None, "reader taken")
                garble.set()
                await nc.publish("direct.garbled", b"lost with the broken stream, or not")
                await until(lambda: reconnects, "a reconnect after the garbage")
                await nc.publish("direct.garbled", b"after")
                await until(lambda: got and got[-1] == b"after", "a message after the reconnect")
                assert nc._monarch_direct_read.reader is nc._transport._io_reader
                return got, len(reconnects)
            finally:
                await nc.close()

    got, reconnects = run_in_own_loop(main())
    assert reconnects == 1 and got[-1] == b"after"
