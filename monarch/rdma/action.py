"""``RDMAAction``: several transfers and atomics, submitted as one.

Operations are queued with Monarch's ``read_remote(dst, buf)`` /
``write_remote(buf, src)`` (local memory and buffer as in
``buf.read_into(dst)`` / ``buf.write_from(src)``, same size rules), with
``read_remote(buf, dst, offset)`` / ``write_remote(buf, src, offset)`` for a
part of a buffer, and with ``fetch_add`` / ``compare_and_swap`` (which
Monarch does not implement). ``submit()`` runs them: operations on buffers
of one owner run in the order they were added, different owners' run at the
same time; it may be called again to do the same work again. Arguments are
checked when an operation is added (ValueError, TypeError), so a bad action
fails before anything moves.

Atomics work on the 8-byte unsigned little-endian word at an 8-aligned
offset (ibverbs requires the alignment; the others keep the rule so code
behaves the same everywhere). With ibverbs they are the NIC's atomics. On
same_host and tcp they are done by the owner's bulk server under a lock per
buffer: atomic with respect to every other atomic on that buffer, from any
process, but not with respect to plain writes (which is also what RDMA
guarantees). Values wrap modulo 2**64; the old value is returned (and
stored into ``dst`` when one is given, as Monarch does).
"""

from __future__ import annotations

import threading
from typing import Any

from monarch.core.future import Future
from monarch.rdma import protocol as p
from monarch.rdma import transfer
from monarch.rdma.buffer import DEFAULT_TIMEOUT, RDMABuffer
from monarch.rdma.memory import Memory, as_memory


