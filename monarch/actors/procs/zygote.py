"""A template process that forks procs: a spawn costs a fork, not a Python start-up.

Starting a proc the plain way spends ~0.17 s of CPU per proc importing
pydantic, nats-py, asyncio and monarch; on a small machine spawning four procs
at once then takes ~0.4 s. The zygote imports all of that once, waits, and
forks a child for each proc asked for: the child inherits the imported
modules and runs the proc's main.

For a client that works with torch (it has imported it; ``MONARCH_PRELOAD_TORCH``,
see :func:`monarch.actors.procs.zygote_client.wants_torch`), once no fork has been
asked for during ``PRELOAD_WHEN_IDLE`` seconds, it forks a second zygote that
imports torch (when installed) and, once that is done, hands it the requests
that want torch: a proc then has torch already, and the first tensor it
decodes imports nothing on its event loop. A fork asked for during that
import (~2 s of CPU here) is made at once by the first zygote, without torch
(it imports it when it first needs it). A client that has not imported torch
gets procs without it, as Monarch's are: a proc forked from the torch zygote
shares its ~140 MB of torch heap, half of which a lone proc's PSS counts,
and copies the pages it touches (benchmarks/NOTES.md 43).

Neither zygote starts an event loop, and each forks only while no thread of
its own runs (the torch zygote has torch's idle threads after the import;
forking after ``import torch`` is what DataLoader workers do), so forking
them is safe. It talks to
the client over two pipes, one JSON object per line:

* client -> zygote (its stdin): ``{"uid": ..., "ready": ..., "env": {...}, "tie": bool,
  "torch": bool}`` (``torch``: fork it from the torch zygote when there is one; absent: true)
* zygote -> client (a pipe whose fd is its only argument): ``{"uid": ..., "pid": N, "by": Z}``
  once forked (``Z``: the zygote that forked it), ``{"pid": N, "exit": code}`` when a child
  ends (``code`` as ``Popen.returncode``), ``{"torch_zygote": N}`` once the torch zygote is
  forked, ``{"torch_zygote_ready": N}`` once it has imported torch (procs asked for from then
  on are its forks), and ``{"torch_zygote_exit": N, "code": code}`` if it ends: its tied
  procs ended with it.

It exits when its stdin closes (the client finished or died). Children it made
with ``tie`` die with it (parent-death signal); the others notice their owner's
silent heartbeat and exit by themselves.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import select
import signal
import sys
from typing import Any

from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.settings import settings

PRELOAD_WHEN_IDLE = 0.3  # seconds without requests: a burst of forks for one mesh is over
TORCH_ZYGOTE_NAME = "zygote-torch"  # the torch zygote's process name (/proc/<pid>/comm)


def _process_name() -> str:
    try:
        with open("/proc/self/comm") as f:
            return f.read().strip()
    except OSError:
        return "python"


_ORIGINAL_NAME = _process_name()


def _set_process_name(name: str) -> None:
    """Set /proc/self/comm (what ``ps -o comm`` and ``top`` show); Linux only, best effort."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def main() -> None:
    # Imported in main() only: launchers import this module just to name it; the fork template pays the imports.
    import monarch.actors.hosting.proc as proc  # the expensive part, done once

    replies = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    torch_to_import = importlib.util.find_spec("torch") is not None and "torch" not in sys.modules
    zygote = _Zygote(sys.stdin.buffer.fileno(), replies, proc, with_torch_child=torch_to_import)
    if zygote.torch is not None and sys.argv[2:] == ["torch"]:  # the client has torch already
        zygote.torch.wanted = True
    zygote.serve()


