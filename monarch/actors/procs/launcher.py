"""Starting and reaping the OS processes of a proc mesh on this machine.

Processes are started from one long-lived launcher thread so the kernel's
parent-death signal (see :mod:`monarch.broker.connections._pdeathsig`) stays armed for
their whole life: if the client is SIGKILLed its procs die with it. Each
process gets a reaper thread blocked in ``wait()``, so an exit is reported to
the owner the moment it happens rather than at the next poll.
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
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from monarch.actors.meshes.shape import Extent
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.core.process_runtime import current_runtime_or_none
from monarch.settings import settings

T = TypeVar("T")


@dataclass
class ProcHandle:
    uid: str
    rank: int
    popen: subprocess.Popen | None = None
    returncode: int | None = None
    lost: bool = False  # its failure was already reported
    exited: threading.Event = field(default_factory=threading.Event)
    host_uid: str | None = None  # the host agent that started it (None: this process did)
    killer: Callable[[], None] | None = None  # how to kill it when it is not our child
    os_pid: int | None = None  # its pid when a zygote forked it (no Popen here)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else self.os_pid

    def kill(self) -> None:
        """SIGKILL the process, whether it is our child or a host agent's."""
        if self.popen is not None:
            self.popen.kill()
        elif self.killer is not None:
            self.killer()


