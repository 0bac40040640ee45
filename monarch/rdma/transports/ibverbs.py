"""The ibverbs transport: one-sided RDMA READ/WRITE and atomics through pyverbs.

NOT VERIFIED ON HARDWARE. It is written against rdma-core's documented
pyverbs API (``Context``, ``PD``, ``MR``, ``CQ``, ``QP``, ``SendWR``), and
the parts that need no device (finding pyverbs, detection, building the
queue-pair attributes and work requests) are tested; nothing here has moved
a byte over a real RDMA NIC. Without a device it is simply never chosen.

How it works: the owner registers each buffer's memory with its NIC (the
handle carries the ``rkey``). A reader creates an RC queue pair per owner
process and exchanges queue-pair details with the owner over NATS (a
request on the owner's ``mon.<ns>.rdma.<proc-uid>`` subject, see
:mod:`monarch.rdma.control`); the owner creates its side and both move to
RTS. Then reads and writes are RDMA READ/WRITE work requests from a memory
region registered over the caller's memory for the duration of the call,
and atomics are IB atomics (fetch-and-add, compare-and-swap on 8 aligned
bytes, done by the owner's NIC).

pyverbs is a compiled extension of the *system* python (Debian's
``python3-pyverbs`` installs it in /usr/lib/python3/dist-packages). When it
is not importable from this interpreter, :func:`import_pyverbs` loads that
copy, but only if its extension modules are built for this interpreter's
ABI (their file names end in this interpreter's ``SOABI``); it never adds
the whole system dist-packages to ``sys.path``. Debian's pyverbs calls
``logging.basicConfig`` as it loads; :func:`import_pyverbs` undoes that, so the
process's logging stays as its user set it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import random
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from monarch.rdma.config import gid_index, ibverbs_device
from monarch.rdma.errors import RDMAError, RDMATimeoutError, TransportDenied
from monarch.rdma.handle import BufferHandle
from monarch.rdma.memory import buffer_address
from monarch.rdma.transports.base import Transport

log = logging.getLogger(__name__)
SYSTEM_PYVERBS = "/usr/lib/python3/dist-packages/pyverbs"
_PIECE = 1 << 30  # bytes per work request (below every NIC's max_msg_sz we know of)
Exchange = Callable[[BufferHandle, dict], dict]


def import_pyverbs() -> ModuleType | None:
    """pyverbs (with ``device``, ``pd``, ``mr``, ``cq``, ``qp``, ``wr``, ``addr``, ``enums``), or None."""
    with _root_logger_kept():
        return _import_pyverbs()


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """Put the root logger's handlers and level back as they were.

    Loading Debian's pyverbs calls ``logging.basicConfig``: in a client that had
    not configured logging, the root logger would gain a stderr handler at level
    INFO (our own INFO records would start to print, and the user's later
    ``basicConfig`` would do nothing).
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)


def _import_pyverbs() -> ModuleType | None:
    try:
        pv = importlib.import_module("pyverbs")
    except ImportError:
        pv = _load_system_pyverbs()
        if pv is None:
            return None
    try:
        for sub in ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums"):
            importlib.import_module(f"pyverbs.{sub}")
    except ImportError as e:
        log.debug("pyverbs found but not usable: %s", e)
        return None
    return pv


def _load_system_pyverbs() -> ModuleType | None:
    soabi = sysconfig.get_config_var("SOABI") or ""
    try:
        names = os.listdir(SYSTEM_PYVERBS)
    except OSError:
        return None
    if not soabi or not any(n.endswith(f".{soabi}.so") for n in names):
        log.debug("%s is not built for this interpreter (%s)", SYSTEM_PYVERBS, soabi)
        return None
    spec = importlib.util.spec_from_file_location(
        "pyverbs",
        os.path.join(SYSTEM_PYVERBS, "__init__.py"),
        submodule_search_locations=[SYSTEM_PYVERBS],
    )
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pyverbs"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules["pyverbs"]
        log.debug("loading %s failed: %s", SYSTEM_PYVERBS, e)
        return None
    return module


@functools.lru_cache(maxsize=1)
def status() -> tuple[bool, str]:
    """(available, why not): pyverbs importable and at least one RDMA device present."""
    pv = import_pyverbs()
    if pv is None:
        return False, "pyverbs is not importable (Debian: apt-get install python3-pyverbs)"
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        return False, "no RDMA device (/sys/class/infiniband is empty or missing: no ib modules)"
    try:
        devices = pv.device.get_device_list()
    except Exception as e:
        return False, f"pyverbs cannot list devices: {e}"
    if not devices:
        return False, "pyverbs lists no RDMA device"
    return True, ""


