"""Threads write their messages to the broker's socket themselves; nothing is reordered or torn.

Each test runs a real nats-server and a connection on its own uvloop thread,
as a client's runtime has it, with plain threads publishing beside the loop.
A thread's message goes directly (:mod:`monarch.broker.natspy_internals.direct_write`) or,
when something waits to be written, through the loop; either way every
message must arrive whole, once, and after the ones its thread sent before.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from monarch.broker.connections.connect import connect
from monarch.broker.connections.server import EmbeddedBroker, free_port
from monarch.broker.natspy_internals import direct_write
from monarch.broker.natspy_internals.inline import run_inline
from monarch.broker.natspy_internals.intake import subscribe_ordered
from monarch.core.runtime import new_event_loop
from monarch.settings import settings
from tests.helpers import wait_until

TIMEOUT = 30.0


class Sender:
    """A connection on a loop thread, with an outbox like the runtime's: a thread's message
    goes directly when nothing waits, else into the inbox that the loop drains in order."""

    def __init__(self, url: str) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.back = threading.Event()
        self.nc: Any = self.run(self._connect(url))
        self.direct = self.nc._monarch_direct_write
        self.inbox: collections.deque = collections.deque()
        self.draining = False
        self.handed = 0  # messages that went through the loop
        self.errors: list[BaseException] = []

    async def _connect(self, url: str) -> Any:
        async def reconnected() -> None:
            self.back.set()

        async def disconnected() -> None:
            self.back.clear()

        return await connect(
            url,
            settings(),
            name="direct-write-test",
            reconnected_cb=reconnected,
            disconnected_cb=disconnected,
        )

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def quiet(self) -> bool:
        return not self.inbox and not self.draining

    def publish(self, subject: str, body: bytes) -> None:
        """From any thread but the loop's."""
        if self.direct.try_write(subject, body, "", None, self.quiet):
            return
        self.handed += 1
        self.inbox.append((subject, body))
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.draining = True
        try:
            while self.inbox:
                subject, body = self.inbox.popleft()
                # as the runtime publishes: to its end here, or (a full buffer) in a task
                # once its bytes are queued
                run_inline(self.nc.publish(subject, body), self.loop, self.errors.append)
        finally:
            self.draining = False

    def close(self) -> None:
        try:
            self.run(self.nc.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT)


class Receiver:
    """Every message on a subject, in arrival order."""

    def __init__(self, url: str, subject: str) -> None:
        self.got: list[bytes] = []
        self.sender = Sender(url)
        self.sender.run(self._subscribe(subject))

    async def _subscribe(self, subject: str) -> None:
        await subscribe_ordered(self.sender.nc, subject, lambda m: self.got.append(bytes(m.data)))
        await self.sender.nc.flush()

    def close(self) -> None:
        self.sender.close()


def _in_threads(count: int, fn: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=fn, args=(t,)) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 2)
        assert not t.is_alive()


def _in_order_per_thread(got: list[bytes], threads: int, each: int) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = collections.defaultdict(list)
    for data in got:
        tid, n = data.split(b" ")[:2]
        seen[int(tid)].append(int(n))
    return {t: seen[t] for t in range(threads)}


def test_threads_racing_the_loop_keep_each_threads_order_and_lose_nothing(nats_url):
    threads, each = 4, 3_000
    receiver = Receiver(nats_url, "direct.race")
    sender = Sender(nats_url)
    try:
        assert sender.direct is not None

        async def loop_traffic() -> None:  # the loop writes its own messages meanwhile
            for n in range(each):
                await sender.nc.publish("direct.race", b"%d %d" % (threads, n))
                if n % 50 == 0:
                    await asyncio.sleep(0)

        def thread_traffic(tid: int) -> None:
            for n in range(each):
                sender.publish("direct.race", b"%d %d" % (tid, n))
                if n % 100 == 99:
                    time.sleep(0.002)  # now and then the loop catches up: direct writes again

        on_loop = asyncio.run_coroutine_threadsafe(loop_traffic(), sender.loop)
        _in_threads(threads, thread_traffic)
        on_loop.result(TIMEOUT)
        total = (threads + 1) * each
        assert wait_until(lambda: len(receiver.got) >= total, timeout=TIMEOUT), len(receiver.got)
        per_thread = _in_order_per_thread(receiver.got, threads + 1, each)
        for tid, numbers in per_thread.items():
            assert numbers == list(range(each)), f"thread {tid} out of order or incomplete"
        assert len(receiver.got) == total
        # both ways were taken, so the order held across them
        assert sender.direct.writes > 0 and sender.handed > 0, (sender.direct.writes, sender.handed)
    finally:
        sender.close()
        receiver.close()


