"""Packing and publishing a process's telemetry off its event loop, on a connection of its own.

The runtime's loop carries every reply of the process; a flush done there
(draining a second of spans, counting the endpoints' metrics, packing, and
writing a few hundred kilobytes to the broker) stood ahead of the replies that
came meanwhile, on the same socket: milliseconds of tail latency at every
interval (benchmarks/NOTES.md 45). Here a thread of its own, with a private
event loop and broker connection (nats-py's client is not thread-safe), does
all of it. The hooks on the message path only append to the recorder's
queues; the thread wakes every interval, or sooner when the recorder says a
batch waits, and flushes.

Packing is cut in chunks (:data:`monarch.telemetry.recorder.CHUNK` spans)
with the GIL let go between them, so a busy loop thread waits at most one
chunk's packing, not a whole flush's, for its turn.

Made only while telemetry is on; :meth:`Flusher.stop` does the last flush
(what the process recorded up to its end) and waits for the broker to have it
before the process's main connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from monarch.broker.vocabulary import headers as hdr
from monarch.telemetry.recorder import Recorder

log = logging.getLogger(__name__)


class Flusher:
    """Flushes ``rec`` every ``interval`` seconds from a thread, to ``subject`` on its own connection.

    ``connect`` makes the thread's connection (called on the thread's loop; again
    at the next interval after a failure, the batches meanwhile dropped with a
    warning: telemetry never fails the job).
    """

    def __init__(
        self,
        rec: Recorder,
        subject: str,
        interval: float,
        connect: Callable[[], Awaitable[Any]],
        name: str = "monarch-telemetry",
    ) -> None:
        self.rec = rec
        self.subject = subject
        self.interval = interval
        self._connect = connect
        self._out: list[tuple[bytes, dict[str, str]]] = []  # packed by a flush, to publish
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.dropped = 0  # records packed but not published (no connection)
        self.cpu_s = 0.0  # CPU seconds of this thread's flushes and publishes (benchmarks)
        rec.set_output(self._take, self.wake)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)  # its loop exists (wake() needs it); connecting goes on there

    def _take(self, payload: bytes, headers: dict[str, str]) -> None:
        self._out.append((payload, headers))  # published by _publish, right after the flush

    def wake(self) -> None:
        """From any thread: flush soon (a batch's worth waits)."""
        loop, ev = self._loop, self._wake
        if loop is None or ev is None:
            return
        try:
            loop.call_soon_threadsafe(ev.set)
        except RuntimeError:  # its loop has just ended
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """The last flush, published and confirmed by the broker; then the thread ends.

        Blocking (run it in an executor from a loop): it returns once the thread has
        ended or ``timeout`` has passed.
        """
        self._stopping = True
        self.wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("telemetry's last flush did not finish in %.0f s", timeout)

    # -- on the thread --------------------------------------------------------

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run(loop))
        except Exception:
            log.exception("the telemetry thread failed")
        finally:
            self._ready.set()
            loop.close()

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._wake = asyncio.Event()
        self._loop = loop
        self._ready.set()
        nc: Any = None
        try:
            while True:
                if nc is None or nc.is_closed:
                    nc = await self._try_connect()
                stopping = self._stopping
                cpu = time.thread_time()
                try:
                    self.rec.flush()
                except Exception:
                    log.exception("a telemetry flush failed")
                await self._publish(nc)
                self.cpu_s += time.thread_time() - cpu
                if stopping:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), self.interval)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()
            if nc is not None:
                await asyncio.wait_for(nc.flush(timeout=2), 3)
        except Exception as e:
            log.warning("telemetry's last batches may not have reached the broker: %r", e)
        finally:
            self._loop = None
            if nc is not None:
                try:
                    await asyncio.wait_for(nc.close(), 2.0)
                except BaseException:
                    pass

    async def _try_connect(self) -> Any:
        try:
            return await self._connect()
        except Exception as e:
            log.warning("telemetry could not connect to the broker: %r", e)
            return None

    async def _publish(self, nc: Any) -> None:
        out = self._out[:]  # filled by the flush just done, on this thread
        del self._out[: len(out)]
        for payload, headers in out:
            if nc is None:
                self.dropped += int(headers.get(hdr.COUNT, "0") or 0)
                continue
            try:
                await nc.publish(self.subject, payload, headers=headers)
            except Exception as e:  # telemetry never fails the job
                log.warning("could not publish a telemetry batch: %r", e)
