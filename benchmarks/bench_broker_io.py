"""What the broker-I/O changes are worth, measured within one run.

    python benchmarks/bench_broker_io.py [--cycles 12] [--procs 4] [--variants all,stop26,...]

This machine's speed drifts by 10-20% from one minute to the next, more than
any of these changes is worth, so two runs (one with, one without) compare
the minutes more than the changes. Here one client and its procs switch the
changes on and off between blocks of calls, cycling through the variants, so
every variant sees the same minutes. The changes (each a setting, on by
default in a real job):

* ``read``: parsing in the socket's callback (``MONARCH_DIRECT_READ``, NOTES 30);
* ``write``: writing within the publish (``MONARCH_WRITE_THROUGH``, NOTES 30);
* ``deliver``: whole frames past nats-py's parser (``MONARCH_FAST_DELIVERY``, NOTES 31);
* ``sync``: publishing in one plain call (``MONARCH_SYNC_PUBLISH``, NOTES 31);
* ``direct``: a thread writing its call or reply itself when nothing waits
  (``MONARCH_DIRECT_WRITE``, NOTES 42).

Variants: ``all`` (every change), ``no_direct`` (all but ``direct``: main
before NOTES 42), ``no_deliver``, ``no_sync``, ``stop26`` (read and write only:
main before NOTES 31), ``neither`` (nats-py's own tasks), ``read``, ``write``;
all but ``all`` without ``direct``. Each block: 300 ``call_one`` round trips to one actor
(S1), 1,000 pipelined ``call_one`` (S2), 100 broadcast-and-gather rounds over
all procs (S3). Prints per variant the S1 p50/p99 over all its blocks and the
medians of S2 and S3. No assertion: figures for benchmarks/NOTES.md.

The switches reach into the runtime's connection (``nc``) of each process.
"""

from __future__ import annotations

import argparse
import statistics
import time

from monarch.actor import Actor, endpoint, this_host
from monarch.broker.natspy_internals import sync_publish
from monarch.core.process_runtime import runtime

CHANGES = ("read", "write", "deliver", "sync", "direct")
VARIANTS = {
    "all": CHANGES,
    "no_direct": ("read", "write", "deliver", "sync"),
    "no_deliver": ("read", "write", "sync"),
    "no_sync": ("read", "write", "deliver"),
    "stop26": ("read", "write"),
    "neither": (),
    "read": ("read",),
    "write": ("write",),
}
DEFAULT_VARIANTS = "all,no_direct,stop26"
SETTLE = 8.0  # seconds of idling after the spawn (the torch zygote's import, NOTES 29)


def switch(on: tuple[str, ...]) -> None:
    """In this process: the changes named in ``on`` on, the others off (on the loop)."""
    rt = runtime()

    def flip() -> None:
        nc = rt.nc
        reader, through = nc._monarch_direct_read, nc._monarch_write_through
        if "write" in on:
            nc._flush_pending = through.flush_pending
        else:
            vars(nc).pop("_flush_pending", None)  # nats-py's own method again
        if "read" in on:
            reader.reader = None
            reader.take_over_when_parked()
        else:
            vars(nc._transport._io_reader).pop("feed_data", None)  # to nats-py's reader task
        reader.fast = "deliver" in on
        plain = sync_publish.publisher(nc) if "sync" in on and "write" in on else None
        rt._sync_publish_nc, rt._sync_publish = nc, plain
        direct = nc._monarch_direct_write  # the runtime's, kept on the connection
        rt._direct_write = direct if "direct" in on and "write" in on else None

    rt.loop.call_soon_threadsafe(flip)
    time.sleep(0.05)


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def switch(self, on: tuple[str, ...]) -> None:
        switch(tuple(on))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {', '.join(VARIANTS)}")
    args = ap.parse_args()
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    mesh = procs.spawn("io_echo", Echo)
    mesh.ping.call(0).get()
    one = mesh.slice(gpus=0)
    time.sleep(SETTLE)
    s1: dict[str, list[float]] = {v: [] for v in variants}
    s2: dict[str, list[float]] = {v: [] for v in variants}
    s3: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.cycles):
        for name, on in variants.items():
            mesh.switch.call(on).get()
            switch(on)
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
    print(f"{args.cycles} cycles of {len(variants)} blocks, {args.procs} procs")
    for name in variants:
        lat = sorted(s1[name])
        p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
        print(
            f"{name:8s} S1 p50 {p50:5.0f} us  p99 {p99:6.0f} us   "
            f"S2 {statistics.median(s2[name]):7.0f} calls/s   "
            f"S3 {statistics.median(s3[name]):6.0f} rounds/s"
        )


if __name__ == "__main__":
    main()