# -- pure builders (testable without a device) ------------------------------------


def rts_attributes(pv: ModuleType, local: dict, remote: dict, port: int, gid_index: int) -> Any:
    """The QPAttr that takes an RC queue pair to RTR and then RTS, connected to ``remote``."""
    e = pv.enums
    attr = pv.qp.QPAttr()
    attr.path_mtu = local["mtu"]
    attr.dest_qp_num = remote["qpn"]
    attr.rq_psn = remote["psn"]
    attr.max_dest_rd_atomic = 16
    attr.min_rnr_timer = 12
    attr.qp_access_flags = (
        e.IBV_ACCESS_LOCAL_WRITE
        | e.IBV_ACCESS_REMOTE_READ
        | e.IBV_ACCESS_REMOTE_WRITE
        | e.IBV_ACCESS_REMOTE_ATOMIC
    )
    route = pv.addr.GlobalRoute(dgid=pv.addr.GID(remote["gid"]), sgid_index=gid_index)
    attr.ah_attr = pv.addr.AHAttr(dlid=remote["lid"], port_num=port, is_global=1, gr=route)
    attr.timeout, attr.retry_cnt, attr.rnr_retry = 14, 7, 7
    attr.sq_psn = local["psn"]
    attr.max_rd_atomic = 16
    return attr


