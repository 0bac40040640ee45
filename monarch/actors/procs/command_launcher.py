"""``CommandLauncher``: procs started afresh with a command of the caller's.

A host mesh on this machine starts its procs with a :class:`BootstrapCommand`
other than the default (``bootstrap_command``, ``with_python_executable``) or
bound to CPUs (``proc_bind``) through this launcher; the default goes through
the zygote (:class:`~monarch.actors.procs.local_launcher.LocalLauncher`), which
runs only this Python.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from typing import Union

from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.procs.launcher import ProcHandle, proc_env, start_and_reap
from monarch.actors.procs.launcher_thread import on_launcher_thread
from monarch.actors.procs.local_launcher import LocalLauncher
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.settings import settings

_PYTHON_ENV = "MONARCH_PROC_PYTHON"  # procs started with_python_executable start theirs so too


@dataclasses.dataclass(frozen=True)
class BootstrapCommand:
    """How a proc is started on this machine: ``program args... --uid U --ready S``.

    ``env`` is applied on top of the environment the proc inherits (a
    ``None`` value removes a variable); with ``inherit_env=False`` the proc
    starts from an empty environment plus what monarch needs (``MONARCH_*``,
    ``PYTHONPATH``). ``arg0``, when set, is the proc's ``argv[0]``.
    """

    program: str
    arg0: str | None = None
    args: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)
    inherit_env: bool = True

    def with_env(self, env: dict[str, str | None]) -> BootstrapCommand:
        """A copy with ``env`` merged into this command's ``env`` (this one is unchanged)."""
        return dataclasses.replace(self, env={**self.env, **env})


BootstrapSpec = Union[BootstrapCommand, Callable[[Point], BootstrapCommand]]


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command procs are started with by default: this Python, ``-m monarch.actors.hosting.proc``."""
    return BootstrapCommand(sys.executable, None, ["-m", "monarch.actors.hosting.proc"], {}, True)


def _cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` (the kernel's and numactl's CPU-list format) as a set of CPUs."""
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _check_binds(binds: list[dict[str, str]], per_host: int) -> list[set[int]]:
    """``proc_bind`` as Monarch takes it: one dict per proc of a host; the CPUs of each."""
    if len(binds) != per_host:
        raise ValueError(f"proc_bind length ({len(binds)}) must equal procs_per_host ({per_host})")
    out = []
    for bind in binds:
        numa = sorted(set(bind) & {"cpunodebind", "membind"})
        if numa:
            raise NotImplementedError(
                f"proc_bind {numa} (NUMA binding) is not available in monarch over NATS yet: "
                "bind CPUs with 'cpus' / 'physcpubind', or start procs under numactl with a "
                "bootstrap_command"
            )
        unknown = sorted(set(bind) - {"cpus", "physcpubind"})
        if unknown:
            raise ValueError(f"unknown proc_bind key(s) {unknown}")
        cpus = set()
        for key in ("cpus", "physcpubind"):
            if key in bind:
                cpus |= _cpu_list(bind[key])
        out.append(cpus)
    return out


def _start_child(me: int, tie: bool, cpus: set[int] | None) -> None:
    """In the child before exec: die with this process (if asked), run on ``cpus``."""
    if tie:
        child_dies_with_parent(me)
    if cpus:
        os.sched_setaffinity(0, cpus)


class CommandLauncher(LocalLauncher):
    """Starts procs as children of this process with a :class:`BootstrapCommand` per rank.

    The default launcher forks procs from a warm template process (the zygote),
    which runs this Python; a proc with its own command, or bound to CPUs
    (``binds``: the CPUs of each proc of a host), is started afresh.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        command: BootstrapSpec | None,
        binds: list[set[int]] | None = None,
    ) -> None:
        super().__init__(loop)
        self.command = command or default_bootstrap_cmd()
        self.binds = binds

    def _cmd(self, extent: Extent, rank: int) -> BootstrapCommand:
        cmd = self.command
        cmd = cmd(Point(rank, extent)) if callable(cmd) else cmd
        if not isinstance(cmd, BootstrapCommand):
            raise TypeError(f"bootstrap_command gave {cmd!r}, not a BootstrapCommand")
        return cmd

    def _env(self, cmd: BootstrapCommand, extent: Extent, rank: int) -> dict[str, str]:
        env = proc_env(extent, rank)
        if not cmd.inherit_env:
            env = {k: v for k, v in env.items() if k.startswith("MONARCH_") or k == "PYTHONPATH"}
        for k, v in cmd.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    async def launch(
        self,
        uids: list[str],
        ready_subject: str,
        extent: Extent,
        on_exit: Callable[[ProcHandle, int], None],
    ) -> list[ProcHandle]:
        handles = [ProcHandle(uid, rank) for rank, uid in enumerate(uids)]
        cmds = [self._cmd(extent, h.rank) for h in handles]  # a bad command fails here
        tie, me = settings().die_with_parent, os.getpid()

        def start_all() -> None:
            for h, cmd in zip(handles, cmds):
                start_and_reap(
                    h,
                    [cmd.arg0 or cmd.program, *cmd.args, "--uid", h.uid, "--ready", ready_subject],
                    self._env(cmd, extent, h.rank),
                    functools.partial(_start_child, me, tie, self._cpus(h.rank)),
                    self.loop,
                    on_exit,
                    executable=cmd.program,
                )

        # On the launcher's one long-lived thread, as the default launcher does: the
        # children's parent-death signal fires when the thread that started them ends.
        await on_launcher_thread(self.loop, start_all)
        return handles

    def _cpus(self, rank: int) -> set[int] | None:
        # The per-host dimensions come last in a proc mesh: rank % per-host is the
        # proc's index on its host.
        return self.binds[rank % len(self.binds)] if self.binds else None


def _python_command(python: str) -> BootstrapCommand:
    cmd = default_bootstrap_cmd()
    return dataclasses.replace(cmd, program=python, env={_PYTHON_ENV: python})
