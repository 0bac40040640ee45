"""Transports, and the one function that picks one for a buffer: :func:`choose_transport`.

Best first: ``ibverbs`` (both ends have an RDMA device), ``same_host`` (the
owner runs on this host and ptrace rules let us copy its memory), ``tcp``
(always). ``MONARCH_RDMA_TRANSPORT`` forces one; a forced transport that
cannot reach the buffer is a :class:`TransportUnavailableError`, never a
silent fallback. In ``auto`` mode, a transport that turns out not to work
for a peer (``EPERM``, a failed queue-pair setup) is remembered for that
peer and the next one is used; the reason is logged once per peer.

The transports themselves import nothing from :mod:`monarch.actors`; the
ibverbs queue-pair exchange is handed in by :mod:`monarch.rdma.control`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from monarch.rdma import config
from monarch.rdma.errors import TransportDenied, TransportUnavailableError
from monarch.rdma.handle import BufferHandle, host_id
from monarch.rdma.transports import ibverbs, same_host
from monarch.rdma.transports.base import Transport
from monarch.rdma.transports.ibverbs import Exchange, IbverbsTransport
from monarch.rdma.transports.same_host import SameHostTransport
from monarch.rdma.transports.tcp import TcpTransport

__all__ = ["Transport", "choose_transport", "run", "tcp_transport", "best_available"]
__all__ += ["set_ibverbs_exchange", "close_all"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_tcp = TcpTransport()
_same_host = SameHostTransport(_tcp)
_ibverbs: IbverbsTransport | None = None
_denied: dict[tuple[str, str, int, int], str] = {}  # (transport, host id, pid, start) -> why
_allowed: set[tuple[str, str, int, int]] = set()  # peers whose ptrace check passed
_lock = threading.Lock()


def set_ibverbs_exchange(exchange: Exchange) -> None:
    """Install how the ibverbs transport asks an owner for a queue pair (over NATS)."""
    global _ibverbs
    _ibverbs = IbverbsTransport(exchange)


def tcp_transport() -> TcpTransport:
    """The tcp transport (also used for ``drop``/``ack`` requests to an owner)."""
    return _tcp


def _peer(name: str, h: BufferHandle) -> tuple[str, str, int, int]:
    return (name, h.host_id, h.pid, h.start_time)


def _usable(name: str, h: BufferHandle) -> tuple[Transport | None, str]:
    """(transport, "") when ``name`` can reach ``h`` from here, else (None, why not)."""
    why = _denied.get(_peer(name, h))
    if why:
        return None, why
    if name == "tcp":
        return _tcp, ""
    if name == "same_host":
        ok, why = same_host.available()
        if not ok:
            return None, why
        if h.host_id != host_id():
            return None, "the owner runs on another host (or in another pid namespace)"
        if h.device != "cpu":
            return None, f"the buffer is in {h.device} memory, which process_vm_readv cannot copy"
        if _peer(name, h) in _allowed:
            return _same_host, ""
        ok, why = same_host.ptrace_allows(h.pid)  # reads /proc: done once per peer
        if ok:
            _allowed.add(_peer(name, h))
        return (_same_host, "") if ok else (None, why)
    ok, why = ibverbs.status()
    if not ok:
        return None, why
    if not h.rkey:
        return None, "the owner registered the buffer with no RDMA device"
    if _ibverbs is None:
        return None, "no queue-pair exchange is installed (no runtime)"
    return _ibverbs, ""


def choose_transport(handle: BufferHandle) -> Transport:
    """The transport to use for ``handle`` from this process (see the module docstring)."""
    forced = config.forced_transport()
    if forced is not None:
        transport, why = _usable(forced, handle)
        if transport is None:
            raise TransportUnavailableError(
                f"MONARCH_RDMA_TRANSPORT={forced}, but it cannot reach {handle.describe()}: {why}"
            )
        return transport
    for name in ("ibverbs", "same_host"):
        transport, why = _usable(name, handle)
        if transport is not None:
            return transport
        if name == "same_host" and handle.host_id == host_id() and handle.device == "cpu":
            _note(name, handle, why)  # same host, yet not usable: say why once
    return _tcp


def run(handle: BufferHandle, op: Callable[[Transport], T]) -> T:
    """``op(transport)`` with the chosen transport; on ``TransportDenied``, remember and retry."""
    while True:
        transport = choose_transport(handle)
        try:
            return op(transport)
        except TransportDenied as e:
            if config.forced_transport() is not None or transport is _tcp:
                raise TransportUnavailableError(str(e)) from e
            _note(transport.name, handle, str(e))


def _note(name: str, h: BufferHandle, why: str) -> None:
    key = _peer(name, h)
    with _lock:
        if key in _denied:
            return
        _denied[key] = why
    log.warning("not using %s for proc %s (pid %d): %s; falling back", name, h.owner, h.pid, why)


def best_available() -> str:
    """The best transport this process could use with a peer on this host (forced one if set)."""
    forced = config.forced_transport()
    if forced is not None:
        return forced
    if ibverbs.status()[0] and _ibverbs is not None:
        return "ibverbs"
    if same_host.available()[0] and (same_host.ptrace_scope() or 0) <= 1:
        return "same_host"
    return "tcp"


def close_all() -> None:
    """Drop pooled connections and queue pairs (they are re-created on next use)."""
    _tcp.close()
    if _ibverbs is not None:
        _ibverbs.close()
