"""What every way of starting procs shares: the handle, the environment, the protocol.

A proc mesh drives whichever launcher it is given the same way
(:class:`Launcher`): :class:`~monarch.actors.procs.local_launcher.LocalLauncher`
(the default, through the zygote), :class:`~monarch.actors.procs.command_launcher.CommandLauncher`
(a command of the caller's) and the host agents' launcher
(:mod:`monarch.hosts.launcher`). Starting a proc's OS process and reaping it is
written here once (:func:`popen_proc`, :func:`reap_in_thread`): a reaper thread
blocked in ``wait()`` reports an exit the moment it happens rather than at the
next poll.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from monarch.actors.meshes.shape import Extent
from monarch.core.process_runtime import current_runtime_or_none


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


class Launcher(Protocol):
    """What a proc mesh needs from whoever starts its procs (loop only).

    :class:`~monarch.actors.procs.local_launcher.LocalLauncher` starts them on this machine; the host agents'
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


# (runtime, the host agents of the mesh by host rank, procs per host, command=the procs'
# BootstrapSpec or None, binds=the proc_bind dicts or None) -> a Launcher
AgentLauncherFactory = Callable[..., Launcher]


def proc_command(uid: str, ready: str) -> list[str]:
    """The default command line of a proc: this Python, ``-m monarch.actors.hosting.proc``."""
    return [sys.executable, "-m", "monarch.actors.hosting.proc", "--uid", uid, "--ready", ready]


def popen_proc(
    argv: list[str],
    env: dict[str, str],
    preexec_fn: Callable[[], None] | None,
    executable: str | None = None,
) -> subprocess.Popen:
    """Start a proc's OS process, with no stdin and in its own session.

    Own session: a terminal's Ctrl-C reaches the parent only, which then stops
    its procs in order instead of racing them.
    """
    return subprocess.Popen(
        argv,
        executable=executable,
        env=env,
        stdin=subprocess.DEVNULL,
        preexec_fn=preexec_fn,
        start_new_session=True,
    )


def reap_in_thread(popen: subprocess.Popen, name: str, on_code: Callable[[int], None]) -> None:
    """A daemon thread blocked in ``popen.wait()`` hands the exit code to ``on_code`` (there)."""
    threading.Thread(target=lambda: on_code(popen.wait()), name=name, daemon=True).start()


def start_and_reap(
    h: ProcHandle,
    argv: list[str],
    env: dict[str, str],
    preexec_fn: Callable[[], None] | None,
    loop: asyncio.AbstractEventLoop,
    on_exit: Callable[[ProcHandle, int], None],
    executable: str | None = None,
) -> None:
    """Start ``h``'s process (launcher thread) and report its exit on ``loop``: ``on_exit(h, code)``."""
    h.popen = popen_proc(argv, env, preexec_fn, executable)
    reap_in_thread(h.popen, f"reaper-{h.uid}", functools.partial(_reaped, h, loop, on_exit))


def _reaped(
    h: ProcHandle,
    loop: asyncio.AbstractEventLoop,
    on_exit: Callable[[ProcHandle, int], None],
    code: int,
) -> None:
    h.exited.set()
    try:
        loop.call_soon_threadsafe(on_exit, h, code)
    except RuntimeError:  # loop closed at interpreter exit
        h.returncode = code
