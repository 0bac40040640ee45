"""A process's paused debugger sessions, served over its side channel.

Each breakpoint hit in actor code opens a :class:`Session` in the process's
:class:`SessionTable`. The table listens (once the first breakpoint is hit,
never before: a process that never pauses pays nothing) on the process's side
channel, the heartbeat thread's own broker connection
(:class:`~monarch.supervision.heartbeat.Heartbeater`): it answers ``monarch
debug``'s list requests and hands each input line to its session's queue. The
paused thread itself (the actor's thread, or the proc's event loop for an
async endpoint) only waits on that queue, in short bounded waits, so it also
notices the process stopping: then the session continues, as after ``c``.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Coroutine
from typing import Any

from monarch.actors.debugging import protocol as p
from monarch.actors.debugging.remote_pdb import RemotePdb
from monarch.supervision.heartbeat import Heartbeater

log = logging.getLogger(__name__)

POLL = 0.25  # seconds between the paused thread's looks at whether its process is stopping
PLACE_WAIT = 2.0  # seconds to wait for the broker to hold the table's subscriptions


class Session:
    """One paused (or stepping) pdb: what it is, and the lines sent to it."""

    def __init__(self, table: SessionTable, sid: str, info: dict[str, Any]) -> None:
        self.table = table
        self.sid = sid
        self.info = {**info, "session": sid, "state": "running"}
        self.lines: queue.Queue[tuple[str, str, str | None]] = queue.Queue()
        self._reply: str | None = None  # the inbox of the client that sent the last line
        self._owed = False  # that client waits for what the line did
        self._over = False

    def describe(self) -> dict[str, Any]:
        return dict(self.info)

    # -- on the paused thread -------------------------------------------------

    def next_line(self, debugger: RemotePdb) -> str:
        """pdb's next command line; meanwhile answer attaches. Continues if the process stops."""
        frame = debugger.curframe
        if frame is not None:
            code = frame.f_code
            self.info.update(function=code.co_name, file=code.co_filename, line=frame.f_lineno)
        self.info["state"] = "paused"
        if self._owed:  # what the last line did, and: ready for the next one
            self._send(debugger.out.take(), p.PROMPT)
        while True:
            try:
                op, line, reply = self.lines.get(timeout=POLL)
            except queue.Empty:
                if self.table.stopping():
                    debugger.clear_all_breaks()
                    debugger.message("*** the process is stopping: continuing")
                    return "continue\n"
                continue
            self._reply = reply
            if op == p.ATTACH:
                self._send(debugger.out.take() or debugger.where_text(), p.PROMPT)
                continue
            self._owed = True
            self.info["state"] = "running"
            return line.rstrip("\n") + "\n"

    def went_on(self, debugger: RemotePdb, *, ended: bool, how: str = "continued") -> None:
        """pdb continued (``ended``: for good; else it stops again at a breakpoint) or quit."""
        if self._over:
            return
        if self._owed:
            self._send(debugger.out.take(), p.ENDED if ended else p.RUNNING, how)
        self.info["state"] = "running"
        if ended:
            self._over = True
            self.table.close(self)

    def _send(self, text: str, state: str, how: str = "") -> None:
        self._owed = False
        if self._reply:
            body = {"session": self.sid, "out": text, "state": state, "how": how, **self._where()}
            self.table.heartbeater.publish(self._reply, p.encode(body))

    def _where(self) -> dict[str, Any]:
        return {k: self.info.get(k) for k in ("function", "file", "line")}


class SessionTable:
    """The sessions of one process, and its listening for ``monarch debug``."""

    def __init__(self, heartbeater: Heartbeater, namespace: str, proc_uid: str) -> None:
        self.heartbeater = heartbeater
        self.namespace = namespace
        self.proc_uid = proc_uid
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._listening = False

    def open(self, info: dict[str, Any]) -> Session:
        """A new session for a breakpoint just hit (on the thread that hit it)."""
        self._listen()
        with self._lock:
            sid = f"s{next(self._ids)}"
            info = {**info, "proc": self.proc_uid, "host": socket.gethostname(), "pid": os.getpid()}
            session = self._sessions[sid] = Session(self, sid, info)
        return session

    def close(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.sid, None)

    def stopping(self) -> bool:
        return self.heartbeater.stopping

    def _listen(self) -> None:
        with self._lock:
            if self._listening:
                return
            self._listening = True
        heard = [
            _run_now(self.heartbeater.listen(subject, handler))
            for subject, handler in (
                (p.list_subject(self.namespace), self._on_list),
                (p.input_wildcard(self.namespace, self.proc_uid), self._on_input),
            )
        ]
        # A list request sent right after the breakpoint is hit must find this session.
        deadline = time.monotonic() + PLACE_WAIT
        for h in heard:
            try:
                h.in_place().result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # not yet placed: a later list finds it
                log.debug("debugger subscription %s not confirmed in time", h.subject)

    # -- on the heartbeat thread ----------------------------------------------

    def _on_list(self, msg: Any) -> None:
        with self._lock:
            sessions = [s.describe() for s in self._sessions.values()]
        if sessions and msg.reply:
            body = {"proc": self.proc_uid, "sessions": sessions}
            self.heartbeater.publish(msg.reply, p.encode(body))

    def _on_input(self, msg: Any) -> None:
        sid = msg.subject.rsplit(".", 1)[-1]
        body = p.decode(msg.data)
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            if msg.reply:
                gone = {"session": sid, "out": "", "state": p.GONE}
                self.heartbeater.publish(msg.reply, p.encode(gone))
            return
        op = p.ATTACH if body.get("op") == p.ATTACH else p.LINE
        session.lines.put((op, str(body.get("line") or ""), msg.reply))


_tables: weakref.WeakKeyDictionary[Heartbeater, SessionTable] = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def table_for(heartbeater: Heartbeater, namespace: str, proc_uid: str) -> SessionTable:
    """This process's table (one per side channel: a restarted client has a new one)."""
    with _tables_lock:
        table = _tables.get(heartbeater)
        if table is None:
            table = _tables[heartbeater] = SessionTable(heartbeater, namespace, proc_uid)
        return table


def _run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends, here, with or without an event loop on this thread.

    :meth:`Heartbeater.listen` promises not to suspend; the paused thread may
    be the proc's event loop itself (an async endpoint), which cannot be
    awaited from inside.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("Heartbeater.listen suspended")
