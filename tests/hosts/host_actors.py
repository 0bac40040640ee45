"""Actors for the host tests (importable by procs the agents start)."""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlsplit

from monarch.actor import Actor, current_rank, endpoint


class Where(Actor):
    """Says where it runs: which agent started it, its devices, its address."""

    @endpoint
    def where(self) -> dict:
        return {
            "host_uid": os.environ.get("MONARCH_HOST_UID"),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "rank": current_rank().rank,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "address": address_towards_broker(),
        }

    @endpoint
    def ping(self, x: int = 0) -> int:
        return x

    @endpoint
    def exit(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def address_towards_broker() -> str:
    """The source IP this process uses to reach its broker."""
    u = urlsplit(os.environ["MONARCH_NATS_URL"].split(",")[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((u.hostname, u.port or 4222))
        return s.getsockname()[0]


class HowStarted(Actor):
    """Says how its proc was started: its CPUs, command line, Python, some environment."""

    @endpoint
    def how(self) -> dict:
        with open("/proc/self/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        with open("/proc/self/numa_maps") as f:  # the memory policy: "default", "bind:0"...
            policy = f.readline().split()[1]
        return {
            "cpus": sorted(os.sched_getaffinity(0)),
            "memory_policy": policy,
            "argv0": argv[0],
            "mark": os.environ.get("HOW_MARK"),
            "home": os.environ.get("HOME"),
            "wrapper": os.environ.get("HOW_WRAPPER_PID"),
            "host_uid": os.environ.get("MONARCH_HOST_UID"),
        }
