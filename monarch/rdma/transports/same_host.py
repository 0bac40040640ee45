"""The same-host transport: one-sided copies with ``process_vm_readv``/``process_vm_writev``.

The kernel copies straight between the two processes' memory (one copy, no
socket, the owner's threads not involved), which is what makes it the best
transport short of RDMA hardware. It needs the owner's pid on the same host
(the handle's host id says so) and ptrace permission over it: same user, and
Yama's ``kernel.yama.ptrace_scope`` 0 (or 1 when the owner is a descendant of
the reader, as procs are of their client), or ``CAP_SYS_PTRACE``.
:func:`ptrace_allows` predicts that; ``EPERM`` from the kernel has the last
word and makes the caller fall back to tcp (``TransportDenied``).

Since the owner is not involved, each copy also reads the buffer's
registration word (see :mod:`monarch.rdma.registry`): after a read, and
before and after a write. A dropped buffer or a pid now used by another
process shows as a wrong word, so the copy is reported failed, not done.
Atomics go to the owner's bulk server (tcp): the kernel offers no atomic
cross-process operation.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from monarch.rdma.errors import (
    BufferDroppedError,
    OwnerGoneError,
    RDMAError,
    RDMATimeoutError,
    TransportDenied,
)
from monarch.rdma.handle import BufferHandle, process_start_time
from monarch.rdma.memory import buffer_address
from monarch.rdma.transports.base import Transport

_PIECE = 256 << 20  # bytes per system call: bounds the time between deadline checks
_MIN_LANE = 16 << 20  # below this, one thread copies it all
LANES = max(1, min(4, os.cpu_count() or 1))  # threads copying one transfer at once
_lanes: ThreadPoolExecutor | None = None
_lanes_lock = threading.Lock()
_CAP_SYS_PTRACE = 19


def _lane_pool() -> ThreadPoolExecutor:
    """Threads for the extra lanes of big copies (they never wait on anything, so cannot
    deadlock with the transfers that use them)."""
    global _lanes
    with _lanes_lock:
        if _lanes is None:
            _lanes = ThreadPoolExecutor(max(1, 2 * (LANES - 1)), thread_name_prefix="monarch-lane")
        return _lanes


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load() -> tuple[object, object] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fns = []
    for name in ("process_vm_readv", "process_vm_writev"):
        fn = getattr(libc, name, None)
        if fn is None:
            return None
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IoVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        fns.append(fn)
    return fns[0], fns[1]


_FNS = _load()


def available() -> tuple[bool, str]:
    """Whether this platform has the system calls at all."""
    if _FNS is None:
        return False, "process_vm_readv is not available (Linux only)"
    return True, ""


def ptrace_scope() -> int | None:
    """Yama's ptrace scope (0-3), or None when Yama is not in the kernel."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _has_cap_sys_ptrace() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        pass
    return False


def _is_descendant(pid: int) -> bool:
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ptrace_allows(pid: int) -> tuple[bool, str]:
    """Whether this process may copy ``pid``'s memory, and if not, why (for the log)."""
    if pid == os.getpid():
        return True, ""
    cap = _has_cap_sys_ptrace()
    owner_uid = _uid_of(pid)
    if owner_uid is not None and owner_uid != os.geteuid() and not cap:
        return False, f"pid {pid} runs as uid {owner_uid}, this process as {os.geteuid()}"
    scope = ptrace_scope()
    if scope is None or scope == 0 or cap and scope < 3:
        return True, ""
    if scope == 1:
        if _is_descendant(pid):
            return True, ""
        return False, (
            f"kernel.yama.ptrace_scope=1 lets a process read only its descendants and pid {pid} "
            "is not one (sysctl kernel.yama.ptrace_scope=0 allows it)"
        )
    return False, f"kernel.yama.ptrace_scope={scope} forbids it without CAP_SYS_PTRACE"


