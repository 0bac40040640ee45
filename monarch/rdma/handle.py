"""``BufferHandle``: everything a peer needs to reach one registered buffer.

A handle is small and travels freely inside what carries it (an
``RDMABuffer``: codec ext type 20; a big message's ``BulkRef``: 21; pickle). It names the owner (proc uid, pid, process start time, host id),
where its bulk server listens, the buffer's id, address and size, and a
random 16-byte access key: a peer must present the key, so guessing ids or
addresses cannot read another process's memory. Whoever holds a handle may
read (and, unless it is read-only, write) the buffer: treat it like a
capability.

The host id tells whether two processes may copy memory directly
(:mod:`~monarch.rdma.transports.same_host`): the machine id and boot id say
"same kernel", the pid namespace says "these pids mean the same processes"
(containers on one host share the first two).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class BufferHandle:
    owner: str  # the owning process's proc uid
    pid: int
    start_time: int  # the owner's start time (clock ticks after boot): tells a reused pid apart
    host_id: str
    host: str  # the owner's bulk server
    port: int
    buffer_id: int
    key: bytes  # 16 random bytes; the server refuses requests without it
    addr: int  # address of the first byte in the owner's memory
    size: int
    state_addr: int  # address of the owner's registration word for this buffer (see registry)
    device: str  # "cpu" or "cuda:N"
    writable: bool
    rkey: int = 0  # ibverbs remote key, 0 when the owner registered no RDMA device
    ibv_device: str = ""  # the owner's ibverbs device name

    @property
    def token(self) -> int:
        """The value of the registration word while the buffer is registered (never 0)."""
        return int.from_bytes(self.key[:8], "little") | 1

    @property
    def server(self) -> tuple[str, int]:
        return self.host, self.port

    def describe(self) -> str:
        """For error messages: which buffer, whose."""
        return (
            f"buffer {self.buffer_id} ({self.size} bytes on {self.device}) of proc {self.owner} "
            f"(pid {self.pid}, bulk server {self.host}:{self.port})"
        )

    def fields(self) -> list:
        return [
            self.owner,
            self.pid,
            self.start_time,
            self.host_id,
            self.host,
            self.port,
            self.buffer_id,
            self.key,
            self.addr,
            self.size,
            self.state_addr,
            self.device,
            self.writable,
            self.rkey,
            self.ibv_device,
        ]

    @classmethod
    def from_fields(cls, fields: list) -> BufferHandle:
        return cls(*fields)


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """This process's host identity: machine id, boot id and pid namespace, hashed."""
    parts = []
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            parts.append("")
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("")
    if not any(parts):  # nothing to go on: never claim to share a host
        parts.append(f"{os.uname().nodename}-{os.getpid()}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
