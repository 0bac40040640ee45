"""Actors for the chaos test (importable by procs).

A :class:`ChaosOwner` owns one child proc with two :class:`ChaosWorker` actors
on it (two actor meshes of one actor each). Every message the test sends
carries a unique id; a worker appends the id to a file of its own (named by
pid and worker) and flushes it *before* it replies, so what a SIGKILLed
worker handled survives it. When the child proc dies, the owner's
``__supervise__`` spawns a fresh proc and workers, swaps them in, stops the
dead proc mesh, and returns True.

Mesh names carry the generation (``w0_g3``), so a failure tells the owner
which generation it concerns: one dead proc hosts two meshes and so brings two
failures; only the first, for the current generation, respawns.
"""

from __future__ import annotations

import os
import time

from monarch.actor import Actor, current_rank, endpoint, this_host

WORKERS_PER_PROC = 2


class ChaosWorker(Actor):
    def __init__(self, log_dir: str, name: str) -> None:
        self.file = open(os.path.join(log_dir, f"{os.getpid()}-{name}.ids"), "a")  # noqa: SIM115

    def _record(self, msg_id: str) -> None:
        self.file.write(msg_id + "\n")
        self.file.flush()  # in the kernel now: a SIGKILL from here on cannot lose it

    @endpoint
    def handle(self, msg_id: str) -> str:
        self._record(msg_id)
        time.sleep(0.002)  # widen the window in which a kill finds the call in flight
        return msg_id

    @endpoint
    def note(self, msg_id: str) -> None:
        self._record(msg_id)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.file.close()


class ChaosOwner(Actor):
    """Owns one child proc with two workers; respawns them when the proc dies."""

    def __init__(self, log_dir: str, timeout: float) -> None:
        self.log_dir = log_dir
        self.timeout = timeout
        self.rank = current_rank().rank
        self.generation = 0
        self.respawns = 0
        self.supervised: list[tuple[str, str, list[int]]] = []  # (mesh, reason, ranks)
        self.pids: list[int] = []  # every worker proc this owner started
        self._spawn()

    def _spawn(self) -> None:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        workers = [
            procs.spawn(f"w{i}_g{self.generation}", ChaosWorker, self.log_dir, f"w{i}")
            for i in range(WORKERS_PER_PROC)
        ]
        pids = {w.pid.call_one().get(timeout=self.timeout) for w in workers}
        (pid,) = pids  # both workers live in the one child proc
        self.procs, self.workers, self.pid = procs, workers, pid
        self.pids.append(pid)

    def __supervise__(self, failure) -> bool:
        self.supervised.append((failure.mesh_name, failure.reason, list(failure.ranks)))
        if not failure.mesh_name.endswith(f"_g{self.generation}"):
            return True  # the other mesh of a proc already replaced
        dead = self.procs
        self.generation += 1
        self._spawn()
        self.respawns += 1
        dead.stop().get(timeout=self.timeout)
        return True

    @endpoint
    def call(self, msg_id: str, worker: int) -> str:
        """One worker handles ``msg_id``; raises whatever that call raised."""
        return self.workers[worker].handle.call_one(msg_id).get(timeout=self.timeout)

    @endpoint
    def call_all(self, msg_id: str) -> list[str]:
        """Both workers handle ``<msg_id>.r<owner rank>.w<worker>``, concurrently."""
        futures = [
            w.handle.call_one(f"{msg_id}.r{self.rank}.w{i}") for i, w in enumerate(self.workers)
        ]
        return [f.get(timeout=self.timeout) for f in futures]

    @endpoint
    def note(self, msg_id: str) -> None:
        """Broadcast ``<msg_id>.r<owner rank>.w<worker>`` on to both workers (no reply)."""
        for i, w in enumerate(self.workers):
            w.note.broadcast(f"{msg_id}.r{self.rank}.w{i}")

    @endpoint
    def state(self) -> dict:
        return {
            "owner_pid": os.getpid(),
            "pid": self.pid,
            "pids": list(self.pids),
            "generation": self.generation,
            "respawns": self.respawns,
            "supervised": list(self.supervised),
        }