class _Zygote:
    """Forks a proc for each request line read from ``requests``; reports to ``replies``.

    ``with_torch_child``: once a request wanted torch (or the client said so at
    start) and then idle for ``PRELOAD_WHEN_IDLE`` seconds, fork a second
    zygote that imports torch (:class:`_TorchZygote`), and hand it the requests
    that want torch once it is ready. This one never imports torch and never runs a
    thread, so it can fork at once meanwhile: a spawn during the import does
    not wait for it (it used to, ~2 s here).
    """

    def __init__(
        self,
        requests: int,
        replies: Any,
        proc: Any,
        *,
        with_torch_child: bool,
        tell: int | None = None,
    ) -> None:
        self.requests = requests
        self.tell = tell  # the torch zygote's: "forked <uid>" to the plain zygote
        self.replies = replies
        self.proc = proc
        self.me = os.getpid()
        # A child's exit wakes the select at once (reported in ~ms, not at the next poll).
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.children: set[int] = set()
        self.torch = _TorchZygote(self) if with_torch_child else None
        self.name = _ORIGINAL_NAME

    def serve(self) -> None:
        """Until ``requests`` closes (the client finished or died)."""
        pending = b""
        while True:
            fds = [self.requests, self.wake_r]
            timeout = 1.0  # exits wake us at once; this is a safety net
            if self.torch is not None:
                fds += self.torch.fds()
                timeout = self.torch.select_timeout() or timeout
            ready, _, _ = select.select(fds, [], [], timeout)
            if self.torch is not None:
                self.torch.step(idle=not ready, readable=ready)
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if self.requests in ready:
                chunk = os.read(self.requests, 65536)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    req = json.loads(line)
                    if self.torch is None or not req.get("torch", True):
                        self.fork_proc(req)
                        continue
                    self.torch.wanted = True
                    if not self.torch.take(line, req):
                        self.fork_proc(req)
            self.reap()

    def fork_proc(self, req: dict) -> None:
        self.replies.flush()  # nothing buffered may be written twice
        pid = os.fork()
        if pid == 0:
            self.close_in_child()
            _set_process_name(self.name)  # a fork of the torch zygote is a proc, not it
            _become_proc(req, self.me, self.replies, self.proc, child_dies_with_parent, settings)
        self.children.add(pid)
        if self.tell is not None:  # first: a request the client never hears of is a
            os.write(self.tell, f"forked {req['uid']}\n".encode())  # timeout, not a twin
        self.replies.write(json.dumps({"uid": req["uid"], "pid": pid, "by": self.me}) + "\n")

    def close_in_child(self) -> None:
        """In a child forked from here: the fds that are this zygote's alone."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        own = [self.wake_r, self.wake_w, *([self.tell] if self.tell is not None else [])]
        for fd in (*own, *(self.torch.own_fds() if self.torch else ())):
            with contextlib.suppress(OSError):
                os.close(fd)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.torch is not None and pid == self.torch.pid:
                self.torch.ended()
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                self.replies.write(json.dumps({"torch_zygote_exit": pid, "code": code}) + "\n")
                continue
            self.children.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            self.replies.write(json.dumps({"pid": pid, "exit": code}) + "\n")


class _TorchZygote:
    """A child zygote that imports torch; forks are asked of it once it has.

    Forked from the plain zygote once that is idle; it imports torch on its
    main thread (nothing else runs in it, so nothing is half-imported when it
    forks later), says ``ready``, then serves request lines forwarded to it,
    writing its replies to the client's pipe (one short line per write). It
    dies with the plain zygote (parent-death signal), and its tied procs with
    it. It tells the plain zygote ``forked <uid>`` before answering the client,
    so if it dies (the OOM killer likes big processes), the plain zygote forks
    the requests it had not taken yet itself, and goes on forking from then on.
    """

    def __init__(self, parent: _Zygote) -> None:
        self.parent = parent
        self.pid: int | None = None
        self.ready = False
        self.wanted = False  # a request wanted torch: start once idle
        self.over = False  # ended or failed: the plain zygote forks from now on
        self._told_r: int | None = None  # "ready", then "forked <uid>" lines; EOF: gone
        self._told = b""
        self._requests_w: int | None = None
        self._forwarded: dict[str, dict] = {}  # uid -> request not yet forked by it

    def fds(self) -> list[int]:
        return [self._told_r] if self._told_r is not None else []

    def own_fds(self) -> list[int]:
        return [fd for fd in (self._told_r, self._requests_w) if fd is not None]

    def select_timeout(self) -> float | None:
        return PRELOAD_WHEN_IDLE if self._to_start() else None

    def _to_start(self) -> bool:
        return self.wanted and self.pid is None and not self.over

    def step(self, idle: bool, readable: list[int]) -> None:
        if idle and self._to_start():
            self._start()
        if self._told_r is not None and self._told_r in readable and self._read_told():
            self.ended()

    def _read_told(self) -> bool:
        """Take in what it said since we last looked; True once it is gone (EOF)."""
        assert self._told_r is not None
        gone = False
        while True:
            try:
                chunk = os.read(self._told_r, 65536)  # non-blocking
            except BlockingIOError:
                break
            except OSError:
                gone = True
                break
            if not chunk:
                gone = True
                break
            self._told += chunk
        *lines, self._told = self._told.split(b"\n")
        for line in lines:
            if line == b"ready":
                self.ready = True
                self.parent.replies.write(json.dumps({"torch_zygote_ready": self.pid}) + "\n")
            elif line.startswith(b"forked "):
                self._forwarded.pop(line[7:].decode(), None)
        return gone

    def take(self, line: bytes, req: dict) -> bool:
        """Forward a request line (``req`` parsed) if ready; False: the caller forks it itself."""
        if not self.ready or self._requests_w is None:
            return False
        self._forwarded[req["uid"]] = req
        data = memoryview(line + b"\n")
        try:
            while data:  # blocking: a full pipe waits
                data = data[os.write(self._requests_w, data) :]
            return True
        except OSError:  # it is gone: ended() hands this request back too
            self.ended()
            return True

    def ended(self) -> None:
        """It is gone: fork here what it had not forked yet, and from now on all."""
        if self.over:
            return
        if self._told_r is not None:
            self._read_told()  # what it forked before it went
        self.ready, self.over = False, True
        for fd in self.own_fds():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._told_r = self._requests_w = None
        left, self._forwarded = list(self._forwarded.values()), {}
        for req in left:
            self.parent.fork_proc(req)

    def _start(self) -> None:
        parent = self.parent
        requests_r, requests_w = os.pipe()
        told_r, told_w = os.pipe()
        parent.replies.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(requests_w)
                os.close(told_r)
                signal.set_wakeup_fd(-1)
                for fd in (parent.wake_r, parent.wake_w):
                    os.close(fd)
                child_dies_with_parent(parent.me)
                _set_process_name(TORCH_ZYGOTE_NAME)  # `ps -o comm` tells it from a proc
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)  # the client's requests are the plain zygote's
                os.close(devnull)
                parent.proc.preimport_torch()
                gc.freeze()  # forks never scan (nor, by scanning, copy) what they inherit
                os.write(told_w, b"ready\n")
                _Zygote(
                    requests_r, parent.replies, parent.proc, with_torch_child=False, tell=told_w
                ).serve()
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(0)
        os.close(requests_r)
        os.close(told_w)
        os.set_blocking(told_r, False)
        self.pid, self._told_r, self._requests_w = pid, told_r, requests_w
        parent.replies.write(json.dumps({"torch_zygote": pid}) + "\n")


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
        proc.reseed_inherited_random_state()  # not its zygote's, nor its siblings'
        proc.main(["--uid", req["uid"], "--ready", req["ready"]], preimport=False)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


if __name__ == "__main__":
    main()
