"""``monarch demo``: a mesh of trainers on this machine, on an embedded broker."""

from __future__ import annotations

import time

from monarch.actor import Actor, current_rank, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    def train(self, step: int) -> float:
        return self.lr * step

    @endpoint
    def where(self) -> str:
        return f"rank {current_rank().rank} at {current_rank()!r}"


def run(gpus: int = 4) -> int:
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"gpus": gpus})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)
    for line in trainers.where.call().get(timeout=60).values():
        print("hello from", line)
    print("train(step=3) on every trainer:", trainers.train.call(step=3).get(timeout=60))
    one = gpus // 2
    print(
        f"train(step=1) on gpus={one} only:  ",
        trainers.slice(gpus=one).train.call_one(step=1).get(timeout=60),
    )
    t1 = time.perf_counter()
    n = 1000
    futures = [trainers.slice(gpus=0).train.call_one(step=i) for i in range(n)]
    for f in futures:
        f.get(timeout=60)
    t2 = time.perf_counter()
    print(f"{n} pipelined calls in {t2 - t1:.3f} s ({n / (t2 - t1):,.0f} calls/s)")
    procs.stop().get(timeout=60)
    print(f"demo finished in {time.perf_counter() - t0:.2f} s; every proc stopped")
    return 0
