"""What direct reading and writing through are worth, measured within one run.

    python benchmarks/bench_broker_io.py [--cycles 12] [--procs 4]

This machine's speed drifts by 10-20% from one minute to the next, more than
either change is worth, so two runs (one with, one without) compare the
minutes more than the changes. Here one client and its procs switch both
changes on and off together, between blocks of calls, cycling through four
variants (``both``, ``read`` = direct reading only, ``write`` = writing
through only, ``neither`` = nats-py's own tasks), so every variant sees the
same minutes. Each block: 300 ``call_one`` round trips to one actor (S1),
1,000 pipelined ``call_one`` (S2), 100 broadcast-and-gather rounds over all
procs (S3). Prints per variant the S1 p50/p99 over all its blocks and the
medians of S2 and S3. No assertion: figures for benchmarks/NOTES.md.

The switches reach into the runtime's connection (``nc``) of each process; in
a real job both are on (``MONARCH_DIRECT_READ``, ``MONARCH_WRITE_THROUGH``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from monarch.actor import Actor, endpoint, this_host
from monarch.core.runtime import runtime

VARIANTS = {"both": (True, True), "read": (True, False), "write": (False, True),
            "neither": (False, False)}  # fmt: skip
SETTLE = 8.0  # seconds of idling after the spawn (the torch zygote's import, NOTES 29)


def switch(read: bool, write: bool) -> None:
    """In this process: direct reading and writing through on or off (on the loop)."""
    rt = runtime()

    def flip() -> None:
        nc = rt.nc
        reader, through = nc._monarch_direct_read, nc._monarch_write_through
        if write:
            nc._flush_pending = through.flush_pending
        else:
            vars(nc).pop("_flush_pending", None)  # nats-py's own method again
        if read:
            reader.reader = None
            reader.take_over_when_parked()
        else:
            vars(nc._transport._io_reader).pop("feed_data", None)  # to nats-py's reader task

    rt.loop.call_soon_threadsafe(flip)
    time.sleep(0.05)


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def switch(self, read: bool, write: bool) -> None:
        switch(read, write)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--procs", type=int, default=4)
    args = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    mesh = procs.spawn("io_echo", Echo)
    mesh.ping.call(0).get()
    one = mesh.slice(gpus=0)
    time.sleep(SETTLE)
    s1: dict[str, list[float]] = {v: [] for v in VARIANTS}
    s2: dict[str, list[float]] = {v: [] for v in VARIANTS}
    s3: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.cycles):
        for name, (read, write) in VARIANTS.items():
            mesh.switch.call(read, write).get()
            switch(read, write)
            for i in range(300):
                t = time.perf_counter()
                one.ping.call_one(i).get()
                s1[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            futures = [one.ping.call_one(i) for i in range(1000)]
            for f in futures:
                f.get()
            s2[name].append(1000 / (time.perf_counter() - t))
            t = time.perf_counter()
            for i in range(100):
                mesh.ping.call(i).get()
            s3[name].append(100 / (time.perf_counter() - t))
    print(f"{args.cycles} cycles of 4 blocks, {args.procs} procs")
    for name in VARIANTS:
        lat = sorted(s1[name])
        p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
        print(
            f"{name:8s} S1 p50 {p50:5.0f} us  p99 {p99:6.0f} us   "
            f"S2 {statistics.median(s2[name]):7.0f} calls/s   "
            f"S3 {statistics.median(s3[name]):6.0f} rounds/s"
        )


if __name__ == "__main__":
    main()