@pytest.mark.alone  # a partial write needs the kernel's socket memory to itself (it saw none beside other tests)
def test_a_socket_that_fills_takes_the_rest_of_a_write_through_the_loop_first():
    """A broker frozen (SIGSTOP) while a thread writes 100 kB messages and the loop 1 kB
    ones: the socket fills, a direct write goes in part, and its rest leaves before anything
    else; the broker runs again while both still write. Every message arrives whole, once,
    and in its writer's order (a torn frame would break the connection)."""
    broker = EmbeddedBroker().start()
    receiver = Receiver(broker.url, "direct.full")
    sender = Sender(broker.url)
    each, pad = 400, 100_003
    partial_writes = []
    real_write = os.write
    resumed = threading.Event()

    def counting_write(fd: int, data: bytes) -> int:
        n = real_write(fd, data)
        if n < len(data):
            partial_writes.append(n)
        return n

    def message(source: int, n: int) -> bytes:
        head = b"%d %d " % (source, n)
        return head + bytes([48 + n % 10]) * ((pad if source == 0 else 1_001) - len(head))

    async def loop_traffic() -> None:
        for n in range(each):
            await sender.nc.publish("direct.full", message(1, n))
            await asyncio.sleep(0.001)

    def thread_traffic() -> None:
        for n in range(each):
            sender.publish("direct.full", message(0, n))
            if n == each // 2:  # the second half while the broker reads again
                resumed.wait(TIMEOUT)
            time.sleep(0.001)  # the loop drains its inbox meanwhile: direct writes again

    try:
        direct_write.os.write = counting_write  # type: ignore[attr-defined]
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            on_loop = asyncio.run_coroutine_threadsafe(loop_traffic(), sender.loop)
            writer = threading.Thread(target=thread_traffic)
            writer.start()
            # 20 MB before the wait: more than the socket buffers hold while the broker sleeps
            assert wait_until(lambda: bool(partial_writes), timeout=TIMEOUT), "socket never filled"
        finally:
            os.kill(broker.pid, signal.SIGCONT)
            resumed.set()
        writer.join(TIMEOUT * 2)
        on_loop.result(TIMEOUT * 2)
        total = 2 * each
        got = receiver.got
        assert wait_until(lambda: len(got) >= total, timeout=TIMEOUT * 2), len(got)
        assert len(got) == total
        for data in receiver.got:
            source, n, _ = data.split(b" ", 2)
            assert data == message(int(source), int(n)), data[:40]
        per_source = _in_order_per_thread(receiver.got, 2, each)
        assert per_source == {0: list(range(each)), 1: list(range(each))}
        assert sender.nc.stats["reconnects"] == 0  # nothing the broker could not parse
    finally:
        direct_write.os.write = real_write  # type: ignore[attr-defined]
        sender.close()
        receiver.close()
        broker.stop()


def test_the_loop_writes_the_rest_of_a_partial_write_before_its_own_next_message():
    """A direct write of 8 MB into the socket of a frozen broker goes in part; the loop, busy
    at that moment, then publishes a message of its own before the rest's own callback runs.
    The rest must leave first (else the broker reads a torn frame): both messages arrive."""
    broker = EmbeddedBroker(max_payload=16 * 1024 * 1024).start()
    receiver = Receiver(broker.url, "direct.rest")
    sender = Sender(broker.url)
    big = b"0 " + b"b" * (8 * 1024 * 1024)
    wrote = threading.Event()
    outcome: list[bool] = []

    def write_big() -> None:
        outcome.append(sender.direct.try_write("direct.rest", big, "", None, lambda: True))
        wrote.set()

    def on_loop() -> None:
        # The loop is held here while the thread writes, so the rest's callback waits behind
        # this one; then the loop's own message is written before that callback could run.
        threading.Thread(target=write_big).start()
        assert wrote.wait(TIMEOUT)
        run_inline(sender.nc.publish("direct.rest", b"1 after"), sender.loop, sender.errors.append)

    try:
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            sender.loop.call_soon_threadsafe(on_loop)
            assert wrote.wait(TIMEOUT) and outcome == [True]
            assert wait_until(lambda: sender.direct._rest is None, timeout=TIMEOUT)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert wait_until(lambda: len(receiver.got) >= 2, timeout=TIMEOUT), len(receiver.got)
        assert receiver.got == [big, b"1 after"]
        assert sender.nc.stats["reconnects"] == 0 and sender.errors == []
    finally:
        sender.close()
        receiver.close()
        broker.stop()


def test_after_a_broker_restart_the_new_socket_is_taken_over_and_the_old_one_let_go():
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    receiver = Receiver(broker.url, "direct.restart")
    sender = Sender(broker.url)
    try:
        sender.publish("direct.restart", b"0 0")
        assert sender.direct.writes == 1
        assert wait_until(lambda: receiver.got == [b"0 0"], timeout=TIMEOUT)
        old_fd = sender.direct._fd
        old_socket = os.fstat(old_fd).st_ino
        broker.stop()
        assert wait_until(lambda: not sender.nc.is_connected, timeout=TIMEOUT)
        # nothing is written directly to a connection that is down
        assert not sender.direct.try_write("direct.restart", b"x", "", None, lambda: True)
        broker.start()
        assert sender.back.wait(TIMEOUT) and receiver.sender.back.wait(TIMEOUT)
        receiver.sender.run(receiver.sender.nc.flush())
        sent = 1

        def published_directly() -> bool:
            nonlocal sent
            sender.publish("direct.restart", b"0 %d" % sent)
            sent += 1
            return sender.direct.writes > 1

        assert wait_until(published_directly, timeout=TIMEOUT), "no direct write after reconnect"
        assert wait_until(lambda: len(receiver.got) >= sent, timeout=TIMEOUT), receiver.got
        assert [int(d.split()[1]) for d in receiver.got] == list(range(sent))
        # our descriptor of the dead socket was closed (its number may hold another file now)
        try:
            still = os.fstat(old_fd).st_ino == old_socket
        except OSError:
            still = False
        assert not still and sender.direct._fd != -1
    finally:
        sender.close()
        receiver.close()
        broker.stop()
    assert sender.direct._fd == -1  # closing the connection lets go of ours too


def test_turned_off_every_message_goes_through_the_loop(nats_url, monkeypatch):
    monkeypatch.setenv("MONARCH_DIRECT_WRITE", "0")
    settings.cache_clear()
    try:
        loop = new_event_loop()
        try:
            nc = loop.run_until_complete(connect(nats_url, settings(), name="direct-off"))
            assert getattr(nc, "_monarch_direct_write", None) is None
            loop.run_until_complete(nc.close())
        finally:
            loop.close()
    finally:
        monkeypatch.undo()
        settings.cache_clear()
