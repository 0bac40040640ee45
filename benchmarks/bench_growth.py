"""How broadcast-and-gather cost grows with mesh size and with payload size.

    python benchmarks/bench_growth.py [--runs N] [--quick]

Two sweeps on one embedded broker, 4 procs:

* **mesh size**: 1 to 64 actors. A Monarch actor mesh has one actor per
  proc, so N actors over at most 4 procs are N/4 meshes of 4 (or one mesh of
  N < 4); one round calls every mesh (one publish each, fanned out by the
  server) and waits for all N replies.
* **payload**: 100 B to 64 MiB argument to a whole 4-actor mesh, replies
  small. Bodies above ``MONARCH_BULK_THRESHOLD`` travel out of band.

Prints a table (median of ``--runs`` repetitions of each point) and writes
``benchmarks/results/growth.csv`` and ``growth.png``, and states the marginal
cost per actor (least-squares slope of round time against actors).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

from monarch.broker.connections.server import EmbeddedBroker

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    broker = EmbeddedBroker().start()
    os.environ["MONARCH_NATS_URL"] = broker.url
    try:
        sizes_table, payload_table = run(args.runs, args.quick)
    finally:
        from monarch.core.process_runtime import shutdown_runtime

        shutdown_runtime()
        broker.stop()
    report(sizes_table, payload_table)


def run(runs: int, quick: bool) -> tuple[list, list]:
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, data: bytes) -> int:
            return len(data)

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    meshes = [procs.spawn(f"growth{i}", Echo) for i in range(16)]
    for m in meshes:
        m.echo.call(b"").get(timeout=TIMEOUT)
    rounds = 5 if quick else 30
    sizes = [1, 2, 4, 8, 16, 32, 64] if not quick else [1, 4, 16]
    sizes_table = []
    for n in sizes:
        targets = [meshes[0].slice(gpus=slice(0, n))] if n < 4 else meshes[: n // 4]
        per_run = []
        for _ in range(runs):
            t0 = time.perf_counter()
            for _ in range(rounds):
                futs = [t.echo.call(b"x" * 16) for t in targets]
                for f in futs:
                    f.get(timeout=TIMEOUT)
            per_run.append((time.perf_counter() - t0) / rounds)
        sizes_table.append((n, statistics.median(per_run)))
        print(f"actors {n:3d}: {sizes_table[-1][1] * 1e3:8.3f} ms per round", flush=True)
    payloads = [100, 10_000, 1 << 20, 16 << 20, 64 << 20] if not quick else [100, 1 << 20]
    payload_table = []
    for size in payloads:
        data = b"p" * size
        reps = max(1, min(rounds, (256 << 20) // max(size * 4, 1)))
        per_run = []
        for _ in range(runs):
            t0 = time.perf_counter()
            for _ in range(reps):
                meshes[0].echo.call(data).get(timeout=TIMEOUT)
            per_run.append((time.perf_counter() - t0) / reps)
        payload_table.append((size, statistics.median(per_run)))
        print(f"payload {size:>10,d} B: {payload_table[-1][1] * 1e3:9.3f} ms per round", flush=True)
    procs.stop().get(timeout=TIMEOUT)
    return sizes_table, payload_table


def slope(points: list[tuple[int, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)


def report(sizes_table: list, payload_table: list) -> None:
    RESULTS.mkdir(exist_ok=True)
    per_actor = slope(sizes_table)
    print(f"\nmarginal cost per actor (slope, 1-64 actors): {per_actor * 1e6:.0f} us per round")
    with open(RESULTS / "growth.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sweep", "x", "seconds_per_round"])
        w.writerows(("actors", n, t) for n, t in sizes_table)
        w.writerows(("payload_bytes", n, t) for n, t in payload_table)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: wrote growth.csv only")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([n for n, _ in sizes_table], [t * 1e3 for _, t in sizes_table], "o-")
    a.set(xlabel="actors (over 4 procs)", ylabel="ms per broadcast-and-gather", title="mesh size")
    b.loglog([n for n, _ in payload_table], [t * 1e3 for _, t in payload_table], "o-")
    b.set(xlabel="argument bytes (to 4 actors)", ylabel="ms per round", title="payload size")
    fig.suptitle(f"monarch over NATS: marginal cost {per_actor * 1e6:.0f} us per actor")
    fig.tight_layout()
    fig.savefig(RESULTS / "growth.png", dpi=100)
    print(f"wrote {RESULTS / 'growth.csv'} and {RESULTS / 'growth.png'}")


if __name__ == "__main__":
    main()
