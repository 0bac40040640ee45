"""Telling whether the process that left a file behind is gone, and writing private files.

A process that is SIGKILLed (or ends by ``os._exit``) cannot remove what it
wrote to disk: an embedded broker's store directory (with its token), a job
record (:mod:`monarch.broker.connections.job_records`). Whoever comes next judges such a
leftover by the identity its owner wrote into it: the pid alone is not enough
(pids are reused), so the process's start time, the boot and the pid
namespace go with it. Shared by every writer of such files so that they all
judge alike.
"""

from __future__ import annotations

import os
from typing import Any

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows


def process_identity(pid: int) -> dict[str, Any]:
    """What tells process ``pid`` apart from a later one given the same pid."""
    return {"pid": pid, "start": start_time(pid), "boot": boot_id(), "pidns": pid_namespace()}


def owner_gone(owner: dict[str, Any]) -> bool:
    """Whether the process ``owner`` (a :func:`process_identity`) has ended.

    False where we cannot tell (another pid namespace, no start time): a
    leftover is only removed when its owner is surely gone. Raises ``KeyError``
    or ``TypeError``/``ValueError`` for a malformed identity.
    """
    if owner["boot"] != boot_id():
        return True  # the machine restarted since: every process of then is gone
    if owner["pidns"] != pid_namespace():
        return False  # its pids are not ours to look up
    start = owner["start"]
    return start is not None and start_time(int(owner["pid"])) != start


def start_time(pid: int) -> int | None:
    """Process start time (clock ticks after boot, /proc/<pid>/stat field 22); None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in (), may hold spaces
    except (OSError, IndexError):
        return None
    return int(fields[19])  # fields[0] is field 3, the state


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def write_private(path: str, text: str) -> None:
    """Write a file only its owner can read, atomically (a reader never sees half of it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
