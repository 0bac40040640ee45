"""Running a training script inside a proc the way ``torchrun`` runs it in a worker.

``script_args`` is torchrun's tail: ``[path, *argv]`` or ``["-m", module, *argv]``.
The script runs with ``__name__ == "__main__"`` and ``sys.argv`` set as
``python path argv...`` (or ``python -m module argv...``) would set them, on the
calling thread (the actor's own), so its ``print`` output goes through the
proc's log forwarding like any actor's.

How it ends decides what the caller sees, as in Monarch 0.7:

- it returns, or calls ``sys.exit(0)`` / ``sys.exit()``: success (``True``);
  Monarch 0.7 fails the actor on any ``SystemExit``, even 0, which torchrun
  counts as success: here it is success;
- it raises an ``Exception``: the exception goes to the caller (``ActorError``
  with the script's traceback), the actor lives on;
- ``sys.exit(n)`` with ``n`` non-zero (or a message): the ``SystemExit`` is
  re-raised, which fails the actor as any ``BaseException`` does: the caller
  gets ``SupervisionError`` and the mesh's owner ``__supervise__`` a failure,
  both with the exit status and the traceback;
- the process dies (a signal, ``os._exit``): the proc's death is reported.

Unlike Monarch, ``sys.argv`` and ``sys.path`` are put back afterwards, and the
script's directory (or, for ``-m``, the working directory) is first on
``sys.path`` while it runs, as under ``python``, so a script can import the
modules next to it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import socket
import sys
from collections.abc import Iterator, Sequence


def parse_script_args(script_args: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    """``(path, module, argv)`` from torchrun's tail; raises on malformed input.

    Raises ``TypeError`` unless ``script_args`` is a list of strings, and
    ``ValueError`` when it names no script or module (Monarch's message).
    """
    if isinstance(script_args, (str, bytes)) or not isinstance(script_args, Sequence):
        raise TypeError(
            f"script_args must be a list of strings ([path, *args] or ['-m', module, *args]), "
            f"got {script_args!r}"
        )
    args = list(script_args)
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise TypeError(f"script_args must all be strings, got {bad!r} in {args!r}")
    if not args:
        raise ValueError("No script or module specified")
    if args[0] == "-m":
        if len(args) < 2 or not args[1]:
            raise ValueError("No module specified after '-m'")
        return None, args[1], [args[1], *args[2:]]
    return args[0], None, args


def _where() -> str:
    return f"on host {socket.gethostname()} (pid {os.getpid()}, cwd {os.getcwd()})"


def _check_exists(path: str | None, module: str | None) -> None:
    """A precise error for a script or module that is not there, before anything runs."""
    if path is not None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"SPMD script {path!r} does not exist {_where()}")
        return
    assert module is not None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:  # a missing parent package, or a bad name
        raise ModuleNotFoundError(f"No module named {module!r} {_where()}: {e}", name=module) from e
    if spec is None:
        raise ModuleNotFoundError(f"No module named {module!r} {_where()}", name=module)


@contextlib.contextmanager
def _script_sys(argv: list[str], first_on_path: str) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as ``python`` sets them, restored afterwards."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = list(argv)
    sys.path.insert(0, first_on_path)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def exit_status(code: object) -> int:
    """The process exit status ``sys.exit(code)`` would give, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):  # bool too: sys.exit(True) exits 1
        return int(code)
    return 1  # a message: printed to stderr, status 1


def run_script(script_args: Sequence[str]) -> bool:
    """Run the script in this process; ``True`` when it ends well (see the module docstring)."""
    path, module, argv = parse_script_args(script_args)
    _check_exists(path, module)
    target = f"-m {module}" if module is not None else repr(path)
    if path is not None:
        first = os.path.dirname(os.path.abspath(path))
    else:
        first = os.getcwd()
    try:
        with _script_sys(argv, first):
            if module is not None:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        status = exit_status(e.code)
        if status == 0:
            return True
        if not isinstance(e.code, int):  # the interpreter would print the message
            print(e.code, file=sys.stderr)
        e.add_note(f"the SPMD script {target} exited with status {status} {_where()}")
        raise
    return True