def proc_env(extent: Extent, rank: int) -> dict[str, str]:
    """The child's environment: ours, plus the broker URL, rank and import path."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(paths)
    point = extent.coords(rank)
    env["MONARCH_RANK"] = str(rank)

    rt = current_runtime_or_none()
    if rt is not None:
        env["MONARCH_ROOT_PROC"] = rt.root_uid
        env["MONARCH_OWNER_PROC"] = rt.proc_uid  # the proc exits if this process dies
    for label, c in zip(extent.labels, point):
        env[f"MONARCH_POINT_{label.upper()}"] = str(c)
    if "gpus" in extent.labels and "CUDA_VISIBLE_DEVICES" not in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = str(point[extent.labels.index("gpus")])
    return env


_jobs: queue.SimpleQueue | None = None
_jobs_lock = threading.Lock()


def _launcher() -> queue.SimpleQueue:
    """The one thread that starts procs: a plain daemon thread that lives as long as
    the process. Not an executor: ``concurrent.futures`` ends its threads at
    interpreter exit, before atexit handlers run, and the kernel would then kill
    every proc (parent-death signal) before the client could stop them in order."""
    global _jobs
    with _jobs_lock:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            jobs = _jobs

            def run() -> None:
                while True:
                    jobs.get()()

            threading.Thread(target=run, name="monarch-launcher", daemon=True).start()
        return _jobs


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if not fut.done():
        fut.set_result(None) if error is None else fut.set_exception(error)


class Launcher(Protocol):
    """What a proc mesh needs from whoever starts its procs (loop only).

    :class:`LocalLauncher` starts them on this machine; the host agents'
    launcher (:class:`monarch.hosts.launcher.AgentLauncher`) asks the agents of
    a host mesh, which hands it in (:data:`AgentLauncherFactory`).
    """

    async def launch(
        self,
        uids: list[str],
        ready_subject: str,
        extent: Extent,
        on_exit: Callable[[ProcHandle, int], None],
    ) -> list[ProcHandle]:
        """Start one proc per uid (rank = index); ``on_exit(handle, code)`` when one ends."""
        ...

    async def wait_or_kill(self, handles: list[ProcHandle], timeout: float) -> None:
        """Wait up to ``timeout`` for ``handles`` to exit, then kill those still running."""
        ...


# (runtime, the host agents of the mesh by host rank, procs per host) -> a Launcher
AgentLauncherFactory = Callable[[Any, list[Any], int], Launcher]


class LocalLauncher:
    """Starts procs as children of this process."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def launch(
        self,
        uids: list[str],
        ready_subject: str,
        extent: Extent,
        on_exit: Callable[[ProcHandle, int], None],
    ) -> list[ProcHandle]:
        handles = [ProcHandle(uid, rank) for rank, uid in enumerate(uids)]

        def start_all() -> None:
            me = os.getpid()
            tie = settings().die_with_parent
            zygote = _zygote() if settings().zygote else None
            for h in handles:
                if zygote is not None:
                    zygote.fork(h, ready_subject, proc_env(extent, h.rank), tie, self.loop, on_exit)
                    continue
                cmd = [
                    sys.executable,
                    "-m",
                    "monarch.actors.hosting.proc",
                    "--uid",
                    h.uid,
                    "--ready",
                    ready_subject,
                ]
                h.popen = subprocess.Popen(
                    cmd,
                    env=proc_env(extent, h.rank),
                    stdin=subprocess.DEVNULL,
                    preexec_fn=functools.partial(child_dies_with_parent, me) if tie else None,
                    # Own session: a terminal's Ctrl-C reaches the client only, which
                    # then stops its procs in order instead of racing them.
                    start_new_session=True,
                )
                threading.Thread(
                    target=self._reap, args=(h, on_exit), name=f"reaper-{h.uid}", daemon=True
                ).start()

        await on_launcher_thread(self.loop, start_all)
        return handles

    def _reap(self, h: ProcHandle, on_exit: Callable[[ProcHandle, int], None]) -> None:
        assert h.popen is not None
        code = h.popen.wait()
        h.exited.set()
        try:
            self.loop.call_soon_threadsafe(on_exit, h, code)
        except RuntimeError:  # loop closed at interpreter exit
            h.returncode = code

    async def wait_or_kill(self, handles: list[ProcHandle], timeout: float) -> None:
        """Wait up to ``timeout`` for each process to exit, then SIGKILL the rest and reap.

        Polls the reapers' events instead of using an executor, because this
        also runs at interpreter exit, when executors refuse new work.
        """
        deadline = time.monotonic() + timeout
        pending = [h for h in handles if h.pid is not None and not h.exited.is_set()]
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            pending = [h for h in pending if not h.exited.is_set()]
        for h in pending:
            try:
                h.kill()
            except ProcessLookupError:
                pass
        kill_deadline = time.monotonic() + 5.0
        while any(not h.exited.is_set() for h in pending) and time.monotonic() < kill_deadline:
            await asyncio.sleep(0.005)
        for h in handles:
            if h.popen is not None:
                h.returncode = h.popen.poll()


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
    h: ProcHandle, loop: asyncio.AbstractEventLoop, on_exit: Callable[[ProcHandle, int], None], code: int
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
    """In a forked child: the launcher thread and zygote reader did not survive the fork.

    A job put on the parent's queue would never run, and the zygote is the
    parent's (its pipes are shared with the parent): start our own on first
    use. The parent's is kept referenced, never collected, because closing its
    stdin here would flush the parent's half-written request into it.
    """
    global _jobs, _jobs_lock, _the_zygote
    if _the_zygote is not None:
        _inherited.append(_the_zygote)
    _jobs, _jobs_lock, _the_zygote = None, threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_after_fork)


async def on_launcher_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the launcher's one long-lived thread and wait for it (on ``loop``).

    Children started there get their parent-death signal from a thread that
    lives as long as the client, not from whichever thread asked.
    """
    done = loop.create_future()

    def job() -> None:
        try:
            fn()
            loop.call_soon_threadsafe(_settle, done, None)
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, done, e)

    _launcher().put(job)
    await done


def run_on_launcher_thread(fn: Callable[[], T], timeout: float = 60.0) -> T:
    """Run ``fn`` on the launcher's one long-lived thread and return its result (blocks).

    For children that must outlive the thread that asked: the embedded broker
    started by a client whose first use of monarch is on a short-lived thread
    (a thread pool's) would otherwise get its parent-death signal when that
    thread ends. Raises what ``fn`` raised, or TimeoutError after ``timeout``.
    """
    out: queue.SimpleQueue = queue.SimpleQueue()

    def job() -> None:
        try:
            out.put((True, fn()))
        except BaseException as e:
            out.put((False, e))

    _launcher().put(job)
    try:
        ok, value = out.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"the launcher thread did not run {fn!r} within {timeout} s") from None
    if not ok:
        raise value
    return value


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
