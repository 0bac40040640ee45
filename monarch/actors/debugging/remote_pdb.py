"""pdb, with its lines read from and written to a remote ``monarch debug`` instead of a terminal.

:class:`RemotePdb` is the standard library's debugger with three changes:

* its stdin asks the session for the next line (:meth:`Session.next_line
  <monarch.actors.debugging.sessions.Session.next_line>`), which waits,
  bounded, for ``monarch debug`` to send one; its stdout is a buffer the
  session sends back with each answer. No prompt is written: the client
  prints its own ``(Pdb) ``.
* it never stops in the runtime's own frames (monarch's, asyncio's,
  threading's: pdb's ``skip``), and stepping out of the actor's code (``n``
  or ``r`` past the endpoint's end) ends the session, as a ``continue``
  would: stopping there would show the user nothing of theirs, and would
  keep the thread traced until it next ran their code. In an async
  endpoint, ``n`` over an ``await`` stops at the next line, as in pdb.
* the commands that read the process's own stdin (``clear`` without an
  argument asks for confirmation, ``interact`` starts a console) are
  replaced by what works remotely.
"""

from __future__ import annotations

import dis
import inspect
import pdb
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the session module builds on this one
    from monarch.actors.debugging.sessions import Session

# Frames of these modules are the runtime's, not the actor's code: pdb never stops in
# them, and the actor's code returning into one means the endpoint is done.
RUNTIME_MODULES = ["monarch.*", "asyncio", "asyncio.*", "concurrent.futures*", "threading",
                   "contextvars", "nats.*", "msgpack*"]  # fmt: skip
_PREFIXES = tuple(m.rstrip("*") for m in RUNTIME_MODULES)
_YIELD_VALUE = dis.opmap["YIELD_VALUE"]
_GENERATOR_LIKE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def is_runtime(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs the runtime's code (or there is no frame: a thread's start)."""
    if frame is None:
        return True
    name = frame.f_globals.get("__name__") or ""
    return name.startswith(_PREFIXES)


def finishing(frame: FrameType) -> bool:
    """At a return event: the frame ends (rather than a coroutine suspending at an await)."""
    if not frame.f_code.co_flags & _GENERATOR_LIKE:
        return True
    return frame.f_code.co_code[frame.f_lasti] != _YIELD_VALUE


class Output:
    """pdb's stdout: text kept until the session sends it (any thread may write)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        """Everything written since the last take."""
        with self._lock:
            text, self._parts = "".join(self._parts), []
        return text


class _Input:
    """pdb's stdin: each line is the next one ``monarch debug`` sends (never EOF)."""

    def __init__(self, debugger: RemotePdb) -> None:
        self._debugger = debugger

    def readline(self) -> str:
        return self._debugger.session.next_line(self._debugger)


class RemotePdb(pdb.Pdb):
    """A pdb whose console is a :class:`Session` (see the module's docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.out = Output()
        super().__init__(
            stdin=_Input(self),  # type: ignore[arg-type]
            stdout=self.out,  # type: ignore[arg-type]
            skip=RUNTIME_MODULES,
            nosigint=True,
            readrc=False,
        )
        self.use_rawinput = False
        self.prompt = ""  # the client shows "(Pdb) "
        self._how = "continued"  # how the session ends, when it does (said to the client)

    def dispatch_return(self, frame: FrameType, arg: object) -> object:
        trace = super().dispatch_return(frame, arg)
        stepping = not (self.stopframe is self.botframe and self.stoplineno == -1)
        if (stepping and not self.quitting and not is_runtime(frame) and finishing(frame)
                and is_runtime(frame.f_back)):  # fmt: skip
            self._how = "the endpoint returned"
            self.set_continue()  # the actor's code returns to the runtime: the session is over
            return None
        return trace

    def set_continue(self) -> None:
        super().set_continue()
        how, self._how = self._how, "continued"
        self.session.went_on(self, ended=not self.breaks, how=how)

    def set_quit(self) -> None:
        super().set_quit()
        # pdb raises BdbQuit into the endpoint now; its tracer would stay on this
        # (long-lived) thread and slow every later call of the actor.
        sys.settrace(None)
        self.session.went_on(self, ended=True, how="quit: the endpoint raises BdbQuit")

    def where_text(self) -> str:
        """Where it stopped, as pdb shows it on stopping (``> file(line)function()``)."""
        if self.stack and 0 <= self.curindex < len(self.stack):
            self.print_stack_entry(self.stack[self.curindex])
        return self.out.take()

    def do_clear(self, arg: str) -> None:
        """cl(ear) [bpnumber ...]: without an argument, clear every breakpoint (no confirmation:
        pdb's would be read from the process's own stdin)."""
        if arg:
            super().do_clear(arg)
            return
        self.clear_all_breaks()
        self.message("Deleted all breakpoints")

    do_cl = do_clear

    def do_interact(self, arg: str) -> None:
        """interact: not available remotely (it would read the process's own stdin)."""
        self.error("interact is not available in a remote session; use ! statements instead")
