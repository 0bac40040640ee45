"""Where the microseconds of one ``call_one`` round trip go, step by step.

    python benchmarks/bench_call_anatomy.py [--calls 2000] [--settle 8]

A client spawns 2 procs with an ``Echo`` actor each, idles ``--settle``
seconds (the runtime's start-up work, our torch zygote's import, is then
over), and makes ``--calls`` round trips to a sync endpoint of one of them.
Both sides stamp ``time.perf_counter_ns()`` (one monotonic clock for all
processes of a machine) at each hand-over, by wrapping the runtime's own
functions for the length of the run, so every call is cut into:

* the caller's own work (checks, encoding) up to the hand-over to the loop;
* caller -> client loop: the loop's wake-up;
* client loop -> publish: the runtime's send path up to nats-py's publish;
* publish -> callee mailbox: nats-py's flusher, the socket, nats-server, the
  callee's socket, nats-py's reader and parser, our intake and routing;
* mailbox -> actor thread, the endpoint (with its decoding and encoding),
  actor thread -> callee loop, callee loop -> publish: the callee's hand-overs;
* publish -> client's gather, and gather -> caller again: the way back.

Prints p50 and p90 of each step; no assertion. A step that is a network leg
can be set beside ``compare/run.py``'s raw nats-py round trip, which has two
legs and none of the hand-overs (benchmarks/NOTES.md entry 29).
"""

from __future__ import annotations

import argparse
import bisect
import os
import time
from typing import Any

from monarch.actor import Actor, endpoint, this_host

STEPS = [
    "caller's own work",
    "caller -> client loop",
    "client loop -> publish",
    "publish -> callee mailbox",
    "mailbox -> actor thread",
    "endpoint on actor thread",
    "actor thread -> callee loop",
    "callee loop -> publish",
    "publish -> client gather",
    "gather -> caller",
    "round trip",
]


def stamp_handovers(log: list[tuple[str, int]]) -> None:
    """Wrap the runtime's hand-over points in this process so each appends (what, ns) to ``log``."""
    from monarch.actors.calls import gather
    from monarch.actors.hosting import instance, mailbox
    from monarch.core.runtime import Runtime

    def wrap(owner: Any, name: str, label: str, after: str | None = None) -> None:
        inner = getattr(owner, name)

        def stamped(*args: Any, **kwargs: Any) -> Any:
            log.append((label, time.perf_counter_ns()))
            result = inner(*args, **kwargs)
            if after is not None:
                log.append((after, time.perf_counter_ns()))
            return result

        setattr(owner, name, stamped)

    wrap(Runtime, "call_soon", "handed")  # a thread hands work over to the loop
    wrap(Runtime, "_drain_inbox", "drain")  # a hand-over from another thread reaches the loop
    wrap(Runtime, "_publish_now", "publish")
    wrap(mailbox.ThreadRunner, "put", "mailbox")
    wrap(instance.ActorInstance, "_invoke_sync", "start", after="end")
    wrap(gather.Gather, "on_msg", "gather")


CALLEE_LOG: list[tuple[str, int]] = []


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def stamp(self) -> None:
        stamp_handovers(CALLEE_LOG)

    @endpoint
    def stamps(self) -> list[tuple[str, int]]:
        out = list(CALLEE_LOG)
        CALLEE_LOG.clear()
        return out


def _by_kind(log: list[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for kind, t in log:
        out.setdefault(kind, []).append(t)
    for times in out.values():
        times.sort()
    return out


def _first(kind: str, t: int | None, log: dict[str, list[int]]) -> int | None:
    """The first stamp of ``kind`` at or after ``t`` (other traffic stamps too: heartbeats)."""
    if t is None:
        return None
    times = log.get(kind, [])
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=8.0)
    args = ap.parse_args()

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    one = procs.spawn("echo", Echo).slice(gpus=0)
    one.ping.call_one(0).get(60)
    time.sleep(args.settle)
    one.stamp.call_one().get(60)
    client_log: list[tuple[str, int]] = []
    stamp_handovers(client_log)
    for i in range(200):  # warm-up
        one.ping.call_one(i).get(60)
    one.stamps.call_one().get(60)
    client_log.clear()

    calls = []
    for i in range(args.calls):
        begin = time.perf_counter_ns()
        one.ping.call_one(i).get(60)
        calls.append((begin, time.perf_counter_ns(), list(client_log)))
        client_log.clear()
    callee = _by_kind([tuple(x) for x in one.stamps.call_one().get(60)])
    procs.stop().get(60)

    steps: dict[str, list[int]] = {s: [] for s in STEPS}
    for begin, back, log in calls:
        mine = _by_kind(log)
        handed = _first("handed", begin, mine)
        drain = _first("drain", handed, mine)
        sent = _first("publish", drain, mine)
        taken = _first("mailbox", sent, callee)
        start = _first("start", taken, callee)
        end = _first("end", start, callee)
        posted = _first("drain", end, callee)
        replied = _first("publish", posted, callee)
        gathered = _first("gather", replied, mine)
        chain = [begin, handed, drain, sent, taken, start, end, posted, replied, gathered, back]
        if None in chain or gathered > back:  # type: ignore[operator]
            continue  # a stamp of other traffic in between: not this call's chain
        for name, a, b in zip(STEPS, chain, chain[1:]):
            steps[name].append(b - a)  # type: ignore[operator]
        steps["round trip"].append(back - begin)
    print(f"{len(steps['round trip'])} of {args.calls} calls cut into steps (pid {os.getpid()})")
    for name, values in steps.items():
        values.sort()
        if not values:
            continue
        p50, p90 = values[len(values) // 2] / 1e3, values[int(len(values) * 0.9)] / 1e3
        print(f"{name:28} p50 {p50:7.1f} us   p90 {p90:7.1f} us")


if __name__ == "__main__":
    main()
