"""Scenarios S1-S7 on the Monarch actor API: run with our package or the real Monarch.

    python benchmarks/compare/scenarios_monarch_api.py [--quick] [--skip S6,S7]

Both packages are imported as ``monarch`` and share the public API used here
(``Actor``, ``endpoint``, ``this_host``, ``spawn_procs``, ``spawn``, ``call``,
``call_one``, ``broadcast``, ``Channel``, ``shutdown_context``,
``monarch.actor.unhandled_fault_hook``), so one script serves both; which one
is installed decides the ``framework`` of every result line ("ours" or
"monarch"). One invocation is one run; run.py starts it several times and
takes medians. Our package runs with its embedded broker (MONARCH_NATS_URL
unset); with ours, S1 also measures a raw nats-py request/reply on that same
broker, the baseline of the S1 target. Prints JSON lines (see _common.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time

from _common import KILL_WAIT, N_PROCS, TENSOR_BYTES, TIMEOUT, Reporter, latencies_us, parse_args

import monarch.actor
from monarch.actor import Actor, Channel, Port, endpoint, shutdown_context, this_host

# The real Monarch ships compiled Rust bindings; ours is pure Python over NATS.
REAL = importlib.util.find_spec("monarch._rust_bindings") is not None
FRAMEWORK = "monarch" if REAL else "ours"


class Echo(Actor):
    @endpoint
    def ping(self, x):
        return x

    @endpoint
    def tensor_bytes(self, t) -> int:
        return t.numel() * t.element_size()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def block(self, started: Port) -> None:
        started.send(True)  # the call is now inside the endpoint
        time.sleep(600)


def ignore_fault(failure) -> None:
    """S7 kills a proc on purpose; the default hook would exit this script."""


# -- S1 baseline: raw nats-py on our broker (ours only) ------------------------------

RESPONDER = r"""
import asyncio, sys
import nats, uvloop

