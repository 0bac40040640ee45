"""The client's side of its zygote (:mod:`monarch.actors.procs.zygote`).

It starts the zygote on first use (on the launcher thread, so it dies with this
process), asks it for a proc per request line, and reads its replies: which
pid it forked, and each proc's exit (the zygote's children are not ours, so it
reaps them and tells us). Kept beside ``zygote.py``, the other end of the pipe.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from monarch.actors.procs.launcher import ProcHandle
from monarch.actors.procs.launcher_thread import _launcher
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.settings import settings


class _Zygote:
    """This client's template process (see :mod:`monarch.actors.procs.zygote`), and its reader."""

    def __init__(self) -> None:
        r, w = os.pipe()
        me = os.getpid()
        env = dict(os.environ)
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
        # Wanted now: it starts its torch zygote once idle (else at a request that wants it).
        self.torch_at_start = wants_torch()
        torch = ["torch"] if self.torch_at_start else []
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "monarch.actors.procs.zygote", str(w), *torch],
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=(w,),
            preexec_fn=functools.partial(child_dies_with_parent, me),
            start_new_session=True,
        )
        os.close(w)
        self._replies = os.fdopen(r, "r")
        self._forked: dict[str, queue.SimpleQueue] = {}
        self._children: dict[int, tuple[ProcHandle, asyncio.AbstractEventLoop, Callable]] = {}
        self._lock = threading.Lock()
        self.alive = True
        # The pid of the second zygote it forks to import torch, once it has (not a proc).
        self.torch_zygote: int | None = None
        # Set once the torch zygote has imported torch: procs asked for from then on have it.
        self.torch_ready = threading.Event()
        self._tied_to: dict[int, int] = {}  # proc pid -> the zygote it dies with
        threading.Thread(target=self._read, name="monarch-zygote", daemon=True).start()

    def fork(
        self,
        h: ProcHandle,
        ready: str,
        env: dict[str, str],
        tie: bool,
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[ProcHandle, int], None],
    ) -> None:
        """Ask for a proc (launcher thread); returns once it is forked."""
        answer: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            self._forked[h.uid] = answer
        req = {"uid": h.uid, "ready": ready, "env": env, "tie": tie, "torch": wants_torch()}
        line = json.dumps(req) + "\n"
        assert self.popen.stdin is not None
        self.popen.stdin.write(line.encode())
        self.popen.stdin.flush()
        try:
            pid, by = answer.get(timeout=30)
        except queue.Empty:
            with self._lock:
                self._forked.pop(h.uid, None)
            raise RuntimeError(f"the proc zygote did not fork proc {h.uid} within 30 s") from None
        if pid is None:
            raise RuntimeError("the proc zygote exited")
        h.os_pid = pid
        h.killer = functools.partial(os.kill, pid, signal.SIGKILL)
        with self._lock:
            self._children[pid] = (h, loop, on_exit)
            if tie and by is not None:
                self._tied_to[pid] = by

    def _read(self) -> None:
        for line in self._replies:
            msg = json.loads(line)
            if "torch_zygote_exit" in msg:
                # It died (killed?): its tied procs died with it (parent-death
                # signal) and nobody is left to report their exits; we do, now.
                gone = msg["torch_zygote_exit"]
                self.torch_ready.clear()  # the plain zygote forks every proc from now on
                with self._lock:
                    pids = [p for p, by in self._tied_to.items() if by == gone]
                    entries = [self._children.pop(p, None) for p in pids]
                    for p in pids:
                        self._tied_to.pop(p, None)
                for entry in entries:
                    if entry is not None:
                        _exited(*entry, -signal.SIGKILL)
            elif "torch_zygote" in msg:
                self.torch_zygote = msg["torch_zygote"]
            elif "torch_zygote_ready" in msg:
                self.torch_ready.set()
            elif "exit" in msg:
                with self._lock:
                    entry = self._children.pop(msg["pid"], None)
                    self._tied_to.pop(msg["pid"], None)
                if entry is not None:
                    _exited(*entry, msg["exit"])
            else:
                with self._lock:
                    answer = self._forked.pop(msg["uid"], None)
                if answer is not None:
                    answer.put((msg["pid"], msg.get("by")))
        # The zygote is gone; its tied children died with it.
        self.alive = False
        with self._lock:
            waiting, self._forked = list(self._forked.values()), {}
            children, self._children = list(self._children.values()), {}
        for answer in waiting:
            answer.put((None, None))
        for entry in children:
            _exited(*entry, -signal.SIGKILL)


def _exited(
    h: ProcHandle,
    loop: asyncio.AbstractEventLoop,
    on_exit: Callable[[ProcHandle, int], None],
    code: int,
) -> None:
    h.returncode = code
    h.exited.set()
    try:
        loop.call_soon_threadsafe(on_exit, h, code)
    except RuntimeError:  # loop closed at interpreter exit
        pass


_the_zygote: _Zygote | None = None


def _zygote() -> _Zygote:
    """The client's zygote, started on first use (launcher thread only)."""
    global _the_zygote
    if _the_zygote is None or not _the_zygote.alive or _the_zygote.popen.poll() is not None:
        _the_zygote = _Zygote()
    return _the_zygote


_inherited: list[_Zygote] = []  # in a forked child: the parent's zygote, kept and never used


def _forget_parent_after_fork() -> None:
    """In a forked child: the zygote reader did not survive the fork, and the zygote is
    the parent's (its pipes are shared with the parent): start our own on first use.

    The parent's is kept referenced, never collected, because closing its
    stdin here would flush the parent's half-written request into it.
    """
    global _the_zygote
    if _the_zygote is not None:
        _inherited.append(_the_zygote)
    _the_zygote = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


def wants_torch() -> bool:
    """Whether procs should be forked with torch already imported (from the torch zygote).

    ``MONARCH_PRELOAD_TORCH``: ``auto`` (the default) once this client has
    imported torch, its actors most likely work with tensors, and a proc that
    has it decodes its first tensor without a ~2 s import; a client that has
    not gets procs without torch, as Monarch's are, several times smaller
    alone (benchmarks/NOTES.md 43). ``1``: always, ``0``: never (when torch
    is installed at all).
    """
    mode = settings().preload_torch
    if mode == "0" or not _torch_installed():
        return False
    return mode == "1" or "torch" in sys.modules


@functools.cache
def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def ensure_zygote() -> None:
    """Start the zygote now and wait until it runs (tests use this to count processes).

    For a client that wanted torch in its procs when the zygote started
    (:func:`wants_torch`), wait also (at most 10 s) until it has forked its
    torch zygote, which it does once idle: a process that is there for good.
    """
    if not settings().zygote:
        return
    done: queue.SimpleQueue = queue.SimpleQueue()
    _launcher().put(lambda: done.put(_zygote()))
    zygote = done.get(timeout=60)
    if zygote.torch_at_start:  # else none comes before a spawn that wants torch
        deadline = time.monotonic() + 10
        while zygote.torch_zygote is None and zygote.alive and time.monotonic() < deadline:
            time.sleep(0.02)


def prestart_zygote() -> None:
    """Start the zygote in the background, so the first spawn does not wait for imports."""
    if settings().zygote:
        _launcher().put(_zygote)