class SameHostTransport(Transport):
    name = "same_host"

    def __init__(self, helper: Transport) -> None:
        self._helper = helper  # the tcp transport, for atomics

    def read(self, handle: BufferHandle, offset: int, dst: memoryview, *, deadline: float) -> None:
        self._copy(0, handle, handle.addr + offset, dst, deadline)
        self._check(handle, "read")  # the bytes are good only if still registered after the copy

    def write(self, handle: BufferHandle, offset: int, src: memoryview, *, deadline: float) -> None:
        self._check(handle, "write")
        self._copy(1, handle, handle.addr + offset, src, deadline)
        self._check(handle, "write", after_write=True)

    def atomic(
        self, handle: BufferHandle, op: str, offset: int, a: int, b: int = 0, *, deadline: float
    ) -> int:
        return self._helper.atomic(handle, op, offset, a, b, deadline=deadline)

    # -- system calls ------------------------------------------------------------

    def _copy(
        self, direction: int, h: BufferHandle, remote: int, local: memoryview, deadline: float
    ) -> None:
        """Copy in up to ``LANES`` contiguous parts at once: one core's copy (and page-fault)
        bandwidth is well below the machine's (5 vs 10 GB/s with 2 lanes on the 2-core box
        this was measured on, see benchmarks/NOTES.md)."""
        n = len(local)
        if not n:
            return
        base = buffer_address(local)
        lanes = max(1, min(LANES, n // _MIN_LANE))
        step = -(-n // lanes)
        parts = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
        others = [
            _lane_pool().submit(
                self._copy_part, direction, h, base + lo, remote + lo, hi - lo, deadline
            )
            for lo, hi in parts[1:]
        ]
        error: BaseException | None = None
        try:
            self._copy_part(direction, h, base, remote, parts[0][1], deadline)
        except BaseException as e:
            error = e
        for fut in others:  # wait for every lane, even after an error: they use `local`
            try:
                fut.result()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _copy_part(
        self, direction: int, h: BufferHandle, base: int, remote: int, n: int, deadline: float
    ) -> None:
        fn = _FNS[direction]  # type: ignore[index]
        done = 0
        while done < n:
            if time.monotonic() > deadline:
                raise RDMATimeoutError(f"{h.describe()}: timed out after {done} of {n} bytes")
            k = min(_PIECE, n - done)
            liov, riov = _IoVec(base + done, k), _IoVec(remote + done, k)
            got = fn(h.pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
            if got < 0:
                self._fail(h, ctypes.get_errno(), "read" if direction == 0 else "write")
            if got == 0:
                raise RDMAError(f"{h.describe()}: the kernel copied nothing")
            done += got

    def _fail(self, h: BufferHandle, err: int, what: str) -> None:
        if err == errno.EPERM:
            raise TransportDenied(f"process_vm_{what}v on pid {h.pid}: permission denied (EPERM)")
        if err == errno.ESRCH:
            raise OwnerGoneError(f"{h.describe()}: the owner process has exited")
        if err == errno.EFAULT:
            self._check(h, what)  # a dropped and freed buffer reads as this
        raise RDMAError(f"{h.describe()}: process_vm_{what}v failed: {os.strerror(err)}")

    def _check(self, h: BufferHandle, what: str, after_write: bool = False) -> None:
        word = ctypes.c_uint64(0)
        liov = _IoVec(ctypes.addressof(word), 8)
        riov = _IoVec(h.state_addr, 8)
        got = _FNS[0](h.pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)  # type: ignore[index]
        if got < 0:
            err = ctypes.get_errno()
            if err == errno.EPERM:
                raise TransportDenied(f"process_vm_readv on pid {h.pid}: permission denied")
            if err == errno.ESRCH:
                raise OwnerGoneError(f"{h.describe()}: the owner process has exited")
        if got == 8 and word.value == h.token:
            return
        if process_start_time(h.pid) != h.start_time:
            raise OwnerGoneError(f"{h.describe()}: the owner process has exited")
        landed = " (some bytes may have landed in the released memory)" if after_write else ""
        raise BufferDroppedError(f"{what} of {h.describe()} failed: it was dropped{landed}")
