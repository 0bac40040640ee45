"""Host addresses (Monarch 0.7's ``monarch.tools.network``): this host's name or IP, a free TCP port.

:mod:`monarch.spmd` uses them for torch elastic's master address: ``get_host_port(None)``
answers the host name, as torchrun's ``--master-addr`` default does; an
``AddrType`` asks for an IP address of that family instead, for clusters whose
host names do not resolve everywhere.
"""

from __future__ import annotations

import enum
import ipaddress
import socket


class AddrType(enum.Enum):
    """Which IP family :func:`get_ipaddr` resolves a host name to."""

    Default = enum.auto()  # IPv6 when the host has one, else IPv4
    IPv4 = enum.auto()
    IPv6 = enum.auto()


_FAMILIES = {
    AddrType.Default: (socket.AF_INET6, socket.AF_INET),
    AddrType.IPv4: (socket.AF_INET,),
    AddrType.IPv6: (socket.AF_INET6,),
}


def find_free_port() -> int:
    """A TCP port free on this host right now (the OS picks it; it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """An address of ``hostname`` that other hosts can open a TCP connection to.

    Link-local addresses (``fe80::/10``, ``169.254.0.0/16``) are skipped: they
    do not route beyond one network segment. Raises ``RuntimeError`` when no
    family asked for resolves, ``TypeError`` for anything but an ``AddrType``.
    """
    if not isinstance(addr_type, AddrType):
        raise TypeError(f"use_ipaddr must be an AddrType or None, got {addr_type!r}")
    for family in _FAMILIES[addr_type]:
        try:
            infos = socket.getaddrinfo(hostname, port, family, socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for *_, sockaddr in infos[:1]:  # the resolver's first choice, as a client would use
            addr = str(sockaddr[0])
            if not ipaddress.ip_address(addr).is_link_local:
                return addr
    families = "/".join(f.name for f in _FAMILIES[addr_type])
    raise RuntimeError(
        f"cannot resolve host {hostname!r} to a usable {families} address for TCP: "
        "check the host's network configuration, or pass master_addr explicitly"
    )


def get_sockaddr(hostname: str, port: int) -> str:
    """``ip:port`` (``[ip6]:port`` for IPv6) of ``hostname``, IPv6 preferred, as Monarch 0.7.

    Raises ``RuntimeError`` when the host resolves to no usable address.
    """
    addr = get_ipaddr(hostname, port, AddrType.Default)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