async def main(url, subject):
    nc = await nats.connect(url)
    async def echo(msg):
        await nc.publish(msg.reply, msg.data)
    await nc.subscribe(subject, cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()

uvloop.new_event_loop().run_until_complete(main(sys.argv[1], sys.argv[2]))
"""


def raw_nats_rtt(counts: dict) -> tuple[float, float]:
    """p50/p99 of ``nc.request`` from this process to a responder process, our broker."""
    import nats
    import uvloop

    url = os.environ["MONARCH_NATS_URL"]  # set by the runtime when it started the broker
    subject = f"compare.raw.{os.getpid()}"
    responder = subprocess.Popen(
        [sys.executable, "-c", RESPONDER, url, subject],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    loop = uvloop.new_event_loop()
    try:
        if responder.stdout.readline().strip() != b"ready":
            raise RuntimeError("raw nats-py responder did not start")
        nc = loop.run_until_complete(nats.connect(url))
        try:
            payload = b"x" * 16

            def request(i: int) -> None:
                loop.run_until_complete(nc.request(subject, payload, timeout=TIMEOUT))

            return latencies_us(request, counts["warmup"], counts["latency"])
        finally:
            loop.run_until_complete(nc.close())
    finally:
        loop.close()
        responder.stdin.close()
        try:
            responder.wait(5)
        except subprocess.TimeoutExpired:
            responder.kill()
            responder.wait()


# -- scenarios ---------------------------------------------------------------------


def spawn_mesh(name: str):
    """Spawn 4 procs and an Echo in each; wait for all 4 replies of one call."""
    procs = this_host().spawn_procs(per_host={"gpus": N_PROCS})
    mesh = procs.spawn(name, Echo)
    mesh.ping.call(0).get(TIMEOUT)
    return procs, mesh


def main() -> None:
    args = parse_args(__doc__)
    c = args.counts
    rep = Reporter(FRAMEWORK, args)
    dist = "torchmonarch" if REAL else "monarch-nats"
    rep.info(version=importlib.metadata.version(dist), python=sys.version.split()[0])
    monarch.actor.unhandled_fault_hook = ignore_fault
    state: dict = {}

    def s5_cold() -> None:
        # The first spawn also starts the runtime: our embedded broker, the real
        # Monarch's local host. S1-S4 and S6 use this mesh.
        t = time.perf_counter()
        state["procs"], state["mesh"] = spawn_mesh("echo")
        rep.emit("S5", "cold", time.perf_counter() - t, "s")
        state["one"] = state["mesh"].slice(gpus=0)

    if not rep.run("S5", s5_cold):
        # Without the mesh nothing else can run; say so for every scenario.
        for s in ("S1", "S2", "S3", "S4", "S6", "S7"):
            rep.emit(s, "skipped", None, "", error="the first 4-proc spawn failed")
        return
    mesh, one = state["mesh"], state["one"]
    # S1-S4 measure the steady state. What a runtime does once it is idle after
    # its first spawn happens now, not during S1: ours forks its torch zygote,
    # which imports torch, ~2 s of CPU that took call_one's p99 from ~0.9 to
    # ~3 ms on 2 cores (benchmarks/NOTES.md entry 29). Both frameworks wait alike.
    time.sleep(c["settle"])

    def s1() -> None:
        p50, p99 = latencies_us(
            lambda i: one.ping.call_one(i).get(TIMEOUT), c["warmup"], c["latency"]
        )
        rep.emit("S1", "p50", p50, "us")
        rep.emit("S1", "p99", p99, "us")
        if not REAL:
            p50, p99 = raw_nats_rtt(c)
            rep.emit("S1raw", "p50", p50, "us")
            rep.emit("S1raw", "p99", p99, "us")

    def s2() -> None:
        n = c["pipelined"]
        t = time.perf_counter()
        futs = [one.ping.call_one(i) for i in range(n)]
        for f in futs:
            f.get(TIMEOUT)
        rep.emit("S2", "rate", n / (time.perf_counter() - t), "calls/s")

    def s3() -> None:
        rounds = c["rounds"]
        for i in range(min(rounds, 50)):  # warm-up
            mesh.ping.call(i).get(TIMEOUT)
        t = time.perf_counter()
        for i in range(rounds):
            mesh.ping.call(i).get(TIMEOUT)
        rep.emit("S3", "rate", rounds / (time.perf_counter() - t), "rounds/s")

    def s4() -> None:
        n = c["fire"]
        t = time.perf_counter()
        for i in range(n):
            one.ping.broadcast(i)
        one.ping.call_one(-1).get(TIMEOUT)
        rep.emit("S4", "rate", n / (time.perf_counter() - t), "msgs/s")

    def s6() -> None:
        import torch  # here, so that a venv without torch fails only this scenario

        x = torch.ones(TENSOR_BYTES // 4, dtype=torch.float32)
        if one.tensor_bytes.call_one(x).get(TIMEOUT) != TENSOR_BYTES:  # warm-up, and a check
            raise RuntimeError("the actor saw a tensor of the wrong size")
        times = []
        for _ in range(c["tensor_reps"]):
            t = time.perf_counter()
            one.tensor_bytes.call_one(x).get(TIMEOUT)
            times.append(time.perf_counter() - t)
        times.sort()
        rep.emit("S6", "rate", TENSOR_BYTES / 1e6 / times[len(times) // 2], "MB/s")

    def s5_warm() -> None:
        t = time.perf_counter()
        procs, _ = spawn_mesh("warm")
        rep.emit("S5", "warm", time.perf_counter() - t, "s")
        procs.stop().get(TIMEOUT)

    def s7() -> None:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        victim = procs.spawn("victim", Echo)
        pid = victim.pid.call_one().get(TIMEOUT)
        started, started_recv = Channel.open()
        in_flight = victim.block.call_one(started)
        started_recv.recv().get(TIMEOUT)
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        try:
            in_flight.get(KILL_WAIT)
        except Exception as e:
            took = time.perf_counter() - t0
            if took >= KILL_WAIT - 0.5:  # the wait timed out: the call never raised
                rep.emit("S7", "raise", None, "s", note=f"> {KILL_WAIT:.0f} s")
            else:
                rep.emit("S7", "raise", took, "s", raised=type(e).__name__)
        else:
            raise RuntimeError("the call on a killed proc returned a value")
        try:  # best effort: the driver kills whatever is left
            procs.stop().get(10)
        except Exception as e:
            print(f"[{FRAMEWORK}] stopping the killed proc mesh: {e!r}", file=sys.stderr)

    for name, fn in (("S1", s1), ("S2", s2), ("S3", s3), ("S4", s4), ("S6", s6)):
        rep.run(name, fn)
    rep.run("S5", s5_warm)
    try:
        state["procs"].stop().get(TIMEOUT)
    except Exception as e:
        print(f"[{FRAMEWORK}] stopping the main proc mesh: {e!r}", file=sys.stderr)
    rep.run("S7", s7)  # last: it leaves a dead proc behind
    shutdown_context().get(30)


if __name__ == "__main__":
    main()
