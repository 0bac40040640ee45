"""A message is written within its publish; bursts, back-pressure and restarts lose nothing.

Each test runs a real nats-server and checks what a user relies on: every
message arrives once and in the order it was published, whichever of the
two writers (ours within the publish, nats-py's flusher) sent it.
"""

from __future__ import annotations

import asyncio
import os
import signal

import nats
from nats.aio.client import Client

from monarch.broker.connections.connect import connect
from monarch.broker.connections.server import EmbeddedBroker, free_port
from monarch.broker.natspy_internals import write_through
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.settings import settings
from tests.helpers import run_in_own_loop, until

TIMEOUT = 10.0


def _publish_here(nc: Client, subject: str, body: bytes) -> None:
    """Run nats-py's publish to its end without yielding to the loop (as the runtime does)."""
    coro = nc.publish(subject, body)
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("publish waited")


def test_the_first_message_of_a_turn_leaves_at_once_the_rest_at_the_next_turn(
    nats_url, monkeypatch
):
    async def burst() -> tuple[list[int], list[bytes]]:
        nc = await nats.connect(nats_url)
        got: list[bytes] = []
        queued: list[int] = []  # bytes objects nats-py holds after each publish, then a turn
        try:
            write_through.install(nc)
            await subscribe_ordered(nc, "through.burst", lambda m: got.append(m.data))
            await nc.flush()
            for n in range(5):  # one loop turn: nothing else runs in between
                _publish_here(nc, "through.burst", b"%d" % n)
                queued.append(len(nc._pending))
            await asyncio.sleep(0)  # one turn of the loop
            queued.append(len(nc._pending))
            await until(lambda: len(got) == 5, "5 messages")
        finally:
            await nc.close()
        return queued, got

    queued, got = run_in_own_loop(burst())
    assert queued == [0, 1, 2, 3, 4, 0]  # the first went within its publish, the rest a turn on
    assert got == [b"0", b"1", b"2", b"3", b"4"]

    monkeypatch.setenv("MONARCH_WRITE_THROUGH", "0")
    settings.cache_clear()
    try:
        queued, got = run_in_own_loop(burst())
    finally:
        monkeypatch.undo()
        settings.cache_clear()
    assert queued == [1, 2, 3, 4, 5, 0]  # nats-py's flusher writes them all on its turn
    assert got == [b"0", b"1", b"2", b"3", b"4"]


def test_a_broker_that_stops_reading_gets_nats_py_back_pressure_and_loses_nothing(monkeypatch):
    """A broker frozen mid-flood (SIGSTOP): the socket fills, the transport's backlog passes
    the limit and nats-py's buffer overflows, so nats-py's flusher and its forced flush take
    over (publish waits); once the broker runs again every message arrives in order."""
    fallbacks: list[bool] = []
    original = Client._flush_pending

    async def counted(self, force_flush=False):  # type: ignore[no-untyped-def]
        fallbacks.append(force_flush)
        return await original(self, force_flush)

    monkeypatch.setattr(Client, "_flush_pending", counted)
    broker = EmbeddedBroker().start()

    async def main() -> tuple[list[int], list[bool]]:
        receiver = await connect(broker.url, settings(), name="through-receiver")
        sender = await connect(broker.url, settings(), name="through-sender")
        got: list[int] = []
        try:
            assert sender._monarch_write_through is not None
            await subscribe_ordered(receiver, "through.flood", lambda m: got.append(int(m.data[:8])))
            await receiver.flush()
            filler = b"z" * 100_000

            async def flood() -> None:
                # 30 MB, 1 MB per loop turn: far more than the socket buffers take in
                # while the broker does not read (they grow only as it reads)
                for n in range(300):
                    await sender.publish("through.flood", b"%08d" % n + filler)
                    if n % 10 == 9:
                        await asyncio.sleep(0)

            os.kill(broker.pid, signal.SIGSTOP)
            try:
                flooding = asyncio.ensure_future(flood())
                await asyncio.sleep(1.0)  # the publishes stop where nats-py makes them wait
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            await asyncio.wait_for(flooding, TIMEOUT)
            await until(lambda: len(got) == 300, "300 messages of 100 kB")
            assert not sender._pending and not sender._pending_data_size
            return got, list(fallbacks)  # before close(), which calls it too
        finally:
            await sender.close()
            await receiver.close()

    try:
        got, fell_back = run_in_own_loop(main())
    finally:
        broker.stop()
    assert got == list(range(300))
    assert False in fell_back  # the transport's backlog passed the limit: nats-py's flusher
    assert True in fell_back  # and nats-py's own buffer filled: its forced flush


def test_messages_published_while_the_broker_is_down_leave_after_it_is_back_in_order():
    port = free_port()
    broker = EmbeddedBroker(port=port).start()

    async def main() -> list[bytes]:
        back = asyncio.Event()

        async def reconnected() -> None:
            back.set()

        async def disconnected() -> None:
            pass

        nc = await connect(
            broker.url,
            settings(),
            name="through-restart",
            reconnected_cb=reconnected,
            disconnected_cb=disconnected,
        )
        got: list[bytes] = []
        try:
            await subscribe_ordered(nc, "through.restart", lambda m: got.append(m.data))
            await nc.publish("through.restart", b"before")
            await until(lambda: got == [b"before"], "a message before")
            await asyncio.get_running_loop().run_in_executor(None, broker.stop)
            await until(lambda: not nc.is_connected, "the connection notices")
            for n in range(3):  # nats-py keeps these for the reconnect
                await nc.publish("through.restart", b"while down %d" % n)
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await asyncio.wait_for(back.wait(), TIMEOUT)
            await nc.publish("through.restart", b"after")
            await until(lambda: len(got) == 5, "all 5 messages")
            return got
        finally:
            await nc.close()

    try:
        got = run_in_own_loop(main())
    finally:
        broker.stop()
    assert got == [b"before", b"while down 0", b"while down 1", b"while down 2", b"after"]
