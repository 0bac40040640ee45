"""A small job for the watch tests: a mesh called in a loop, one actor stalled, one failed.

    python tests/cli/watch_job.py      # prints "ready" once all is in place

Meshes: ``workers`` (2 actors, ``ping`` called in a loop), ``sleepy`` (rank 0
sleeps in ``sleep(3600)``: stalled once MONARCH_STALL_THRESHOLD passes; rank
1 slept 2.5 s before "ready": a stall that is over) and
``doomed`` (rank 1 raised from a broadcast: failed). It runs until a line (or
EOF) arrives on stdin, then stops its procs and exits 0.
"""

from __future__ import annotations

import sys
import threading
import time

import monarch.actor
from monarch.actor import Actor, endpoint, this_host


class Worker(Actor):
    @endpoint
    def ping(self, x: int = 0) -> int:
        return x

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("boom: this actor was broken on purpose")


def main() -> int:
    # The doomed actor's failure reaches this client; it is expected, not fatal.
    monarch.actor.unhandled_fault_hook = lambda failure: print("fault:", failure, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("workers", Worker)
    sleepy = procs.spawn("sleepy", Worker)
    doomed = procs.spawn("doomed", Worker)
    workers.ping.call().get(timeout=60)
    doomed.slice(gpus=1).boom.broadcast()
    sleepy.slice(gpus=0).sleep.broadcast(3600)
    sleepy.slice(gpus=1).sleep.call_one(2.5).get(timeout=60)  # a stall that ended
    print("ready", flush=True)
    n = 0
    while not stop.is_set():
        workers.ping.call(n).get(timeout=60)
        n += 1
        time.sleep(0.02)
    print(f"done after {n} rounds", flush=True)
    # The sleeping actor holds its proc's stop for MONARCH_STOP_TIMEOUT seconds.
    procs.stop().get(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