def work_request(
    pv: ModuleType,
    op: str,
    local_addr: int,
    length: int,
    lkey: int,
    rkey: int,
    remote_addr: int,
    a: int = 0,
    b: int = 0,
) -> Any:
    """One signaled send work request: ``read``, ``write``, ``fetch_add`` or ``compare_and_swap``."""
    e = pv.enums
    opcode = {
        "read": e.IBV_WR_RDMA_READ,
        "write": e.IBV_WR_RDMA_WRITE,
        "fetch_add": e.IBV_WR_ATOMIC_FETCH_AND_ADD,
        "compare_and_swap": e.IBV_WR_ATOMIC_CMP_AND_SWP,
    }[op]
    sge = pv.wr.SGE(local_addr, length, lkey)
    wr = pv.wr.SendWR(wr_id=1, opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
    if op in ("read", "write"):
        wr.set_wr_rdma(rkey=rkey, addr=remote_addr)
    else:
        wr.set_wr_atomic(rkey=rkey, addr=remote_addr, compare_add=a, swap=b)
    return wr


# -- one process's device -------------------------------------------------------------


class Verbs:
    """This process's open device: context, protection domain, port details."""

    ACCESS_NAMES = (
        "IBV_ACCESS_LOCAL_WRITE",
        "IBV_ACCESS_REMOTE_READ",
        "IBV_ACCESS_REMOTE_WRITE",
        "IBV_ACCESS_REMOTE_ATOMIC",
    )

    def __init__(self, pv: ModuleType) -> None:
        self.pv = pv
        first = pv.device.get_device_list()[0].name
        name = ibverbs_device() or (first.decode() if isinstance(first, bytes) else first)
        self.name = name
        self.port = 1
        self.gid_index = gid_index()
        self.ctx = pv.device.Context(name=name)
        self.pd = pv.pd.PD(self.ctx)
        port = self.ctx.query_port(self.port)
        self.lid, self.mtu = port.lid, port.active_mtu
        self.gid = self.ctx.query_gid(self.port, self.gid_index).gid
        self.access = 0
        for flag in self.ACCESS_NAMES:
            self.access |= getattr(pv.enums, flag)
        self._accepted: list[tuple[Any, Any]] = []  # the owner side's queue pairs, kept alive

    def register(self, addr: int, size: int, access: int | None = None) -> Any:
        """A memory region over existing memory (``MR(pd, length, access, address=...)``)."""
        return self.pv.mr.MR(self.pd, size, self.access if access is None else access, address=addr)

    def new_qp(self) -> tuple[Any, Any, dict]:
        pv = self.pv
        cq = pv.cq.CQ(self.ctx, 64)
        cap = pv.qp.QPCap(max_send_wr=64, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = pv.qp.QPInitAttr(qp_type=pv.enums.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
        qp = pv.qp.QP(self.pd, init)
        info = {
            "qpn": qp.qp_num,
            "psn": random.getrandbits(24),
            "lid": self.lid,
            "gid": self.gid,
            "mtu": self.mtu,
        }
        return qp, cq, info

    def connect(self, qp: Any, local: dict, remote: dict) -> None:
        attr = rts_attributes(self.pv, local, remote, self.port, self.gid_index)
        qp.to_rts(attr)  # pyverbs goes through INIT and RTR on the way

    def accept(self, request: dict) -> dict:
        """Owner side of the queue-pair exchange: create, connect, answer with our details."""
        qp, cq, info = self.new_qp()
        self.connect(qp, info, request)
        self._accepted.append((qp, cq))
        return info


@functools.lru_cache(maxsize=1)
def open_verbs() -> Verbs | None:
    """The device of this process, opened on first use; None if there is none or it fails."""
    ok, why = status()
    if not ok:
        return None
    try:
        return Verbs(import_pyverbs())  # type: ignore[arg-type]
    except Exception as e:
        log.warning("ibverbs device could not be opened, using other transports: %s", e)
        return None


class IbverbsTransport(Transport):
    name = "ibverbs"

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        self._qps: dict[tuple[str, int], tuple[Any, Any, threading.Lock]] = {}
        self._lock = threading.Lock()

    def read(self, handle: BufferHandle, offset: int, dst: memoryview, *, deadline: float) -> None:
        self._bulk("read", handle, offset, dst, deadline)

    def write(self, handle: BufferHandle, offset: int, src: memoryview, *, deadline: float) -> None:
        self._bulk("write", handle, offset, src, deadline)

    def atomic(
        self, handle: BufferHandle, op: str, offset: int, a: int, b: int = 0, *, deadline: float
    ) -> int:
        result = bytearray(8)
        self._bulk(op, handle, offset, memoryview(result), deadline, a, b)
        return int.from_bytes(result, "little")  # unverified: some NICs may answer big-endian

    def _bulk(
        self,
        op: str,
        h: BufferHandle,
        offset: int,
        local: memoryview,
        deadline: float,
        a: int = 0,
        b: int = 0,
    ) -> None:
        verbs = open_verbs()
        if verbs is None or not h.rkey:
            raise TransportDenied("no usable ibverbs device on one side")
        qp, cq, lock = self._qp_for(verbs, h, deadline)
        base = buffer_address(local)
        # The NIC writes into local memory for reads and atomics, and only reads it for writes
        # (so a read-only source, such as bytes, can be registered too).
        access = 0 if op == "write" else verbs.pv.enums.IBV_ACCESS_LOCAL_WRITE
        mr = verbs.register(base, len(local), access)
        try:
            with lock:
                for start in range(0, len(local), _PIECE):
                    n = min(_PIECE, len(local) - start)
                    wr = work_request(
                        verbs.pv,
                        op,
                        base + start,
                        n,
                        mr.lkey,
                        h.rkey,
                        h.addr + offset + start,
                        a,
                        b,
                    )
                    qp.post_send(wr)
                    self._wait(verbs, cq, h, deadline)
        finally:
            mr.close()

    def _wait(self, verbs: Verbs, cq: Any, h: BufferHandle, deadline: float) -> None:
        while True:
            n, wcs = cq.poll()
            if n:
                if wcs[0].status != verbs.pv.enums.IBV_WC_SUCCESS:
                    self._forget(h)
                    raise RDMAError(f"{h.describe()}: work completion status {wcs[0].status}")
                return
            if time.monotonic() > deadline:
                self._forget(h)  # the queue pair's state is unknown now: never reuse it
                raise RDMATimeoutError(f"{h.describe()}: no completion before the deadline")
            time.sleep(0)

    def _qp_for(self, verbs: Verbs, h: BufferHandle, deadline: float) -> tuple:
        key = (h.owner, h.pid)
        with self._lock:
            if key in self._qps:
                return self._qps[key]
        qp, cq, info = verbs.new_qp()
        try:
            answer = self._exchange(h, {"op": "connect", **info})
        except RDMAError as e:
            raise TransportDenied(f"queue-pair exchange with {h.owner} failed: {e}") from e
        if "error" in answer:
            raise TransportDenied(f"{h.owner} refused a queue pair: {answer['error']}")
        verbs.connect(qp, info, answer)
        entry = (qp, cq, threading.Lock())
        with self._lock:
            return self._qps.setdefault(key, entry)

    def _forget(self, h: BufferHandle) -> None:
        with self._lock:
            self._qps.pop((h.owner, h.pid), None)

    def close(self) -> None:
        with self._lock:
            self._qps.clear()
