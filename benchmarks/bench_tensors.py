"""The tensor engine's costs: op dispatch, and an all-reduce against raw torch.distributed.

    python benchmarks/bench_tensors.py [--runs N] [--quick] [--json] [--ab]

One broker (an ``EmbeddedBroker`` this script starts and stops) and one
4-proc mesh. Scenarios, each repeated ``--runs`` times (figures are medians):

* dispatch: N small ops (``x = x + 1`` on a 4-element tensor, and the in-place
  ``x.add_(1)``) issued inside ``procs.activate()``, then one fetch; the rate
  is N / time until the fetch returns (every proc has run every op by then).
  Also the client-side issue rate alone. Baseline: the same ops in plain
  eager torch in this process (the work itself, without any distribution).
* all-reduce of a 64 MiB float32 tensor on each of the 4 procs, via
  ``t.reduce("gpus", "sum")`` and ``t.reduce_(...)``, timed until a tiny
  fetch from every proc returns. Baseline, measured in the same run: 4 plain
  python processes with ``init_process_group("gloo")`` timing
  ``dist.all_reduce`` between two barriers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time

import torch
from _job import own_broker

import monarch
from monarch.actor import this_host

TIMEOUT = 300.0
N_PROCS = 4

RAW_ALLREDUCE = r"""
import json, sys, time, datetime
import torch, torch.distributed as dist
rank, world, port, numel, reps = (int(a) for a in sys.argv[1:6])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=300))
t = torch.ones(numel)
dist.all_reduce(t)  # warm-up: connections, buffers
times = []
for _ in range(reps):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    dist.barrier()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print(json.dumps(times), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_dispatch(procs, n: int) -> dict[str, float]:
    r: dict[str, float] = {}
    with procs.activate():
        for name, step in (("new", lambda x: x + 1), ("inplace", lambda x: x.add_(1))):
            x = torch.zeros(4)
            monarch.inspect(x)
            x = step(x)  # first use of the op: its definition, the meta cache
            t0 = time.perf_counter()
            for _ in range(n):
                x = step(x)
            t1 = time.perf_counter()
            got = monarch.fetch_shard(x, gpus=N_PROCS - 1).get(TIMEOUT)
            t2 = time.perf_counter()
            assert got[0].item() == n + 1, got
            r[f"{name}_rate"] = n / (t2 - t0)
            r[f"{name}_issue"] = n / (t1 - t0)
    with monarch.no_mesh.activate():
        x = torch.zeros(4)
        t0 = time.perf_counter()
        for _ in range(n):
            x = x + 1
        r["local_rate"] = n / (time.perf_counter() - t0)
    return r


def bench_allreduce(procs, numel: int, reps: int) -> dict[str, float]:
    r: dict[str, float] = {}
    with procs.activate():
        t = torch.ones(numel)
        probe = [monarch.fetch_shard(t[:1], gpus=g) for g in range(N_PROCS)]
        [f.get(TIMEOUT) for f in probe]
        for name, inplace in (("reduce", False), ("reduce_", True)):
            times = []
            for i in range(reps + 1):  # the first builds the process group: not counted
                t0 = time.perf_counter()
                out = t.reduce_("gpus", "sum") if inplace else t.reduce("gpus", "sum")
                fs = [monarch.fetch_shard(out[:1], gpus=g) for g in range(N_PROCS)]
                values = [f.get(TIMEOUT).item() for f in fs]
                if i:
                    times.append(time.perf_counter() - t0)
                if not inplace:
                    assert values == [float(N_PROCS)] * N_PROCS, values
                del out
            r[f"{name}_ms"] = statistics.median(times) * 1e3
    return r


def bench_raw_allreduce(numel: int, reps: int) -> dict[str, float]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RAW_ALLREDUCE,
                str(rank),
                str(N_PROCS),
                str(port),
                str(numel),
                str(reps),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(N_PROCS)
    ]
    try:
        out, _ = procs[0].communicate(timeout=TIMEOUT)
        for p in procs[1:]:
            p.wait(TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"raw_ms": statistics.median(json.loads(out.strip().splitlines()[-1])) * 1e3}


