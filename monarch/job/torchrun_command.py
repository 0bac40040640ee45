"""What a torchrun command line asks for: the script to run, and how many workers per node.

:func:`monarch.job.spmd.serve` takes the command a user would type
(``torchrun --nproc-per-node=4 --standalone train.py --lr 0.1``) and runs
the script on Monarch procs instead of torchrun's elastic agent, as Monarch
0.7's ``serve`` does. Only the parts of the command that decide *what* runs
and *how many* matter here; torchrun's rendezvous, restart and logging
options are accepted and left to the proc mesh (one rendezvous is made per
``run_spmd``, failures are supervision's). The three spellings torchrun has
are understood::

    torchrun [options] train.py [args]            (or -m module)
    python -m torch.distributed.run [options] ... (or -m torchrun)
    python train.py [args]                         (one worker, as ``python`` alone runs one)
"""

from __future__ import annotations

import argparse
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

_TORCHRUN_MODULES = ("torch.distributed.run", "torchrun")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class TorchrunCommand:
    """The script a torchrun command runs and its worker counts.

    ``script_args`` is what :meth:`monarch.spmd.SPMDActor.main` takes:
    ``[path, *args]`` or ``["-m", module, *args]``. ``nnodes`` is None when
    the command does not say (one node, or as many as the scheduler gives).
    """

    script_args: list[str]
    nproc_per_node: int
    nnodes: int | None


def starts_command(word: str) -> bool:
    """Whether ``word`` (a torchx role's entrypoint) is where a torchrun or python command starts."""
    return _is_torchrun(word) or _is_python(word)


def _is_python(word: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(word)))


def _is_torchrun(word: str) -> bool:
    return os.path.basename(word) in _TORCHRUN_MODULES


def _options() -> argparse.ArgumentParser:
    """torchrun's own options, so that their values are not taken for the script."""
    p = argparse.ArgumentParser(prog="torchrun", add_help=False, allow_abbrev=False)
    p.add_argument("--nnodes", default=None)
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("--no-python", "--no_python", action="store_true")
    p.add_argument("--run-path", "--run_path", action="store_true")
    for flag in (
        "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--max-restarts",
        "--monitor-interval", "--start-method", "--role", "--log-dir", "--redirects", "--tee",
        "--local-ranks-filter", "--node-rank", "--master-addr", "--master-port", "--local-addr",
        "--logs-specs", "--event-log-handler", "--signals-to-handle",
    ):  # fmt: skip
        p.add_argument(flag, flag.replace("-", "_").replace("__", "--", 1))
    p.add_argument("-r", dest="redirects_short")
    p.add_argument("-t", dest="tee_short")
    p.add_argument("training_script", nargs="?")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _nnodes(value: str | None) -> int | None:
    """``--nnodes`` as a node count: ``N`` or ``N:N``; an elastic range is refused."""
    if value is None:
        return None
    lo, _, hi = value.strip().partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--nnodes must be N or N:N, got {value!r}") from None
    if low != high:
        raise ValueError(
            f"--nnodes={value}: an elastic node range is not supported; "
            "a run_spmd runs on the hosts the job has, so give one count"
        )
    if low < 1:
        raise ValueError(f"--nnodes must be at least 1, got {value!r}")
    return low


def _nproc(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        # torchrun's gpu/cpu/auto would be counted on each node; Monarch 0.7 runs one.
        warnings.warn(
            f"--nproc-per-node={value} is not an integer, so one worker per node runs "
            "(as in Monarch); give the number instead",
            stacklevel=4,
        )
        return 1
    if n < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {value!r}")
    return n


def parse_torchrun(command: Sequence[str]) -> TorchrunCommand:
    """Read a torchrun (or python) command line; ValueError saying what is wrong with it."""
    words = list(command)
    if not words or not all(isinstance(w, str) for w in words):
        raise ValueError(f"a command is a non-empty list of strings, got {command!r}")
    if _is_torchrun(words[0]):
        rest = words[1:]
    elif _is_python(words[0]):
        if len(words) >= 3 and words[1] == "-m" and words[2] in _TORCHRUN_MODULES:
            rest = words[3:]
        elif len(words) >= 2:
            return TorchrunCommand(words[1:], 1, None)  # python script.py: one worker
        else:
            raise ValueError(f"{words[0]} with no script to run")
    else:
        raise ValueError(
            "the command must start with torchrun, python -m torch.distributed.run or "
            f"python, got {words[0]!r}"
        )
    args, unknown = _options().parse_known_args(rest)
    if unknown:
        raise ValueError(f"torchrun options not understood: {unknown}")
    if args.no_python:
        raise ValueError(
            "--no-python: SPMDActor runs Python scripts and modules in its proc, not executables"
        )
    if not args.training_script:
        raise ValueError(f"no training script in {words!r}")
    script = ["-m", args.training_script] if args.module else [args.training_script]
    nnodes = 1 if args.standalone else _nnodes(args.nnodes)
    return TorchrunCommand(
        script + list(args.training_script_args), _nproc(args.nproc_per_node), nnodes
    )
