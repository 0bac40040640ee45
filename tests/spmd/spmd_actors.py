"""Actors for the SPMD tests (module level, so procs can import them)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint, this_host
from monarch.spmd import SPMDActor

ENV_KEYS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
]  # fmt: skip


class EnvProbe(Actor):
    """Reads its proc's environment, as code in any actor of that proc would see it."""

    @endpoint
    def env(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in ENV_KEYS}


class SpmdOwner(Actor):
    """Owns a 4-proc mesh running an SPMD script; records the failures it is told about.

    ``start`` returns once the script is running; the call's outcome is kept
    for ``outcome`` so the owner stays free to handle ``__supervise__`` and
    other calls while the script runs.
    """

    def __init__(self) -> None:
        self.failures: list = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 4}, name="spmd_owned")
        self.workers = self.procs.spawn("_SPMDActor", SPMDActor)
        self.running = None

    def __supervise__(self, failure) -> bool:
        self.failures.append(failure)
        return True  # handled: the owner lives on and reports

    @endpoint
    def start(self, script_args: list[str]) -> None:
        addr, port = self.workers.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        self.running = self.workers.main.call(addr, port, script_args)

    @endpoint
    def seen(self) -> list[tuple[str, str, list[int], str]]:
        return [(f.mesh_name, f.reason, f.ranks, f.report()) for f in self.failures]

    @endpoint
    def outcome(self, timeout: float) -> str:
        """``ok``, or the type and text of the error the script's call ended with."""
        try:
            self.running.get(timeout=timeout)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "ok"
