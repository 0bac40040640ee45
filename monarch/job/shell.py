"""``shell(host)``: an interactive shell on one host of a mesh, in this terminal (Monarch's ``shell``).

A proc on the host runs ``$SHELL -i`` (default ``/bin/bash``) on a
pseudo-terminal as its controlling terminal, with the rank's
``MONARCH_RANK_*``/``MONARCH_SIZE_*``, ``env`` and this terminal's ``TERM``.
Keystrokes and window sizes go to it through one port, its output comes
back through another, both over the broker. When this terminal's input
ends, the remote session is hung up (SIGHUP to the shell and its foreground
job, then SIGTERM, then SIGKILL). The call returns the shell's exit status
(128+N for a signal N); a failure to write our output (a closed pipe) is
raised here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

from monarch.actor import Actor, Channel, HostMesh, Port, PortReceiver, context, endpoint

_CHUNK = 16 * 1024
_GRACE = 1.0  # seconds between hang-up, SIGTERM and SIGKILL
_IN_DATA, _IN_SIZE, _IN_CLOSE = 0, 1, 2  # client -> shell: [kind, payload]
_OUT_DATA, _OUT_CODE, _OUT_ERROR = 0, 1, 2  # shell -> client


def _set_size(fd: int, size: tuple[int, int]) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))


def _size(fd: int) -> tuple[int, int]:
    try:
        s = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return s.lines, s.columns


def _take_terminal() -> None:  # in the child, after setsid: the pty becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _readable(fd: int) -> None:
    loop, ready = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, ready.set)
    try:
        await ready.wait()
    finally:
        loop.remove_reader(fd)


async def _write_all(fd: int, data: bytes) -> None:
    """Write everything to a non-blocking fd, waiting while it is full."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            ready = asyncio.Event()
            loop.add_writer(fd, ready.set)
            try:
                await ready.wait()
            finally:
                loop.remove_writer(fd)


class _ShellActor(Actor):
    """Runs one shell on a pseudo-terminal; ``start`` returns the port its input goes to."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._master: int | None = None
        self._task: asyncio.Task | None = None

    @endpoint
    async def start(
        self,
        output: Port[Any],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        terminal: str,
        window_size: tuple[int, int],
    ) -> Port[Any]:
        if self._proc is not None:
            raise RuntimeError("shell is already running")
        rank = context().actor_instance.rank
        child_env = {
            **os.environ,
            **{f"MONARCH_RANK_{k}": str(v) for k, v in dict(rank).items()},
            **{f"MONARCH_SIZE_{k}": str(v) for k, v in dict(rank.extent).items()},
            **(env or {}),
            "TERM": terminal,
        }
        master, slave = os.openpty()
        try:
            _set_size(master, tuple(window_size))  # type: ignore[arg-type]
            self._proc = subprocess.Popen(
                [child_env.get("SHELL", "/bin/bash"), "-i"],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=workdir or (client_cwd if os.path.isdir(client_cwd) else None),
                env=child_env,
                start_new_session=True,
                preexec_fn=_take_terminal,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._master = master
        port, inbox = Channel.open()
        self._task = asyncio.ensure_future(self._session(inbox, output))
        return port

    async def _session(self, inbox: PortReceiver[Any], output: Port[Any]) -> None:
        reader = asyncio.ensure_future(self._pump_output(output))
        writer = asyncio.ensure_future(self._pump_input(inbox))
        try:
            await asyncio.wait([reader, writer], return_when=asyncio.FIRST_COMPLETED)
            if writer.done() and writer.exception() is None:
                await reader  # closed by the client: the hang-up ends the output too
            for t in (reader, writer):
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        except Exception as e:
            with contextlib.suppress(Exception):
                output.send([_OUT_ERROR, str(e)])
            await self._stop()
        finally:
            for t in (reader, writer):
                t.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _pump_output(self, output: Port[Any]) -> None:
        assert self._master is not None and self._proc is not None
        while True:
            try:
                data = os.read(self._master, _CHUNK)
            except BlockingIOError:
                await _readable(self._master)
                continue
            except OSError as e:
                if e.errno == errno.EIO:  # every writer of the terminal is gone
                    break
                raise
            if not data:
                break
            output.send([_OUT_DATA, data])
        code = await asyncio.get_running_loop().run_in_executor(None, self._proc.wait)
        output.send([_OUT_CODE, code if code >= 0 else min(128 - code, 255)])

    async def _pump_input(self, inbox: PortReceiver[Any]) -> None:
        assert self._master is not None
        while True:
            kind, payload = await inbox.recv()
            if kind == _IN_CLOSE:
                await self._stop()
                return
            if kind == _IN_SIZE:
                _set_size(self._master, tuple(payload))  # type: ignore[arg-type]
            elif kind == _IN_DATA:
                await _write_all(self._master, payload)

    async def _stop(self) -> None:
        """Hang up: SIGHUP the shell's and the foreground job's groups, then SIGTERM, SIGKILL."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        groups = {proc.pid}
        with contextlib.suppress(OSError):
            groups.add(os.tcgetpgrp(self._master))  # type: ignore[arg-type]
        groups = {g for g in groups if g > 1 and g != os.getpgrp()}
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
            for g in groups:
                with contextlib.suppress(OSError):
                    os.killpg(g, sig)
            for _ in range(int(_GRACE / 0.02)):
                if proc.poll() is not None and not _any_alive(groups):
                    return
                await asyncio.sleep(0.02)

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None


