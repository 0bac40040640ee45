"""``proc_bind``: the CPUs and NUMA nodes each proc of a host runs on.

``spawn_procs(proc_bind=[...])`` takes one dict per proc of a host, with
Monarch 0.7's keys:

* ``cpus`` (what Monarch hands to ``taskset -c``) and ``physcpubind``: CPU lists
  (``"0-3,8"``); the proc is bound to them with ``sched_setaffinity`` between
  fork and exec, which is what ``taskset`` does, without needing it;
* ``cpunodebind`` and ``membind``: NUMA node lists; the proc starts under
  ``numactl`` with them (and ``--physcpubind``, if given), as Monarch's does.
  Monarch then ignores ``cpus``; here ``cpus`` beside them is an error (say
  ``physcpubind``, which numactl takes).

The same binding is applied wherever the procs start: by the client on its own
machine (:class:`~monarch.actors.procs.command_launcher.CommandLauncher`) or by
a host agent on its (:mod:`monarch.hosts.agent`), which checks it against its
machine (:meth:`ProcBind.check_here`) before it starts anything. Monarch starts
the proc and lets ``numactl`` or ``taskset`` fail; here a CPU the machine does not
give, a NUMA node it lacks or a missing ``numactl`` is an error naming it, raised
before any proc of the mesh starts.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
from pathlib import Path

KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")
_NUMA_KEYS = ("cpunodebind", "membind")
_NODES = Path("/sys/devices/system/node")


def cpu_list(text: str, what: str = "CPU list") -> frozenset[int]:
    """``"0-3,8"`` (the kernel's and numactl's list format) as a set of numbers."""
    out: set[int] = set()
    try:
        for part in str(text).replace(" ", "").split(","):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                raise ValueError
            out.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"proc_bind: {text!r} is not a {what} such as '0-3,8'") from None
    return frozenset(out)


@dataclasses.dataclass(frozen=True)
class ProcBind:
    """One proc's binding: CPUs set before exec, or ``numactl`` options to start it under."""

    cpus: frozenset[int] = frozenset()
    numactl: tuple[str, ...] = ()  # ("--cpunodebind=0", "--membind=0", ...)
    nodes: frozenset[int] = frozenset()  # the NUMA nodes those options name

    @classmethod
    def from_dict(cls, bind: dict[str, str]) -> ProcBind:
        """One entry of ``proc_bind``; ValueError for unknown keys or malformed lists."""
        if not isinstance(bind, dict):
            raise TypeError(f"each proc_bind entry must be a dict, got {bind!r}")
        unknown = sorted(set(bind) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown proc_bind key(s) {unknown}; known: {list(KEYS)}")
        if any(k in bind for k in _NUMA_KEYS):  # numactl binds it all, as in Monarch
            if "cpus" in bind:
                raise ValueError(
                    "proc_bind 'cpus' beside 'cpunodebind'/'membind': the proc starts under "
                    "numactl, which takes its CPUs as 'physcpubind'"
                )
            nodes: frozenset[int] = frozenset()
            options = []
            for key in _NUMA_KEYS:
                if key in bind:
                    nodes |= cpu_list(bind[key], "NUMA node list")
                    options.append(f"--{key}={bind[key]}")
            if "physcpubind" in bind:
                cpu_list(bind["physcpubind"])  # checked here, applied by numactl
                options.append(f"--physcpubind={bind['physcpubind']}")
            return cls(numactl=tuple(options), nodes=nodes)
        cpus: frozenset[int] = frozenset()
        for key in ("cpus", "physcpubind"):
            if key in bind:
                cpus |= cpu_list(bind[key])
        return cls(cpus=cpus)

    def check_here(self) -> None:
        """Whether this machine can start a proc so bound; ValueError / RuntimeError naming why."""
        host = socket.gethostname()
        if self.cpus:
            allowed = os.sched_getaffinity(0)
            missing = sorted(self.cpus - allowed)
            if missing:
                raise ValueError(
                    f"proc_bind CPUs {missing} are not among the CPUs procs may use on {host} "
                    f"({_ranges(allowed)})"
                )
        if self.numactl:
            if shutil.which("numactl") is None:
                raise RuntimeError(
                    f"proc_bind {' '.join(self.numactl)} starts procs under numactl, which is "
                    f"not installed on {host}"
                )
            missing = sorted(n for n in self.nodes if not (_NODES / f"node{n}").is_dir())
            if missing:
                raise ValueError(
                    f"proc_bind names NUMA node(s) {missing}, which {host} does not have "
                    f"({_NODES} lists {_ranges(_nodes_here())})"
                )

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` started under ``numactl`` when the binding needs it."""
        if not self.numactl:
            return argv
        return [shutil.which("numactl") or "numactl", *self.numactl, *argv]

    def in_child(self) -> None:
        """Between fork and exec: run on the bound CPUs (numactl does its own binding)."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)


def parse_binds(binds: list[dict[str, str]], per_host: int) -> list[ProcBind]:
    """``proc_bind`` as Monarch takes it: one dict per proc of a host, in per-host rank order."""
    if len(binds) != per_host:
        raise ValueError(f"proc_bind length ({len(binds)}) must equal procs_per_host ({per_host})")
    return [ProcBind.from_dict(b) for b in binds]


def _nodes_here() -> set[int]:
    return {int(p.name[4:]) for p in _NODES.glob("node[0-9]*")} if _NODES.is_dir() else set()


def _ranges(numbers: set[int] | frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` as ``"0-2,5"``; ``"none"`` when empty."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and out[-1].rpartition("-")[2] == str(n - 1):
            out[-1] = f"{out[-1].partition('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out) or "none"