def bench_ab(procs, n: int, pairs: int) -> None:
    """Alternating A/B of two client optimisations (see NOTES.md): dispatch rate of
    ``x = x + 1`` with each one on and off, in one process, medians over ``pairs``."""
    from monarch.tensors import controller, propagation

    real_key, batch = propagation._key, controller._DEAD_BATCH

    def no_cache(obj, tensors):
        raise propagation._NoCache

    variants = {
        "propagation cache on": lambda: None,
        "propagation cache off": lambda: setattr(propagation, "_key", no_cache),
        "deletes batched": lambda: None,
        "one delete per op": lambda: setattr(controller, "_DEAD_BATCH", 1),
    }
    rates: dict[str, list[float]] = {k: [] for k in variants}
    with procs.activate():
        x = torch.zeros(4)
        monarch.inspect(x + 1)
        for _ in range(pairs):
            for name, apply in variants.items():
                apply()
                try:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        x = x + 1
                    monarch.inspect(x)
                    rates[name].append(n / (time.perf_counter() - t0))
                finally:
                    propagation._key, controller._DEAD_BATCH = real_key, batch
    for name, rs in rates.items():
        runs = ", ".join(f"{r:,.0f}" for r in rs)
        print(f"{name:24} {statistics.median(rs):9,.0f} ops/s   ({runs})")


ROWS = [
    # key, scenario, figure, unit, baseline key, higher is better
    ("new_rate", "dispatch x = x + 1, then fetch", "rate", "ops/s", "local_rate", True),
    ("new_issue", "  client issue rate alone", "rate", "ops/s", "local_rate", True),
    ("inplace_rate", "dispatch x.add_(1), then fetch", "rate", "ops/s", "local_rate", True),
    ("inplace_issue", "  client issue rate alone", "rate", "ops/s", "local_rate", True),
    ("local_rate", "baseline: local eager x + 1", "rate", "ops/s", "local_rate", True),
    ("reduce_ms", "all-reduce 64 MiB t.reduce()", "p50", "ms", "raw_ms", False),
    ("reduce__ms", "all-reduce 64 MiB t.reduce_()", "p50", "ms", "raw_ms", False),
    ("raw_ms", "baseline: raw gloo all_reduce", "p50", "ms", "raw_ms", False),
]


def report(runs: list[dict], cfg: dict, as_json: bool) -> None:
    print(f"\nmedian of {len(runs)} runs; config: {cfg}")
    print(f"{'scenario':34} {'figure':6} {'value':>11} {'unit':6} {'x base':>7}")
    rows = []
    for key, scenario, figure, unit, base_key, higher in ROWS:
        value = statistics.median(r[key] for r in runs)
        base = statistics.median(r[base_key] for r in runs)
        ratio = base / value if higher else value / base  # times the baseline's cost
        print(f"{scenario:34} {figure:6} {value:11,.1f} {unit:6} {ratio:7.2f}")
        if key.endswith("_ms"):
            gbps = cfg["bytes"] / (value / 1e3) / 1e9
            print(f"{'':34} {'algbw':6} {gbps:11,.2f} {'GB/s':6}")
        rows.append(
            {
                "bench": "tensors",
                "scenario": scenario.strip(),
                "figure": figure,
                "value": round(value, 2),
                "unit": unit,
                "x_base": round(ratio, 3),
                "runs": [round(r[key], 2) for r in runs],
            }
        )
    print(
        "\nx base: how many times the baseline's cost (time per op, or per all-reduce) the row"
        "\npays; 1.00 = as fast as the baseline. Dispatch rows compare with plain local torch"
        "\ndoing the same op (the op's own cost); all-reduce rows with torch.distributed gloo in"
        "\n4 plain processes. algbw = tensor bytes / time."
    )
    if as_json:
        for row in rows:
            print(json.dumps(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="repetitions; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    ap.add_argument("--ab", action="store_true", help="only the A/B runs of NOTES.md section 5")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    numel = 64 * 2**20 // 4  # 64 MiB of float32
    cfg = {"ops": 2000 if args.quick else 10_000, "reps": 2 if args.quick else 5}
    cfg["bytes"] = numel * 4

    with contextlib.ExitStack() as cleanup:
        own_broker(cleanup)
        procs = this_host().spawn_procs(per_host={"gpus": N_PROCS})
        cleanup.callback(lambda: procs.stop().get(TIMEOUT))
        procs.initialized.get(TIMEOUT)
        if args.ab:
            bench_ab(procs, 5000, max(args.runs, 3))
            return
        runs = []
        for i in range(args.runs):
            r = bench_dispatch(procs, cfg["ops"])
            r.update(bench_allreduce(procs, numel, cfg["reps"]))
            r.update(bench_raw_allreduce(numel, cfg["reps"]))
            runs.append(r)
            figures = " ".join(f"{k}={v:,.1f}" for k, v in r.items())
            print(f"run {i + 1}/{args.runs} {figures}", file=sys.stderr, flush=True)
        report(runs, cfg, args.json)


if __name__ == "__main__":
    main()