def _any_alive(groups: set[int]) -> bool:
    for g in groups:
        try:
            os.killpg(g, 0)
            return True
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
    return False


@contextlib.contextmanager
def _terminal(stdin: int, stdout: int) -> Iterator[None]:
    """Raw mode (if a tty) and non-blocking fds for the session; restored after."""
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    blocking = {fd: os.get_blocking(fd) for fd in (stdin, stdout)}
    if saved is not None:
        tty.setraw(stdin)
    try:
        for fd in blocking:
            os.set_blocking(fd, False)
        yield
    finally:
        for fd, was in blocking.items():
            with contextlib.suppress(OSError):
                os.set_blocking(fd, was)
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


async def _session(host: HostMesh, env: dict[str, str] | None, workdir: str | None) -> int:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout.flush()
    output_port, output = Channel.open()
    procs = host.spawn_procs()
    try:
        actor = procs.spawn("shell", _ShellActor)
        term = os.environ.get("TERM", "xterm-256color")
        shell_in = await actor.start.call_one(
            output_port, env, workdir, os.getcwd(), term, _size(stdin)
        )
        loop = asyncio.get_running_loop()

        async def forward_input() -> None:
            try:
                while True:
                    try:
                        data = os.read(stdin, _CHUNK)
                    except BlockingIOError:
                        await _readable(stdin)
                        continue
                    if not data:
                        break
                    shell_in.send([_IN_DATA, data])
            finally:
                shell_in.send([_IN_CLOSE, None])  # our input ended: hang up

        async def forward_output() -> int:
            await _write_all(stdout, b"\r")
            while True:
                kind, payload = await output.recv()
                if kind == _OUT_DATA:
                    await _write_all(stdout, payload)
                elif kind == _OUT_CODE:
                    return int(payload)
                else:
                    raise RuntimeError(f"remote shell failed: {payload}")

        with _terminal(stdin, stdout):
            resize = lambda: shell_in.send([_IN_SIZE, list(_size(stdin))])  # noqa: E731
            with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
                loop.add_signal_handler(signal.SIGWINCH, resize)
            tasks = [
                asyncio.ensure_future(forward_input()),
                asyncio.ensure_future(forward_output()),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                if tasks[0] in done:
                    tasks[0].result()
                return await tasks[1]
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                with contextlib.suppress(ValueError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGWINCH)
    finally:
        output.close()
        await procs.stop()


def shell(
    host_mesh_singleton: HostMesh, *, env: dict[str, str] | None = None, workdir: str | None = None
) -> int:
    """Run an interactive shell on a one-host mesh in this terminal; its exit status.

    ``env`` is added to the remote environment; ``workdir`` (default: this
    directory, if it exists there) is where it starts. ValueError for a mesh
    of more than one host (slice it first). Blocks until the shell exits or
    this terminal's input ends.
    """
    if host_mesh_singleton.size() != 1:
        raise ValueError("shell requires a singleton HostMesh; slice the mesh to one host first")
    return asyncio.run(_session(host_mesh_singleton, env, workdir))
