"""The owner side of this process: its registered buffers and the bulk server that serves them.

Created on first use (the first ``RDMABuffer`` or out-of-band message of the
process) and closed with the runtime (``runtime().on_close``), which stops
the server and releases every registration. The server listens on the
address this process reaches the broker from (peers that can reach the
broker from the same network can reach it), or ``MONARCH_RDMA_HOST``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from urllib.parse import urlparse

from monarch.core.process_runtime import runtime
from monarch.core.runtime import Runtime
from monarch.rdma import config
from monarch.rdma.control import serve_queue_pairs
from monarch.rdma.handle import BufferHandle, host_id, process_start_time
from monarch.rdma.memory import Memory
from monarch.rdma.registry import Entry, Registry
from monarch.rdma.server import BulkServer
from monarch.rdma.transports.ibverbs import Verbs, open_verbs

log = logging.getLogger(__name__)


def advertised_host(nats_url: str) -> str:
    """``MONARCH_RDMA_HOST``, else the local IPv4 address used to reach the broker."""
    forced = config.bind_host()
    if forced:
        return forced
    # Any server of the list will do; one that is down may no longer resolve.
    for server in (nats_url or "").split(","):
        u = urlparse(server.strip())
        target = (u.hostname or "127.0.0.1", u.port or 4222)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(target)  # no packet is sent: this only asks the kernel for a route
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


class Owner:
    """Registrations and bulk server of one process (one per runtime)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.registry = Registry()
        self.registry.on_release = self._on_release
        self.server = BulkServer(self.registry, advertised_host(rt.nats_url))
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid) or 0
        self.host_id = host_id()
        self.verbs: Verbs | None = open_verbs()
        if self.verbs is not None:
            serve_queue_pairs(rt, self.verbs)

    def register(
        self, memory: Memory, *, readers: int | None = None, ttl: float | None = None
    ) -> BufferHandle:
        """Register ``memory``; its handle. ``readers``/``ttl`` make it a bulk body (see registry)."""
        entry = self.registry.add(memory, readers=readers, ttl=ttl)
        rkey, device = 0, ""
        if self.verbs is not None:
            try:
                entry.extra = self.verbs.register(memory.addr, memory.size)
                rkey, device = entry.extra.rkey, self.verbs.name
            except Exception as e:  # e.g. CUDA memory without GPUDirect: peers use tcp
                log.info(
                    "buffer %d not registered with %s: %s", entry.buffer_id, self.verbs.name, e
                )
        host, port = self.server.address
        return BufferHandle(
            owner=self.rt.proc_uid,
            pid=self.pid,
            start_time=self.start_time,
            host_id=self.host_id,
            host=host,
            port=port,
            buffer_id=entry.buffer_id,
            key=entry.key,
            addr=memory.addr,
            size=memory.size,
            state_addr=self.registry.word_address(entry),
            device=memory.device,
            writable=memory.writable,
            rkey=rkey,
            ibv_device=device,
        )

    def owns(self, handle: BufferHandle) -> bool:
        return handle.pid == self.pid and handle.host_id == self.host_id

    def close(self) -> None:
        self.server.close()
        self.registry.clear()

    @staticmethod
    def _on_release(entry: Entry) -> None:
        if entry.extra is not None:
            entry.extra.close()  # deregister the memory region from the NIC


_owner: Owner | None = None
_lock = threading.Lock()


def local_owner() -> Owner:
    """This process's owner side, created (with its server) on first use."""
    global _owner
    rt = runtime()
    owner = _owner
    if owner is not None and owner.rt is rt:
        return owner
    with _lock:
        if _owner is None or _owner.rt is not rt:
            _owner = Owner(rt)
            rt.on_close(_close_owner(_owner))
        return _owner


def current_owner() -> Owner | None:
    """The owner side if this process has one (never creates it)."""
    return _owner


def _close_owner(owner: Owner):
    def close() -> None:
        global _owner
        owner.close()
        with _lock:
            if _owner is owner:
                _owner = None

    return close
