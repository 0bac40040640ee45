"""A little cluster on one machine: network namespaces on a bridge, each its own "host".

:class:`Lab` makes a bridge with the first address of a free ``10.99.X.0/24``
and ``n`` namespaces, each joined to the bridge by a veth pair and given
``10.99.X.(10+i)``. Everything it makes has a random suffix, and
:meth:`Lab.close` removes it all (processes in the namespaces first), so a
failed test leaves nothing behind. :func:`unavailable` says why a lab cannot be
built here (not root, no ``ip``, no permission), for a skip message.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None if they can."""
    if shutil.which("ip") is None:
        return "no `ip` binary (iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"monprobe{secrets.token_hex(3)}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    ip("netns", "del", probe, check=False)
    return None


class Lab:
    def __init__(self, n: int) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"mbr{self.tag}"
        self.namespaces = [f"mon{self.tag}h{i}" for i in range(n)]
        self.subnet = _free_subnet()
        self.gateway = f"{self.subnet}.1"  # the bridge's address: where the broker listens
        self.addresses = [f"{self.subnet}.{10 + i}" for i in range(n)]
        self._veths: list[str] = []

    def open(self) -> Lab:
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
                outer, inner = f"mv{self.tag}{i}", f"mp{self.tag}{i}"
                ip("netns", "add", ns)
                ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                self._veths.append(outer)
                ip("link", "set", inner, "netns", ns)
                ip("link", "set", outer, "master", self.bridge, "up")
                ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
                ip("-n", ns, "link", "set", inner, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def prefix(self, i: int) -> list[str]:
        """Run a command on host ``i``: ``[*lab.prefix(i), "python", ...]``."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def pids(self, i: int) -> list[int]:
        out = ip("netns", "pids", self.namespaces[i], check=False).stdout
        return [int(x) for x in out.split()]

    def unplug(self, i: int) -> None:
        """Cut host ``i`` off the network; its processes go on running."""
        ip("link", "set", self._veths[i], "down")

    def kill(self, i: int) -> None:
        """Kill every process of host ``i``, as a power cut would."""
        for pid in self.pids(i):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for i in range(len(self.namespaces)):
            self.kill(i)
        for ns in self.namespaces:
            ip("netns", "del", ns, check=False)
        for veth in self._veths:
            ip("link", "del", veth, check=False)  # gone with its namespace, normally
        ip("link", "del", self.bridge, check=False)


def _free_subnet() -> str:
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route").stdout
    for x in random.sample(range(100, 250), 150):
        if f"10.99.{x}." not in used:
            return f"10.99.{x}"
    raise RuntimeError("no free 10.99.X.0/24 subnet")
