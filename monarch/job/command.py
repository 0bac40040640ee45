"""``exec_command``: run a command (or a Python script) on every host of a mesh, as Monarch does.

One proc per host (or ``per_host`` of them) runs a :class:`BashActor`; a
shell command runs as a bash script in the client's working directory when
that directory exists remotely (or ``workdir``), a ``*.py`` script or
``-m module`` runs inside the proc's Python with ``sys.argv`` set. Each rank
sees ``MONARCH_RANK_<dim>`` and ``MONARCH_SIZE_<dim>``. Output comes back to
the client's stdout/stderr, or goes to ``output_dir/stdout.txt`` and
``stderr.txt`` on each host (``$SUBDIR`` in it becomes the rank's
coordinates, e.g. ``hosts_0``). The result is the largest exit code.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import runpy
import selectors
import shlex
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import Any

from monarch.actor import Actor, Future, HostMesh, Port, context, current_rank, endpoint


def _rank_env() -> dict[str, str]:
    """``MONARCH_RANK_<dim>`` / ``MONARCH_SIZE_<dim>`` of this actor in its mesh."""
    rank = context().actor_instance.rank
    return {
        **{f"MONARCH_RANK_{k}": str(v) for k, v in dict(rank).items()},
        **{f"MONARCH_SIZE_{k}": str(v) for k, v in dict(rank.extent).items()},
    }


def _expand_subdir(output_dir: str) -> str:
    rank = context().actor_instance.rank
    return output_dir.replace("$SUBDIR", "_".join(f"{k}_{v}" for k, v in dict(rank).items()))


class BashActor(Actor):
    """Runs scripts on its host: ``run`` (to completion), ``run_python``, ``run_streaming``."""

    @endpoint
    def run(
        self, script: str, target_ranks: list[int] | None = None, output_dir: str | None = None
    ) -> dict[str, Any]:
        """Run a bash script; ``{"returncode", "stdout", "stderr"}`` (``"skipped"`` off target)."""
        if target_ranks is not None and current_rank().rank not in target_ranks:
            return {"returncode": 0, "stdout": "", "stderr": "", "skipped": True}
        env = {**os.environ, **_rank_env()}
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
            f.write(script)
            f.flush()
            if output_dir is None:
                done = subprocess.run(["bash", f.name], capture_output=True, text=True, env=env)
                return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            output_dir = _expand_subdir(output_dir)
            os.makedirs(output_dir, exist_ok=True)
            with (
                open(os.path.join(output_dir, "stdout.txt"), "w") as out,
                open(os.path.join(output_dir, "stderr.txt"), "w") as err,
            ):
                done = subprocess.run(["bash", f.name], stdout=out, stderr=err, env=env)
            return {"returncode": done.returncode, "stdout": "", "stderr": ""}

    @endpoint
    def run_python(
        self,
        cmd: list[str],
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        client_cwd: str | None = None,
        output_dir: str | None = None,
    ) -> dict[str, Any]:
        """Run ``[script.py, *args]`` or ``["-m", module, *args]`` in this proc, as ``__main__``.

        An exception gives exit code 1 (its traceback on stderr); ``sys.exit(n)``
        gives ``n``. Output is captured at the file-descriptor level, so child
        processes' output is caught too.
        """
        os.environ.update({**_rank_env(), **(env or {})})
        cwd = workdir or (client_cwd if client_cwd and os.path.isdir(client_cwd) else None)
        if output_dir is not None:
            output_dir = _expand_subdir(output_dir)
            os.makedirs(output_dir, exist_ok=True)
            out = open(os.path.join(output_dir, "stdout.txt"), "w+")  # noqa: SIM115
            err = open(os.path.join(output_dir, "stderr.txt"), "w+")  # noqa: SIM115
        else:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        with out, err:
            saved_argv = sys.argv
            try:
                with contextlib.chdir(cwd or os.getcwd()), _redirect_fds(out, err):
                    sys.argv = list(cmd[1:]) if cmd[0] == "-m" else list(cmd)
                    code = _run_main(cmd)
            finally:
                sys.argv = saved_argv
            if output_dir is not None:
                return {"returncode": code, "stdout": "", "stderr": ""}
            out.seek(0)
            err.seek(0)
            return {"returncode": code, "stdout": out.read(), "stderr": err.read()}

    @endpoint
    def run_streaming(self, script: str, output_port: Port[str], target_ranks: list[int]) -> None:
        """Run a bash script on the target ranks, sending its lines to ``output_port`` as they come.

        Messages: ``"<rank>:out:<line>"``, ``"<rank>:err:<line>"``, then
        ``"<rank>:rc:<code>"``; a rank not targeted sends ``"skip:<rank>"``.
        """
        rank = current_rank().rank
        if rank not in target_ranks:
            output_port.send(f"skip:{rank}")
            return
        env = {**os.environ, **_rank_env()}
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
            f.write(script)
            f.flush()
            proc = subprocess.Popen(
                ["bash", f.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            assert proc.stdout is not None and proc.stderr is not None
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, "out")
                sel.register(proc.stderr, selectors.EVENT_READ, "err")
                while sel.get_map():
                    for key, _ in sel.select():
                        line = key.fileobj.readline()  # type: ignore[union-attr]
                        if not line:
                            sel.unregister(key.fileobj)
                        else:
                            output_port.send(f"{rank}:{key.data}:{line}")
            proc.wait()
        output_port.send(f"{rank}:rc:{proc.returncode}")


def _run_main(cmd: list[str]) -> int:
    try:
        if cmd[0] == "-m":
            runpy.run_module(cmd[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(cmd[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def _redirect_fds(out: Any, err: Any) -> Any:
    """Point fds 1 and 2 (and sys.stdout/err) at files, so subprocesses write there too."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    saved_py = sys.stdout, sys.stderr
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
        sys.stdout, sys.stderr = saved_py
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def exec_command(
    host_mesh: HostMesh,
    cmd: list[str],
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: dict[str, int] | None = None,
    per_host: dict[str, int] | None = None,
) -> Future[int]:
    """Run ``cmd`` on ``host_mesh`` (or one ``rank``/``point`` of it); a Future of the largest exit code.

    The work starts at once on a thread of its own (dropping the future does
    not cancel it); its procs are stopped before the future completes.
    ``point`` slices by coordinates, ``rank`` by flat rank (not both);
    ``per_host`` starts that many procs per host.
    """
    if not cmd:
        raise ValueError("exec_command needs a command")
    if rank is not None and point is not None:
        raise ValueError("exec_command takes rank or point, not both")

    def work() -> int:
        if point is not None:
            target = host_mesh.slice(**point)
        elif rank is not None:
            target = host_mesh.flatten("rank").slice(rank=rank)
        else:
            target = host_mesh
        procs = target.spawn_procs(per_host=per_host)
        try:
            bash = procs.spawn("BashActor", BashActor)
            cwd = os.getcwd()
            if cmd[0].endswith(".py") or cmd[0] == "-m":
                results = bash.run_python.call(
                    cmd, env=env, workdir=workdir, client_cwd=cwd, output_dir=output_dir
                ).get()
            else:
                lines = ["#!/bin/bash"]
                lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
                if workdir:
                    lines.append(f"cd {shlex.quote(workdir)}")
                else:
                    lines.append(f"[ -d {shlex.quote(cwd)} ] && cd {shlex.quote(cwd)}")
                lines.append(shlex.join(cmd))
                results = bash.run.call("\n".join(lines) + "\n", output_dir=output_dir).get()
            worst = 0
            for _point, result in results:
                worst = max(worst, int(result.get("returncode", 1)))
                if output_dir is None:
                    if result.get("stdout"):
                        print(result["stdout"], end="")
                    if result.get("stderr"):
                        print(result["stderr"], end="", file=sys.stderr)
            return worst
        finally:
            procs.stop().get()

    fut: Future[int] = Future()
    ctx = contextvars.copy_context()  # the caller's Monarch context (client or actor)

    def run() -> None:
        try:
            fut.set_result(ctx.run(work))
        except BaseException as e:  # every ending settles the future
            fut.set_exception(e)

    # Not a daemon: interpreter exit waits for a command already committed.
    threading.Thread(target=run, name="monarch-exec-command").start()
    return fut
