"""The process's one runtime: where :func:`runtime` finds it, who starts it, forks.

Apart from :class:`~monarch.core.runtime.Runtime` itself because this is a
different question: not how a runtime carries messages but which runtime is
*this process's*. A proc installs its own at start-up (:func:`install_runtime`);
the client's is started on first use by the starter the actor layer hands in
(:func:`set_starter`); a forked child forgets its parent's (its loop thread did
not survive the fork); :func:`shutdown_runtime` stops what it started.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable

from monarch.core.runtime import Runtime

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_inherited: list[Runtime] = []  # in a forked child: the parent's runtime, kept and never used
_starter: Callable[[], Runtime] | None = None

# The client bootstrap (embedded broker, loop thread, zygote, supervision) is
# the top of the actor layer, :mod:`monarch.actors.client`, which hands itself
# in with :func:`set_starter` when imported. A script that reaches runtime()
# before importing it (say one that only made an RDMABuffer) gets it loaded
# here by name, at run time: the one place the core names a higher layer.
_DEFAULT_STARTER_MODULE = "monarch.actors.client"


def set_starter(starter: Callable[[], Runtime]) -> None:
    """Hand in what :func:`runtime` calls to start this process's runtime on first use."""
    global _starter
    _starter = starter


def runtime() -> Runtime:
    """This process's runtime, starting the client runtime on first use."""
    global _runtime
    rt = _runtime
    if rt is not None:
        return rt
    with _runtime_lock:
        if _runtime is None:
            if _starter is None:
                importlib.import_module(_DEFAULT_STARTER_MODULE)  # calls set_starter
            assert _starter is not None, f"{_DEFAULT_STARTER_MODULE} installs no starter"
            _runtime = _starter()
        return _runtime


def install_runtime(rt: Runtime | None) -> None:
    """Make ``rt`` this process's runtime (a proc calls this at start-up; None forgets it)."""
    global _runtime
    _runtime = rt


def current_runtime_or_none() -> Runtime | None:
    return _runtime


def _forget_parent_after_fork() -> None:
    """In a forked child the parent's runtime is not ours (see monarch.actors.client).

    Its loop thread did not survive the fork: the child must not use it (it
    would wait forever on a loop that does not run), so it starts with no
    runtime. The parent's object is kept referenced, never collected: its
    destructors might act on sockets and event-loop state shared with the parent.
    """
    global _runtime, _runtime_lock
    if _runtime is not None:
        _inherited.append(_runtime)
    _runtime = None
    _runtime_lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


def shutdown_runtime() -> None:
    """Stop everything this process's runtime started (procs, broker); idempotent."""
    rt = _runtime
    if rt is not None and rt.stop_process is not None:
        fn = rt.stop_process
        rt.stop_process = None
        fn()
