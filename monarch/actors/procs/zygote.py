"""A template process that forks procs: a spawn costs a fork, not a Python start-up.

Starting a proc the plain way spends ~0.17 s of CPU per proc importing
pydantic, nats-py, asyncio and monarch; on a small machine spawning four procs
at once then takes ~0.4 s. The zygote imports all of that once, waits, and
forks a child for each proc asked for: the child inherits the imported
modules and runs the proc's main.

Once no fork has been asked for during ``PRELOAD_WHEN_IDLE`` seconds, it
imports torch too (when installed), on a thread, while it goes on reporting
exits: a fork then has it already, and the first tensor a proc decodes imports
nothing on its event loop. A fork asked for during that import waits for it
(once per zygote, ~2 s of CPU here); the forks made before have no torch and
import it when they first need it.

It never starts an event loop, and forks only while no thread of its own runs
(importing torch leaves one of torch's, idle; forking after ``import torch``
is what DataLoader workers do), so forking it is safe. It talks to
the client over two pipes, one JSON object per line:

* client -> zygote (its stdin): ``{"uid": ..., "ready": ..., "env": {...}, "tie": bool}``
* zygote -> client (a pipe whose fd is its only argument): ``{"uid": ..., "pid": N}`` once forked, and
  ``{"pid": N, "exit": code}`` when a child ends (``code`` as ``Popen.returncode``).

It exits when its stdin closes (the client finished or died). Children it made
with ``tie`` die with it (parent-death signal); the others notice their owner's
silent heartbeat and exit by themselves.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import threading

from monarch.broker._pdeathsig import child_dies_with_parent
from monarch.broker.config import settings

PRELOAD_WHEN_IDLE = 0.3  # seconds without requests: a burst of forks for one mesh is over


def main() -> None:
    # Imported in main() only: launchers import this module just to name it; the fork template pays the imports.
    import monarch.actors.hosting.proc as proc  # the expensive part, done once

    me = os.getpid()
    replies = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    stdin = sys.stdin.buffer
    # A child's exit wakes the select at once (reported in ~ms, not at the next poll).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    children: set[int] = set()
    preload = _Preload(proc.preimport_torch)
    waiting: list[dict] = []  # fork requests held back while torch is being imported
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [], preload.select_timeout())
        preload.step(idle=not ready)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if stdin in ready:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                return  # the client is gone
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                waiting.append(json.loads(line))
        while waiting and not preload.running:
            req = waiting.pop(0)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                _become_proc(req, me, replies, proc, child_dies_with_parent, settings)
            children.add(pid)
            replies.write(json.dumps({"uid": req["uid"], "pid": pid}) + "\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            replies.write(json.dumps({"pid": pid, "exit": code}) + "\n")


class _Preload:
    """Imports torch on a thread once the zygote is idle; forks wait until it is done.

    On a thread so that child exits are still reported at once meanwhile; no
    fork happens while it runs (a child would inherit half-imported modules
    and their locks held by a thread it does not have).
    """

    def __init__(self, target) -> None:  # noqa: ANN001
        self._target = target
        self._thread: threading.Thread | None = None
        self._done = False

    @property
    def running(self) -> bool:
        return self._thread is not None

    def select_timeout(self) -> float:
        if self._thread is not None:
            return 0.02  # notice the end of the import soon: forks may be waiting
        return 1.0 if self._done else PRELOAD_WHEN_IDLE

    def step(self, idle: bool) -> None:
        if self._thread is None and not self._done and idle:
            self._thread = threading.Thread(target=self._target, name="zygote-preload", daemon=True)
            self._thread.start()
        elif self._thread is not None and not self._thread.is_alive():
            self._thread.join()
            self._thread, self._done = None, True
            gc.freeze()  # forks never scan (nor, by scanning, copy) what they inherit


def _become_proc(req, zygote_pid, replies, proc, child_dies_with_parent, settings) -> None:  # noqa: ANN001
    """In the forked child: take the proc's environment and run its main; never return."""
    try:
        os.setsid()  # own session, as a Popen(start_new_session=True) child has
        if req.get("tie", True):
            child_dies_with_parent(zygote_pid)
        replies.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        env = req["env"]
        os.environ.clear()
        os.environ.update(env)
        for path in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
            if path and path not in sys.path:
                sys.path.insert(0, path)
        settings.cache_clear()  # the child's settings are its own environment's
        proc.main(["--uid", req["uid"], "--ready", req["ready"]], preimport=False)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


if __name__ == "__main__":
    main()
