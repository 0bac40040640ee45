"""``breakpoint()`` and ``pdb.set_trace()``: remote in actor code, the usual pdb elsewhere.

:func:`install` replaces ``sys.breakpointhook`` and ``pdb.set_trace`` once per
process. Nothing else changes: code that never calls them pays nothing, and
the check they make (is an actor's code running?) is one context-variable read.
"""

from __future__ import annotations

import os
import pdb
import sys
from types import FrameType
from typing import Any

from monarch.actors.calls.context import Context, actor_context
from monarch.actors.process_state import actor_process
from monarch.core.process_runtime import current_runtime_or_none

_installed = False


def install() -> None:
    """Route breakpoints in actor code of this process to ``monarch debug`` (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.breakpointhook

    def breakpointhook(*args: Any, **kwargs: Any) -> Any:
        ctx = actor_context()
        if os.environ.get("PYTHONBREAKPOINT") == "0":
            return None
        if ctx is None:
            custom = os.environ.get("PYTHONBREAKPOINT") not in (None, "", "pdb.set_trace")
            if previous is not sys.__breakpointhook__ or custom:
                return previous(*args, **kwargs)  # someone else's hook: theirs to run
            return _local(sys._getframe(1), kwargs.get("header"))
        return pause(ctx, sys._getframe(1), kwargs.get("header"))

    def set_trace(*, header: str | None = None) -> None:
        """pdb.set_trace(): remote inside an actor's code (see monarch.actors.debugging)."""
        ctx = actor_context()
        if ctx is None:
            _local(sys._getframe(1), header)
        else:
            pause(ctx, sys._getframe(1), header)

    sys.breakpointhook = breakpointhook
    pdb.set_trace = set_trace


def _local(frame: FrameType, header: str | None) -> None:
    """What ``pdb.set_trace()`` does: a console on this process's own terminal."""
    debugger = pdb.Pdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)


def pause(ctx: Context, frame: FrameType, header: str | None = None) -> None:
    """Open a remote session at ``frame`` for the actor of ``ctx``; returns once it continues."""
    rt = current_runtime_or_none()
    supervisor = actor_process(rt).supervisor if rt is not None else None
    if rt is None or supervisor is None:  # no side channel to be reached on
        _local(frame, header)
        return
    # Imported at the first breakpoint: a process that never pauses does not pay for them.
    from monarch.actors.debugging.remote_pdb import RemotePdb
    from monarch.actors.debugging.sessions import table_for

    ins = ctx.actor_instance
    info = {
        "actor": ins.actor_id,
        "mesh": ins.name,
        "class": ins.class_name,
        "rank": ins.rank.rank,
        "coords": dict(ins.rank),
        "function": frame.f_code.co_name,
        "file": frame.f_code.co_filename,
        "line": frame.f_lineno,
    }
    session = table_for(supervisor.heartbeater, rt.namespace, rt.proc_uid).open(info)
    debugger = RemotePdb(session)
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)
