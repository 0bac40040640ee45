"""Bulk transfer throughput of monarch.rdma, against a local memcpy of the same size.

    python benchmarks/bench_rdma.py [--runs N] [--quick] [--json]

One run: an embedded broker, one proc that owns the buffers (64 MiB and
1 GiB, ``--quick``: 64 MiB only), and this client, which for each transport
(same_host, tcp; forced with ``MONARCH_RDMA_TRANSPORT``) does ``read_into``
(proc's buffer -> warm local tensor) and ``write_from`` (warm local tensor ->
proc's buffer), then calls an endpoint with a 64 MiB tensor argument (which
travels out of band, see monarch.rdma.bulk: the proc fetches it with the
same forced transport). The ceiling is ``torch`` ``copy_`` (all cores) of
the same size between two warm tensors in this process, sampled next to
each transport's figures; a one-thread ``memmove`` is shown beside it.
Every figure is the median over ``--runs`` repetitions; GB/s is 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time

import torch

from monarch.actor import Actor, endpoint, this_host
from monarch.broker.connections.server import EmbeddedBroker
from monarch.core.process_runtime import shutdown_runtime
from monarch.rdma import RDMABuffer

TIMEOUT = 120.0
MiB = 1 << 20


class BulkOwner(Actor):
    """Owns the buffers the client reads and writes; takes tensor arguments."""

    def __init__(self) -> None:
        self.keep: list = []

    @endpoint
    def make(self, size: int) -> RDMABuffer:
        t = torch.ones(size, dtype=torch.uint8)  # touched, so its pages exist
        self.keep.append(t)
        return RDMABuffer(t)

    @endpoint
    def set_transport(self, name: str) -> None:
        os.environ["MONARCH_RDMA_TRANSPORT"] = name  # how this proc fetches big arguments

    @endpoint
    def take(self, t: torch.Tensor) -> int:
        return t.numel()


def timed(n: int, fn, *args) -> list[float]:
    """Seconds taken by each of ``n`` calls of ``fn(*args)``."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn(*args)
        out.append(time.perf_counter() - start)
    return out


def read(buf: RDMABuffer, dst: torch.Tensor) -> None:
    buf.read_into(dst).get(timeout=TIMEOUT)


def write(buf: RDMABuffer, src: torch.Tensor) -> None:
    buf.write_from(src).get(timeout=TIMEOUT)


def call(owner, arg: torch.Tensor) -> None:
    owner.take.call_one(arg).get(timeout=TIMEOUT)


def memmove(dst: torch.Tensor, src: torch.Tensor) -> None:
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="64 MiB only, 2 runs")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per row")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs
    sizes = [64 * MiB] if args.quick else [64 * MiB, 1024 * MiB]

    broker = EmbeddedBroker().start()
    os.environ["MONARCH_NATS_URL"] = broker.url
    procs = None
    samples: dict[tuple[str, str, int], list[float]] = {}  # (scenario, transport, bytes) -> s

    def measure(key: tuple[str, str, int], fn, *fn_args) -> None:
        samples.setdefault(key, []).extend(timed(1, fn, *fn_args))

    try:
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="bench")
        owner = procs.spawn("owner", BulkOwner).slice(procs=0)
        buffers = {size: owner.make.call_one(size).get(timeout=TIMEOUT) for size in sizes}
        local = {size: torch.full((size,), 2, dtype=torch.uint8) for size in sizes}
        other = {size: torch.full((size,), 3, dtype=torch.uint8) for size in sizes}
        # Rounds interleave everything, so that noise from a shared machine hits all rows alike;
        # round 0 is a warm-up (connections, threads, pages) and is not kept.
        for round_ in range(runs + 1):
            for transport in ("same_host", "tcp"):
                os.environ["MONARCH_RDMA_TRANSPORT"] = transport
                owner.set_transport.call_one(transport).get(timeout=TIMEOUT)
                for size in sizes:
                    measure(("memcpy, 1 thread", "local", size), memmove, local[size], other[size])
                    measure(
                        ("torch copy_ (ceiling)", "local", size), local[size].copy_, other[size]
                    )
                    measure(("read_into", transport, size), read, buffers[size], local[size])
                    measure(("write_from", transport, size), write, buffers[size], local[size])
                for _ in range(2):
                    measure(
                        ("64 MiB endpoint argument", transport, 64 * MiB),
                        call,
                        owner,
                        local[64 * MiB],
                    )
            if round_ == 0:
                samples.clear()
        os.environ.pop("MONARCH_RDMA_TRANSPORT", None)
    finally:
        if procs is not None:
            procs.stop().get(timeout=TIMEOUT)
        shutdown_runtime()
        broker.stop()

    rows = [
        {
            "scenario": k[0],
            "transport": k[1],
            "bytes": k[2],
            "runs": len(v),
            "gbps": k[2] / statistics.median(v) / 1e9,
        }
        for k, v in samples.items()
    ]
    ceiling = {r["bytes"]: r["gbps"] for r in rows if r["scenario"] == "torch copy_ (ceiling)"}
    rows.sort(key=lambda r: (r["transport"] != "local", r["transport"], r["bytes"]))
    print("median of the runs; GB/s = 1e9 bytes/s; x ceiling = fraction of torch copy_ here")
    print(
        f"{'scenario':<26} {'transport':<10} {'size':>9} {'runs':>4} {'GB/s':>7} {'x ceiling':>9}"
    )
    for r in rows:
        r["x_ceiling"] = r["gbps"] / ceiling[r["bytes"]]
        size = f"{r['bytes'] >> 20} MiB"
        print(
            f"{r['scenario']:<26} {r['transport']:<10} {size:>9} {r['runs']:>4} "
            f"{r['gbps']:>7.2f} {r['x_ceiling']:>9.2f}"
        )
    if args.json:
        for r in rows:
            print(json.dumps({"bench": "rdma", **r}))


if __name__ == "__main__":
    main()
