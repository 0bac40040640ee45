"""A proc's memory under sustained pipelined calls: what its lost-replies ledger keeps.

    python benchmarks/bench_reply_memory.py [--seconds 60] [--burst 1000]

One proc holding one sync ``Echo``; the client sends ``call_one`` pipelined,
``--burst`` at a time (each burst waited for), for ``--seconds``, and asks
the proc for its PSS (``/proc/self/smaps_rollup``) every 100,000 calls. Every
reply is kept by the proc's ledger (``monarch/actors/messaging/lost_replies.py``)
for ``REPLY_TTL`` within ``REPLY_CACHE_BYTES``: the curve shows whether that
cap holds at this rate (benchmarks/NOTES.md 44). Run it from a folder with no
``monarch/`` folder in it, with this checkout on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import time

from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def pss_mb(self) -> int:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) // 1024
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--burst", type=int, default=1000, help="calls in flight at once")
    args = ap.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", Echo)
    echo.ping.call_one(0).get(timeout=60)
    print(f"proc PSS at start: {echo.pss_mb.call_one().get(timeout=60)} MB")
    start = time.monotonic()
    calls, next_mark = 0, 100_000
    print("   s   calls    PSS MB")
    while time.monotonic() - start < args.seconds:
        for f in [echo.ping.call_one(i) for i in range(args.burst)]:
            f.get(timeout=60)
        calls += args.burst
        if calls >= next_mark:
            next_mark += 100_000
            pss = echo.pss_mb.call_one().get(timeout=60)
            print(f"{time.monotonic() - start:4.0f} {calls:9,} {pss:7}")
    elapsed = time.monotonic() - start
    print(f"{calls:,} calls in {elapsed:.1f} s ({calls / elapsed:,.0f}/s); "
          f"proc PSS at the end: {echo.pss_mb.call_one().get(timeout=60)} MB")  # fmt: skip
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
