"""Scenarios S1-S7 on Ray, with the semantics of scenarios_monarch_api.py.

    python benchmarks/compare/scenarios_ray.py [--quick] [--skip S6,S7]

The Monarch notions map onto Ray like this: a proc with one actor is a Ray
actor (each lives in a worker process of its own); ``call_one(x).get()`` is
``ray.get(a.ping.remote(x))``; ``call()`` on 4 actors is one ``.remote()`` per
actor and one ``ray.get`` of the 4 refs; ``broadcast`` (no reply) is
``a.ping.options(num_returns=0).remote(x)``; the first spawn (S5 cold)
includes ``ray.init()``, the local cluster's start. One invocation is one run;
prints JSON lines (see _common.py). Ends with ``ray.shutdown()``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import signal
import sys
import time

# Before Ray is imported, and inherited by every process it starts: a local
# cluster on 127.0.0.1 only (Ray's macOS/Windows default; on Linux it would use
# the host's interface address), and no usage reporting.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402
from _common import KILL_WAIT, N_PROCS, TENSOR_BYTES, TIMEOUT, Reporter, latencies_us, parse_args


@ray.remote
class Echo:
    def ping(self, x):
        return x

    def tensor_bytes(self, t) -> int:
        return t.numel() * t.element_size()

    def pid(self) -> int:
        return os.getpid()

    def block(self, started) -> None:
        ray.get(started.set.remote())  # the call is now inside the method
        time.sleep(600)


@ray.remote(num_cpus=0)
class Flag:
    """Stands in for Monarch's Channel in S7: the victim says it is in the method."""

    def __init__(self) -> None:
        self.up = False

    def set(self) -> None:
        self.up = True

    def is_set(self) -> bool:
        return self.up


def spawn_actors() -> list:
    """4 actors, each in a worker process of its own; wait for all 4 replies of one call."""
    actors = [Echo.remote() for _ in range(N_PROCS)]
    ray.get([a.ping.remote(0) for a in actors], timeout=TIMEOUT)
    return actors


def main() -> None:
    args = parse_args(__doc__)
    c = args.counts
    rep = Reporter("ray", args)
    rep.info(version=importlib.metadata.version("ray"), python=sys.version.split()[0])
    state: dict = {}

    def s5_cold() -> None:
        t = time.perf_counter()
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        state["actors"] = spawn_actors()
        rep.emit("S5", "cold", time.perf_counter() - t, "s")

    try:
        if not rep.run("S5", s5_cold):
            for s in ("S1", "S2", "S3", "S4", "S6", "S7"):
                rep.emit(s, "skipped", None, "", error="ray.init or the first 4 actors failed")
            return
        run_rest(rep, c, state["actors"])
    finally:
        ray.shutdown()


def run_rest(rep: Reporter, c: dict, actors: list) -> None:
    one = actors[0]
    time.sleep(c["settle"])  # as the Monarch API script: S1-S4 measure the steady state

    def s1() -> None:
        p50, p99 = latencies_us(
            lambda i: ray.get(one.ping.remote(i), timeout=TIMEOUT), c["warmup"], c["latency"]
        )
        rep.emit("S1", "p50", p50, "us")
        rep.emit("S1", "p99", p99, "us")

    def s2() -> None:
        n = c["pipelined"]
        t = time.perf_counter()
        refs = [one.ping.remote(i) for i in range(n)]
        ray.get(refs, timeout=TIMEOUT)
        rep.emit("S2", "rate", n / (time.perf_counter() - t), "calls/s")

    def s3() -> None:
        rounds = c["rounds"]
        for i in range(min(rounds, 50)):  # warm-up
            ray.get([a.ping.remote(i) for a in actors], timeout=TIMEOUT)
        t = time.perf_counter()
        for i in range(rounds):
            ray.get([a.ping.remote(i) for a in actors], timeout=TIMEOUT)
        rep.emit("S3", "rate", rounds / (time.perf_counter() - t), "rounds/s")

    def s4() -> None:
        n = c["fire"]
        fire = one.ping.options(num_returns=0)
        t = time.perf_counter()
        for i in range(n):
            fire.remote(i)
        ray.get(one.ping.remote(-1), timeout=TIMEOUT)  # actor calls from one caller run in order
        rep.emit("S4", "rate", n / (time.perf_counter() - t), "msgs/s")

    def s6() -> None:
        import torch  # here, so that a venv without torch fails only this scenario

        x = torch.ones(TENSOR_BYTES // 4, dtype=torch.float32)
        if ray.get(one.tensor_bytes.remote(x), timeout=TIMEOUT) != TENSOR_BYTES:
            raise RuntimeError("the actor saw a tensor of the wrong size")
        times = []
        for _ in range(c["tensor_reps"]):
            t = time.perf_counter()
            ray.get(one.tensor_bytes.remote(x), timeout=TIMEOUT)
            times.append(time.perf_counter() - t)
        times.sort()
        rep.emit("S6", "rate", TENSOR_BYTES / 1e6 / times[len(times) // 2], "MB/s")

    def s5_warm() -> None:
        t = time.perf_counter()
        warm = spawn_actors()
        rep.emit("S5", "warm", time.perf_counter() - t, "s")
        for a in warm:
            ray.kill(a)

    def s7() -> None:
        victim = Echo.remote()
        pid = ray.get(victim.pid.remote(), timeout=TIMEOUT)
        flag = Flag.remote()
        in_flight = victim.block.remote(flag)
        deadline = time.monotonic() + TIMEOUT
        while not ray.get(flag.is_set.remote(), timeout=TIMEOUT):
            if time.monotonic() > deadline:
                raise TimeoutError("the blocking call never started")
            time.sleep(0.005)
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        try:
            ray.get(in_flight, timeout=KILL_WAIT)
        except ray.exceptions.GetTimeoutError:
            rep.emit("S7", "raise", None, "s", note=f"> {KILL_WAIT:.0f} s")
        except Exception as e:
            rep.emit("S7", "raise", time.perf_counter() - t0, "s", raised=type(e).__name__)
        else:
            raise RuntimeError("the call on a killed actor returned a value")
        ray.kill(flag)

    for name, fn in (("S1", s1), ("S2", s2), ("S3", s3), ("S4", s4), ("S6", s6)):
        rep.run(name, fn)
    rep.run("S5", s5_warm)
    for a in actors:
        ray.kill(a)
    rep.run("S7", s7)


if __name__ == "__main__":
    main()