class RDMAAction:
    """A batch of operations on RDMA buffers (see the module docstring)."""

    def __init__(self) -> None:
        self._ops: list[tuple[str, RDMABuffer, int, Memory | None, int, int]] = []
        self._local_ranges: list[tuple[int, int, str]] = []  # (start, stop, op) of local memory

    # -- queueing ------------------------------------------------------------

    def read_remote(self, dst: Any, src: Any, offset: int | None = None) -> RDMAAction:
        """Queue a read of buffer ``src`` into local ``dst`` (Monarch's order and names).

        ``read_remote(buf, dst, offset)`` (buffer first) works too: the order
        is told by which argument is the RDMABuffer. The bytes copied are
        those of ``src.read_into(dst, offset=offset)``: all of the buffer into
        the start of ``dst`` without an offset, else ``len(dst)`` bytes from
        ``offset``.
        """
        buf, local = (src, dst) if isinstance(src, RDMABuffer) else (dst, src)
        if not isinstance(buf, RDMABuffer):
            raise TypeError(
                f"read_remote: one argument must be an RDMABuffer, got {type(buf).__name__}"
            )
        memory = as_memory(local, "read_remote destination", need_writable=True)
        start, memory = transfer.read_span(buf.handle, memory, offset, "read_remote")
        return self._add("read", buf, start, memory)

    def write_remote(self, dst: RDMABuffer, src: Any, offset: int = 0) -> RDMAAction:
        """Queue a write of all of local ``src`` into buffer ``dst`` from ``offset`` (Monarch's order)."""
        return self._write(dst, src, offset, "write_remote(dst, src)")

    def _write(self, buf: Any, local: Any, offset: int, call: str) -> RDMAAction:
        """Queue a write; errors name ``call``, the method the user called."""
        op = call.split("(")[0]
        if not isinstance(buf, RDMABuffer):
            raise TypeError(f"{call}: the buffer must be an RDMABuffer, got {type(buf).__name__}")
        memory = as_memory(local, f"{op} source")
        transfer.check_range(buf.handle, offset, memory.size, op, "source")
        transfer.check_writable(buf.handle, op)
        return self._add("write", buf, offset, memory)

    def read_into(self, src: RDMABuffer, dst: Any) -> RDMAAction:
        """Read all of ``src`` into ``dst`` (``read_remote(dst, src)``)."""
        return self.read_remote(dst, src)

    def write_from(self, src: RDMABuffer, dst: Any) -> RDMAAction:
        """Write local ``dst`` into buffer ``src`` (``write_remote(src, dst)``)."""
        return self._write(src, dst, 0, "write_from(src, dst)")

    def fetch_add(self, buf: RDMABuffer, offset: Any, value: int, *, dst: Any = None) -> RDMAAction:
        """Atomically add ``value`` to the word at ``offset``; the result holds the old value.

        Monarch's form ``fetch_add(buf, dst, add)`` (local ``dst`` in place of
        ``offset``) means offset 0 with the old value stored into ``dst``.
        """
        offset, dst = _offset_or_dst(offset, dst)
        return self._atomic("fetch_add", buf, offset, value, 0, dst)

    def compare_and_swap(
        self, buf: RDMABuffer, offset: Any, expected: int, new: int, *, dst: Any = None
    ) -> RDMAAction:
        """Atomically: if the word at ``offset`` equals ``expected``, make it ``new``; old value back."""
        offset, dst = _offset_or_dst(offset, dst)
        return self._atomic("compare_and_swap", buf, offset, expected, new, dst)

    # -- running ---------------------------------------------------------------

    def submit(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> Future[Any]:
        """Run every queued operation; a Future, done when all are.

        Its value is None, as in Monarch, unless the action holds atomics:
        then the list of results in the order added (None for reads and
        writes, the old value for atomics). The future fails with the first
        failed operation's error (in added order) once every owner's sequence
        has stopped. A negative timeout is an OverflowError (as in Monarch).
        """
        deadline = transfer.deadline_in(timeout)
        ops = list(self._ops)
        by_owner: dict[tuple[str, int], list[int]] = {}
        for i, op in enumerate(ops):
            by_owner.setdefault((op[1].handle.owner, op[1].handle.pid), []).append(i)
        results: list[Any] = [None] * len(ops)
        errors: dict[int, BaseException] = {}
        fut: Future[Any] = transfer.TransferFuture()
        atomics = any(op[0] not in ("read", "write") for op in ops)
        left = [len(by_owner)]
        lock = threading.Lock()

        def run_owner(indices: list[int]) -> None:
            try:
                for i in indices:
                    try:
                        results[i] = _run(ops[i], deadline)
                    except BaseException as e:
                        errors[i] = e
                        break  # later operations on this owner may depend on this one
            finally:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    if errors:
                        fut.set_exception(errors[min(errors)])
                    else:
                        fut.set_result(results if atomics else None)

        if not by_owner:
            fut.set_result(None)
        for indices in by_owner.values():
            transfer.executor().submit(run_owner, indices)
        return fut

    def __len__(self) -> int:
        return len(self._ops)

    # -- helpers ---------------------------------------------------------------

    def _atomic(
        self, op: str, buf: RDMABuffer, offset: int, a: int, b: int, dst: Any
    ) -> RDMAAction:
        transfer.check_range(buf.handle, offset, 8, op)
        transfer.check_writable(buf.handle, op)
        if offset % 8 or (buf.handle.addr + offset) % 8:
            raise ValueError(f"{op}: the word at offset {offset} is not 8-byte aligned")
        for name, v in (("value", a), ("new", b)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{op}: {name} must be an int, not {type(v).__name__}")
        memory = None
        if dst is not None:
            memory = as_memory(dst, f"{op} destination", need_writable=True)
            if memory.size != 8:
                raise ValueError(f"{op}: dst must be 8 bytes, got {memory.size}")
        return self._add(op, buf, offset, memory, a & p.MASK64, b & p.MASK64)

    def _add(
        self, op: str, buf: RDMABuffer, offset: int, memory: Memory | None, a: int = 0, b: int = 0
    ) -> RDMAAction:
        if memory is not None and memory.size:
            start, stop = memory.addr, memory.addr + memory.size
            for s, e, other in self._local_ranges:
                # Different owners' operations run concurrently: local memory that one of them
                # writes into (a read or an atomic's dst) must not be used by another.
                if start < e and s < stop and (op != "write" or other != "write"):
                    raise ValueError(
                        f"{op}: its local memory overlaps that of an earlier {other} in this action"
                    )
            self._local_ranges.append((start, stop, op))
        self._ops.append((op, buf, offset, memory, a, b))
        return self


def _offset_or_dst(offset: Any, dst: Any) -> tuple[int, Any]:
    if isinstance(offset, int) and not isinstance(offset, bool):
        return offset, dst
    if dst is not None:
        raise TypeError("give either an offset and dst=, or Monarch's (buf, dst, ...) form")
    return 0, offset


def _run(op: tuple, deadline: float) -> Any:
    name, buf, offset, memory, a, b = op
    if name == "read":
        return transfer.read(buf.handle, offset, memory, deadline)
    if name == "write":
        return transfer.write(buf.handle, offset, memory, deadline)
    old = transfer.atomic(buf.handle, name, offset, a, b, deadline)
    if memory is not None:
        staged = memory.cpu_view(fill=False)
        staged[:8] = old.to_bytes(8, "little")
        memory.commit(0, staged)
    return old
