"""The recovery scenario on the Monarch actor API alone: runs on ours or on the real Monarch 0.7.

    python benchmarks/recovery_scenario.py [--runs N]      (run from a folder with no monarch/ in it)

Written for the public API both share (``monarch.actor``), with each
framework's default settings, so that the two figures are comparable. An
owner actor (``Owner``, on a proc of its own) spawns a 1-proc worker mesh; the
script SIGKILLs the worker's process from outside and measures, per run:

  supervise  SIGKILL -> the owner's ``__supervise__`` runs;
  ready      SIGKILL -> a replacement (a fresh 1-proc mesh and actor, started
             by the owner when it saw the failure) answers a call.

Prints one JSON line per run: ``{"run": i, "supervise": s, "ready": s}``; a run
whose failure does not arrive within ``--timeout`` prints ``"error"``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from monarch.actor import Actor, endpoint, this_host


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    """Owns one worker at a time; on its failure, notes the time and starts a replacement."""

    def __init__(self) -> None:
        self.procs = None
        self.old = []
        self.seen: list[tuple[str, float]] = []  # (mesh name, when)

    @endpoint
    def start(self, name: str) -> int:
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        return self.procs.spawn(name, Worker).pid.call_one().get()

    def __supervise__(self, failure) -> bool:
        self.seen.append((str(failure.mesh_name), time.time()))
        return True

    @endpoint
    def supervised(self) -> list:
        return list(self.seen)

    @endpoint
    def replace(self, name: str) -> float:
        self.old.append(self.procs)
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        self.procs.spawn(name, Worker).pid.call_one().get()
        return time.time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--warmup", type=int, default=1, help="runs first, reported as warmup")
    args = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"procs": 1})
    owner = procs.spawn("owner", Owner)
    for i in range(args.warmup + args.runs):
        tag = f"worker{i}x"  # a failure is this run's when its mesh name contains the tag
        pid = owner.start.call_one(tag).get()
        time.sleep(0.2)
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = t0 + args.timeout
        hits: list = []
        while not hits and time.time() < deadline:
            hits = [t for name, t in owner.supervised.call_one().get() if tag in name]
            time.sleep(0.005)
        if not hits:
            print(
                json.dumps({"run": i, "error": f"no __supervise__ in {args.timeout} s"}), flush=True
            )
            break
        ready = owner.replace.call_one(f"replacement{i}").get()
        row = {"run": i, "supervise": min(hits) - t0, "ready": ready - t0}
        print(json.dumps({**row, "warmup": i < args.warmup}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the dead workers' meshes may make a graceful stop wait; the run is over


if __name__ == "__main__":
    main()
