"""Tie a child process's life to its parent's, so nothing we start outlives us.

A ``finally`` or ``atexit`` handler cannot run when the parent is SIGKILLed or
crashes; Linux's ``PR_SET_PDEATHSIG`` lets the kernel kill the child instead.
Used as ``subprocess.Popen(..., preexec_fn=child_dies_with_parent)`` by the
embedded broker and the proc launcher.

Caveat: the kernel sends the signal when the *thread* that forked the child
exits, not the whole process. Start children from a long-lived thread (the main
thread or the runtime's event-loop thread), never from a short-lived worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def child_dies_with_parent(parent_pid: int | None = None) -> None:
    """In a freshly forked child: ask the kernel to SIGKILL us when the parent dies.

    A no-op off Linux. If ``parent_pid`` is given and the parent already died
    between ``fork`` and this call (we were re-parented), exit at once rather
    than run orphaned. (Comparing with pid 1 would be wrong in a container,
    where the parent may itself be pid 1.)
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # best effort: failing here must not stop the child from starting
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
