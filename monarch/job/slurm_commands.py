"""Talking to Slurm and to this process's runtime, for :mod:`monarch.job.slurm`.

Every Slurm command runs with a timeout and its output parsed in one place;
``job_state`` asks ``squeue`` first (pending/running jobs) and falls back to
``scontrol`` (jobs that ended recently); no accounting database is assumed,
so ``sacct`` is not used. The job's broker, when the batch script runs one,
is handed to this process's runtime by :func:`use_broker` and taken back by
:func:`release_broker`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from monarch.actor import shutdown_context
from monarch.core.process_runtime import current_runtime_or_none

# Slurm states after which a job's hosts are gone for good.
TERMINAL = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
_CMD_TIMEOUT = 30.0  # seconds any one Slurm command may take


class SlurmJobError(RuntimeError):
    """The Slurm job could not be submitted, did not start, or ended; names the job id and state."""

    def __init__(self, message: str, job_id: str | None = None, state: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


def run_slurm(*cmd: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=_CMD_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise SlurmJobError(f"{cmd[0]} not found: is this a Slurm login node?") from None


def job_state(job_id: str) -> tuple[str, str]:
    """``(state, reason)`` of a Slurm job from squeue, else scontrol; ``("GONE", "")`` if unknown."""
    r = run_slurm("squeue", "-h", "-j", job_id, "-o", "%T|%r")
    line = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    if line:
        state, _, reason = line.partition("|")
        return state, reason
    r = run_slurm("scontrol", "show", "job", "-o", job_id)
    if r.returncode == 0:
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        return fields.get("JobState", "GONE"), fields.get("Reason", "")
    return "GONE", ""


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner can read (created 0600, never widened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = shlex.split(value)[0] if value else ""
    return out


def use_broker(url: str, token: str) -> None:
    """Make this process's runtime use ``url``; an error if it already uses another broker."""
    rt = current_runtime_or_none()
    if rt is not None and rt.nats_url != url:
        raise SlurmJobError(
            f"this process already uses the broker {rt.nats_url!r}, but the Slurm job runs its "
            f"own at {url!r}: call job.state() before anything else, or set MONARCH_NATS_URL "
            "to a shared broker before applying the job"
        )
    os.environ["MONARCH_NATS_URL"] = url
    if token:
        os.environ["MONARCH_NATS_TOKEN"] = token


def release_broker(url: str) -> None:
    """The job's broker is going: stop this process's runtime if it uses it, and forget it."""
    rt = current_runtime_or_none()
    if rt is not None and rt.nats_url == url:
        shutdown_context().get(timeout=60)
    if os.environ.get("MONARCH_NATS_URL") == url:
        os.environ.pop("MONARCH_NATS_URL", None)
        os.environ.pop("MONARCH_NATS_TOKEN", None)
