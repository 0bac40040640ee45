"""The proc half of moving a proc's output to its owner: stdout, stderr and ``logging`` records.

The owner's half, which prints them, is :mod:`monarch.actors.procs.log_collection`.

:func:`install_forwarding` (called once by
:mod:`monarch.actors.hosting.proc`, right after it connects) replaces ``sys.stdout``
and ``sys.stderr`` with line-buffered writers and puts one handler on the root
logger in place of ``logging.basicConfig``'s stderr handler. Each complete
line, written from any thread, is tagged with the actor whose code wrote it
(:func:`~monarch.actors.calls.context.context`) and queued; queued lines leave within
``FLUSH_DELAY`` seconds, or before anything else this proc sends (the runtime asks,
:attr:`~monarch.core.runtime.Runtime.output_waiting`), in the order they were
written, as messages on ``mon.<ns>.log.<proc-uid>``. So a line an endpoint prints
reaches the client before the call's reply, as a line written to a terminal would
be there before the reply in Monarch::

    Mon-Kind: log   Mon-Stream: stdout|stderr|log   Mon-From: <actor id or proc uid>   Mon-Rank
    body: {"lines": [...], "actor": name, "actor_id": id, "rank": int, "point": "{'gpus': 1/4}",
           "level": levelno (log records only), "proc": proc uid}

(``actor``, ``actor_id``, ``rank`` and ``point`` are ``None`` for lines written
outside any actor). The runtime's close flushes what is left, so lines printed
just before a proc stops are not lost. While a line cannot be published (the
owner asked for ``stream_to_client=False``, the runtime is closed, a publish
failed) it goes to the proc's original stream instead, so nothing vanishes.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import sys
import threading
from typing import Any

from monarch.actors.calls.context import Instance, context
from monarch.actors.messaging import messages as m
from monarch.broker.bodies.codec import dumps
from monarch.broker.vocabulary import headers as hdr
from monarch.broker.vocabulary import subjects
from monarch.core.runtime import Runtime

log = logging.getLogger(__name__)

STREAM = hdr.STREAM
"""Header naming the stream a log message's lines came from: stdout, stderr or log."""

FLUSH_DELAY = 0.05
"""Seconds a proc holds complete lines (unless it sends something else) before publishing
them as one message."""

_BATCH_CHARS = 64 * 1024  # start a new message beyond this many characters of lines
_RECORD_FORMAT = "%(levelname)s %(name)s: %(message)s"
# Loggers of the runtime and its libraries: their records keep MONARCH_LOG_LEVEL's threshold
# whatever level the user picks; ``monarch.actor.<name>`` (Actor.logger) is the user's.
_INTERNAL = ("monarch", "nats", "asyncio")


def _is_internal(name: str) -> bool:
    if name.startswith("monarch.actor."):
        return False
    return any(name == p or name.startswith(p + ".") for p in _INTERNAL)


# -- proc side -------------------------------------------------------------------

_forwarder: _Forwarder | None = None


def install_forwarding(rt: Runtime) -> None:
    """Send this proc's stdout, stderr and log records to its owner over ``rt``; once per process.

    The root logger's level drops to INFO (``LogMode``'s default) unless
    ``MONARCH_LOG_LEVEL`` already set it lower; records of the runtime's own
    loggers still need ``MONARCH_LOG_LEVEL`` (default WARNING) to be shown.
    """
    global _forwarder
    if _forwarder is not None:
        return
    fw = _Forwarder(rt, sys.stdout, sys.stderr)
    root = logging.getLogger()
    internal_level = root.level or logging.WARNING
    for h in list(root.handlers):  # basicConfig's: records would be printed twice
        if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr):
            root.removeHandler(h)
    fw.handler = _ForwardingHandler(fw, internal_level)
    root.addHandler(fw.handler)
    root.setLevel(min(internal_level, logging.INFO))
    sys.stdout = fw.writers["stdout"]
    sys.stderr = fw.writers["stderr"]
    rt.flush_output = fw.flush
    rt.on_close(fw.close)
    _forwarder = fw


