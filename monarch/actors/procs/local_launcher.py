"""``LocalLauncher``: the default launcher, procs as children of this process.

Each proc is forked by this client's zygote (:mod:`monarch.actors.procs.zygote_client`)
when it is enabled, else started afresh with this Python; either way from the
launcher thread (:mod:`monarch.actors.procs.launcher_thread`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable

from monarch.actors.meshes.shape import Extent
from monarch.actors.procs.launcher import ProcHandle, proc_command, proc_env, start_and_reap
from monarch.actors.procs.launcher_thread import on_launcher_thread
from monarch.actors.procs.zygote_client import _zygote
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.settings import settings


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
                start_and_reap(
                    h,
                    proc_command(h.uid, ready_subject),
                    proc_env(extent, h.rank),
                    functools.partial(child_dies_with_parent, me) if tie else None,
                    self.loop,
                    on_exit,
                )

        await on_launcher_thread(self.loop, start_all)
        return handles

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
