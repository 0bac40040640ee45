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
from typing import Any, Union

from monarch.actors.meshes.shape import Extent, Point
from monarch.actors.procs.launcher import ProcHandle, proc_env, start_and_reap
from monarch.actors.procs.launcher_thread import on_launcher_thread
from monarch.actors.procs.local_launcher import LocalLauncher
from monarch.actors.procs.proc_bind import ProcBind
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


def command_argv(
    cmd: BootstrapCommand, uid: str, ready: str, bind: ProcBind | None
) -> tuple[list[str], str]:
    """A proc's command line (its ``argv[0]`` as ``cmd`` says) and the program to execute,
    under ``numactl`` when ``bind`` needs it."""
    argv = [cmd.arg0 or cmd.program, *cmd.args, "--uid", uid, "--ready", ready]
    if bind is None or not bind.numactl:
        return argv, cmd.program
    wrapped = bind.argv([cmd.program, *argv[1:]])  # numactl execs the program by its path
    return wrapped, wrapped[0]


def command_env(env: dict[str, str], cmd: BootstrapCommand) -> dict[str, str]:
    """``env`` (the proc's own: rank, point, broker) with ``cmd``'s changes applied."""
    if not cmd.inherit_env:
        env = {k: v for k, v in env.items() if k.startswith("MONARCH_") or k == "PYTHONPATH"}
    else:
        env = dict(env)
    for k, v in cmd.env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def command_to_wire(cmd: BootstrapCommand) -> dict[str, Any]:
    """``cmd`` as plain msgpack, for a host agent (:func:`command_from_wire` there)."""
    return dataclasses.asdict(cmd)


def command_from_wire(data: Any) -> BootstrapCommand:
    """A :class:`BootstrapCommand` sent by :func:`command_to_wire`; ValueError if malformed."""
    try:
        cmd = BootstrapCommand(**data)
    except TypeError as e:
        raise ValueError(f"malformed bootstrap command {data!r}: {e}") from None
    if (
        not isinstance(cmd.program, str)
        or not cmd.program
        or not (cmd.arg0 is None or isinstance(cmd.arg0, str))
        or not isinstance(cmd.args, list)
        or not all(isinstance(a, str) for a in cmd.args)
        or not isinstance(cmd.env, dict)
        or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in cmd.env.items()
        )
        or not isinstance(cmd.inherit_env, bool)
    ):
        raise ValueError(f"malformed bootstrap command {data!r}")
    return cmd


def prepare_child(me: int, tie: bool, bind: ProcBind | None) -> None:
    """In the child before exec: die with this process (if asked), run on its CPUs."""
    if tie:
        child_dies_with_parent(me)
    if bind is not None:
        bind.in_child()


class CommandLauncher(LocalLauncher):
    """Starts procs as children of this process with a :class:`BootstrapCommand` per rank.

    The default launcher forks procs from a warm template process (the zygote),
    which runs this Python; a proc with its own command, or bound to CPUs
    (``binds``: each proc of a host's, :mod:`monarch.actors.procs.proc_bind`), is
    started afresh.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        command: BootstrapSpec | None,
        binds: list[ProcBind] | None = None,
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
                bind = self._bind(h.rank)
                argv, program = command_argv(cmd, h.uid, ready_subject, bind)
                start_and_reap(
                    h,
                    argv,
                    command_env(proc_env(extent, h.rank), cmd),
                    functools.partial(prepare_child, me, tie, bind),
                    self.loop,
                    on_exit,
                    executable=program,
                )

        # On the launcher's one long-lived thread, as the default launcher does: the
        # children's parent-death signal fires when the thread that started them ends.
        await on_launcher_thread(self.loop, start_all)
        return handles

    def _bind(self, rank: int) -> ProcBind | None:
        # The per-host dimensions come last in a proc mesh: rank % per-host is the
        # proc's index on its host.
        return self.binds[rank % len(self.binds)] if self.binds else None


def _python_command(python: str) -> BootstrapCommand:
    cmd = default_bootstrap_cmd()
    return dataclasses.replace(cmd, program=python, env={_PYTHON_ENV: python})