def apply_mode(mode: dict[str, Any]) -> None:
    """The owner's ``logging_option`` as it concerns this proc (runs on the loop)."""
    if _forwarder is not None:
        _forwarder.set_mode(bool(mode["stream_to_client"]), int(mode["level"]))


class _Batch:
    """Consecutive lines from one source and stream: one message."""

    __slots__ = ("stream", "source", "level", "lines", "chars")

    def __init__(self, stream: str, source: Instance | None, level: int | None) -> None:
        self.stream, self.source, self.level = stream, source, level
        self.lines: list[str] = []
        self.chars = 0

    def takes(self, stream: str, source: Instance | None, level: int | None, n: int) -> bool:
        return (
            stream == self.stream
            and source is self.source
            and level == self.level
            and self.chars + n <= _BATCH_CHARS
        )


class _Forwarder:
    """Queues lines from any thread; publishes them from the runtime's loop."""

    def __init__(self, rt: Runtime, stdout: Any, stderr: Any) -> None:
        self.rt = rt
        self.subject = subjects.log(rt.namespace, rt.proc_uid)
        self.proc_rank = os.environ.get("MONARCH_RANK", "0")
        self.originals = {"stdout": stdout, "stderr": stderr, "log": stderr}
        self.writers = {s: _LineWriter(self, s) for s in ("stdout", "stderr")}
        self.handler: _ForwardingHandler | None = None
        self.forwarding = True  # False: the owner asked us to keep output local
        self.closed = False
        self.max_line = max(1024, rt.max_payload // 8)  # characters; 4 bytes each at worst
        self._lock = threading.Lock()
        self._batches: list[_Batch] = []
        self._armed = False  # a flush is scheduled or about to be
        self._timer: asyncio.TimerHandle | None = None
        self._flushing = False
        self._reentry = threading.local()

    def active(self) -> bool:
        return self.forwarding and not self.closed

    def add(self, stream: str, lines: list[str], level: int | None = None) -> None:
        """Queue complete lines (without their newlines); any thread."""
        if not lines:
            return
        if getattr(self._reentry, "on", False) or not self.active() or self.rt.loop.is_closed():
            self._write_local(stream, lines)
            return
        self._reentry.on = True
        try:
            inst = context().actor_instance
            source = None if inst.actor_id == "client" else inst
            with self._lock:
                for line in lines:
                    line = line.removesuffix("\r")
                    if len(line) > self.max_line:
                        cut = len(line) - self.max_line
                        line = f"{line[: self.max_line]}... [{cut} more characters]"
                    batch = self._batches[-1] if self._batches else None
                    if batch is None or not batch.takes(stream, source, level, len(line)):
                        batch = _Batch(stream, source, level)
                        self._batches.append(batch)
                    batch.lines.append(line)
                    batch.chars += len(line)
                self.rt.output_waiting = True  # they leave before this proc's next message
                arm, self._armed = not self._armed, True
            if arm:
                self.rt.call_soon(self._arm)
        except RuntimeError:  # the loop closed under us (interpreter exit)
            self._drain_local()
        finally:
            self._reentry.on = False

    def _arm(self) -> None:
        if self._timer is None and not self.closed:
            self._timer = self.rt.loop.call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        """Publish everything queued (loop only)."""
        if self._flushing:  # called again by its own publish (another thread queued more):
            return  # those lines wait for the next flush, so none overtakes the ones sent now
        self._flushing = True
        try:
            self._flush()
        finally:
            self._flushing = False

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            batches, self._batches, self._armed = self._batches, [], False
            self.rt.output_waiting = False
        nc = self.rt.nc
        can_publish = self.forwarding and nc is not None and not nc.is_closed
        for b in batches:
            if not can_publish:
                self._write_local(b.stream, b.lines)
                continue
            src = b.source
            body = {
                "lines": b.lines,
                "actor": src.name if src else None,
                "actor_id": str(src.actor_id) if src else None,  # plain str: no pickle
                "rank": src.rank.rank if src else None,
                "point": repr(src.rank) if src else None,
                "level": b.level,
                "proc": self.rt.proc_uid,
            }
            headers = {
                m.KIND: "log",
                STREAM: b.stream,
                m.FROM: src.actor_id if src else self.rt.proc_uid,
                m.RANK: str(src.rank.rank) if src else self.proc_rank,
            }
            try:
                data = dumps(body)
            except Exception:  # never lose a line to the codec: keep it on the proc
                self._write_local(b.stream, b.lines)
                continue
            self.rt.publish(
                self.subject,
                data,
                headers,
                on_error=lambda _e, b=b: self._write_local(b.stream, b.lines),
            )

    def set_mode(self, forwarding: bool, level: int) -> None:
        self.flush()  # lines queued so far were written under the old mode
        self.forwarding = forwarding
        if self.handler is not None:
            self.handler.user_level = level
            logging.getLogger().setLevel(min(level, self.handler.internal_level))

    def close(self) -> None:
        """A runtime closer: publish partial and queued lines, then write locally from now on."""
        for stream, writer in self.writers.items():
            self.add(stream, writer.take_partials())
        self.flush()
        self.closed = True
        for name, writer in self.writers.items():
            if getattr(sys, name) is writer:
                setattr(sys, name, self.originals[name])

    def _drain_local(self) -> None:
        with self._lock:
            batches, self._batches, self._armed = self._batches, [], False
            self.rt.output_waiting = False
        for b in batches:
            self._write_local(b.stream, b.lines)

    def _write_local(self, stream: str, lines: list[str]) -> None:
        prefix = f"[{self.rt.proc_uid}] " if stream == "log" else ""
        out = self.originals[stream]
        try:
            out.write("".join(f"{prefix}{line}\n" for line in lines))
            out.flush()
        except (OSError, ValueError):  # closed or broken stream: nowhere left to write
            pass


class _LineWriter(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of a proc: hands complete lines to the forwarder.

    A partial line waits, per thread, for its newline (or ``flush()``), so
    prints from different actors' threads never splice into one line.
    """

    def __init__(self, fw: _Forwarder, stream: str) -> None:
        super().__init__()
        self._fw = fw
        self._stream = stream
        self._partial: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._fw.originals[self._stream], "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    @property
    def line_buffering(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fw.originals[self._stream].fileno()

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        tid = threading.get_ident()
        with self._lock:
            lines = (self._partial.pop(tid, "") + s).split("\n")
            rest = lines.pop()
            if len(rest) > self._fw.max_line:
                lines.append(rest)
            elif rest:
                self._partial[tid] = rest
        self._fw.add(self._stream, lines)
        return len(s)

    def flush(self) -> None:
        with self._lock:
            rest = self._partial.pop(threading.get_ident(), "")
        if self._fw.active():
            self._fw.add(self._stream, [rest] if rest else [])
            return
        out = self._fw.originals[self._stream]
        try:
            out.write(rest)
            out.flush()
        except (OSError, ValueError):
            pass

    def take_partials(self) -> list[str]:
        with self._lock:
            rest, self._partial = list(self._partial.values()), {}
        return rest


class _ForwardingHandler(logging.Handler):
    """The root logger's handler in a proc: each record becomes lines of the ``log`` stream."""

    def __init__(self, fw: _Forwarder, internal_level: int) -> None:
        super().__init__()
        self.fw = fw
        self.internal_level = internal_level
        self.user_level = logging.INFO
        self.setFormatter(logging.Formatter(_RECORD_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        if _is_internal(record.name):
            if record.levelno < self.internal_level:
                return
        elif record.levelno < self.user_level:
            return
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.fw.add("log", text.split("\n"), record.levelno)


# -- client side -------------------------------------------------------------------
