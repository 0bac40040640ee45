"""pdb, with its lines read from and written to a remote ``monarch debug`` instead of a terminal.

:class:`RemotePdb` is the standard library's debugger with three changes:

* its stdin asks the session for the next line (:meth:`Session.next_line
  <monarch.actors.debugging.sessions.Session.next_line>`), which waits,
  bounded, for ``monarch debug`` to send one; its stdout is a buffer the
  session sends back with each answer. No prompt is written: the client
  prints its own ``(Pdb) ``.
* stepping out of the actor's code (``n`` or ``r`` past the endpoint's end,
  into monarch's or asyncio's frames) ends the session, as a ``continue``
  would: stopping in the runtime's own frames would show the user nothing
  of theirs, and would keep the thread traced until it next ran their code.
* the commands that read the process's own stdin (``clear`` without an
  argument asks for confirmation, ``interact`` starts a console) are
  replaced by what works remotely.
"""

from __future__ import annotations

import pdb
import threading
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the session module builds on this one
    from monarch.actors.debugging.sessions import Session

# Frames of these modules are the runtime's, not the actor's code: stepping into
# one means the endpoint has returned (or an await handed the loop back).
_INTERNAL = ("monarch.", "asyncio.", "concurrent.futures", "threading", "contextvars")


def is_internal(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return name.startswith(_INTERNAL) or name in ("threading", "contextvars", "asyncio")


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
        super().__init__(stdin=_Input(self), stdout=self.out, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.use_rawinput = False
        self.prompt = ""  # the client shows "(Pdb) "

    def stop_here(self, frame: FrameType) -> bool:
        if not super().stop_here(frame):
            return False
        if is_internal(frame):
            self.set_continue()
            return False
        return True

    def set_continue(self) -> None:
        super().set_continue()
        self.session.went_on(self, ended=not self.breaks)

    def set_quit(self) -> None:
        super().set_quit()
        self.session.went_on(self, ended=True)

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
