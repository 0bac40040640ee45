"""Soak: sustained mixed traffic on 4 procs; no errors, and memory that stays flat.

    python benchmarks/soak.py [--seconds 120] [--quick] [--interval 2] [--json]

One broker (an ``EmbeddedBroker`` this script starts and stops, its URL in
``MONARCH_NATS_URL`` before monarch's first use) and a 4-proc mesh of a
``Soak`` actor. For ``--seconds`` (``--quick``: 20) client threads keep up

  * calls:      ``call_one`` to each rank in turn, back to back;
  * gathers:    ``call()`` on all 4 actors, back to back;
  * broadcasts: ``broadcast`` to all 4, 10 every 10 ms;
  * payloads:   a 1 MiB ``bytes`` echoed by one actor (out of band both ways),
                one a second, checked byte for byte.

Every exception is an error (counted by type; the script exits 1 if any), and
at the end each actor must have handled every broadcast. Every ``--interval``
seconds a sampler reads ``VmRSS`` from ``/proc/<pid>/status`` of the client,
each proc and the broker. The table gives each process's median RSS over the
first and the last window (30 s, or a quarter of the run if shorter), their
ratio (target: within 10 %, i.e. <= 1.10), min and max over the run, and the
least-squares slope of the samples after the first window (growth once warm).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import statistics
import sys
import threading
import time

TIMEOUT = 60.0  # seconds; any single wait longer than this is an error, not a slow result
PAYLOAD = 1 << 20
WINDOW = 30.0
TARGET = 1.10


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler:
    """Samples VmRSS of named pids every ``interval`` seconds on a thread it owns."""

    def __init__(self, pids: dict[str, int], interval: float) -> None:
        self.pids = pids
        self.interval = interval
        self.samples: list[tuple[float, dict[str, int | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-rss", daemon=True)
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread.start()

    def _take(self) -> None:
        now = time.monotonic() - self.t0
        self.samples.append((now, {name: rss_kib(pid) for name, pid in self.pids.items()}))

    def _run(self) -> None:
        self._take()
        while not self._stop.wait(self.interval):
            self._take()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + 5)
        self._take()  # one at the very end


class Traffic:
    """The client's traffic threads; each counts what it did and every error it saw."""

    def __init__(self, mesh, ranks: int) -> None:
        self.mesh = mesh
        self.ranks = ranks
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.first_errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(fn,), name=f"soak-{fn.__name__}")
            for fn in (self._call, self._gather, self._broadcast, self._payload)
        ]
        self.payload = bytearray(os.urandom(PAYLOAD))

    def _loop(self, fn) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                fn(n)
            except Exception as e:
                with self.lock:
                    self.errors[type(e).__name__] += 1
                    if len(self.first_errors) < 5:
                        self.first_errors.append(f"{fn.__name__} #{n}: {e!r}")
                time.sleep(0.1)  # an error storm should not spin
            n += 1

    def _count(self, what: str, k: int = 1) -> None:
        with self.lock:
            self.done[what] += k

    def _call(self, n: int) -> None:
        rank = n % self.ranks
        got = self.mesh.slice(gpus=rank).ping.call_one(n).get(TIMEOUT)
        if got != (rank, n):
            raise AssertionError(f"call {n} to rank {rank} returned {got!r}")
        self._count("calls")

    def _gather(self, n: int) -> None:
        got = list(self.mesh.ping.call(n).get(TIMEOUT).values())
        if got != [(r, n) for r in range(self.ranks)]:
            raise AssertionError(f"gather {n} returned {got!r}")
        self._count("gathers")

    def _broadcast(self, n: int) -> None:
        for i in range(10):
            self.mesh.note.broadcast(n * 10 + i)
            self._count("broadcasts")
        time.sleep(0.01)

    def _payload(self, n: int) -> None:
        rank = n % self.ranks
        self.payload[:8] = n.to_bytes(8, "little")
        sent = bytes(self.payload)
        back = self.mesh.slice(gpus=rank).echo.call_one(sent).get(TIMEOUT)
        if back != sent:
            raise AssertionError(f"1 MiB payload {n} came back different from rank {rank}")
        self._count("payloads")
        self.stop.wait(1.0)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> list[str]:
        self.stop.set()
        deadline = time.monotonic() + TIMEOUT + 10
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


class WarningCounter(logging.Handler):
    """Counts WARNING and worse records logged in the client (monarch's own included)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"[:300])


def window_stats(samples, name: str, seconds: float, window: float) -> dict:
    pts = [(t, v[name]) for t, v in samples if v.get(name) is not None]
    first = [v for t, v in pts if t <= window]
    last = [v for t, v in pts if t >= seconds - window]
    if not first or not last:
        return {}
    a, b = statistics.median(first), statistics.median(last)
    vs = [v for _, v in pts]
    # Growth after warm-up: a least-squares line through the samples past the first window.
    steady = [(t, v) for t, v in pts if t >= window] or pts
    mt, mv = statistics.fmean(t for t, _ in steady), statistics.fmean(v for _, v in steady)
    den = sum((t - mt) ** 2 for t, _ in steady) or 1.0
    slope = sum((t - mt) * (v - mv) for t, v in steady) / den  # KiB per second
    return dict(
        process=name,
        first_mib=round(a / 1024, 2),
        last_mib=round(b / 1024, 2),
        ratio=round(b / a, 3),
        min_mib=round(min(vs) / 1024, 2),
        max_mib=round(max(vs) / 1024, 2),
        slope_mib_per_min=round(slope * 60 / 1024, 3),
        samples=len(pts),
    )


def report(sampler: Sampler, traffic: Traffic, seconds: float, window: float, as_json: bool,
           extra_errors: collections.Counter, warnings: list[str]) -> bool:  # fmt: skip
    errors = traffic.errors + extra_errors
    total_errors = sum(errors.values())
    rates = {k: round(v / seconds, 1) for k, v in traffic.done.items()}
    print(f"\nsoak: {seconds:.0f} s of traffic; RSS sampled every {sampler.interval:g} s "
          f"({len(sampler.samples)} samples); windows: first and last {window:g} s (medians)")  # fmt: skip
    print(f"traffic: {dict(traffic.done)}  (per second: {rates})")
    print(f"errors: {total_errors} {dict(errors)}; client warnings logged: {len(warnings)}")
    for line in traffic.first_errors + warnings[:5]:
        print(f"  {line}")
    print(f"\n{'process':10} {'first MiB':>10} {'last MiB':>10} {'ratio':>7} {'min':>8} "
          f"{'max':>8} {'MiB/min':>8}  flat (<= {TARGET:.2f})")  # fmt: skip
    rows = []
    for name in sampler.pids:
        row = window_stats(sampler.samples, name, seconds, window)
        if not row:
            print(f"{name:10} no samples")
            continue
        row["flat"] = row["ratio"] <= TARGET
        rows.append(row)
        print(f"{name:10} {row['first_mib']:10.1f} {row['last_mib']:10.1f} {row['ratio']:7.3f} "
              f"{row['min_mib']:8.1f} {row['max_mib']:8.1f} {row['slope_mib_per_min']:8.2f}  "
              f"{'yes' if row['flat'] else 'NO'}")  # fmt: skip
    if as_json:
        for row in rows:
            print(json.dumps({"bench": "soak", "seconds": seconds, **row}))
        print(json.dumps({"bench": "soak", "traffic": dict(traffic.done), "errors": dict(errors)}))
    return total_errors == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=None, help="traffic duration (default 120)")
    ap.add_argument("--quick", action="store_true", help="20 s (smoke test)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between RSS samples")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per process")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (20.0 if args.quick else 120.0)
    if seconds <= 0 or args.interval <= 0:
        ap.error("--seconds and --interval must be positive")
    window = min(WINDOW, seconds / 4)

    from _job import own_broker

    warnings = WarningCounter()
    logging.getLogger().addHandler(warnings)
    extra_errors: collections.Counter[str] = collections.Counter()
    with contextlib.ExitStack() as cleanup:
        broker = own_broker(cleanup)
        import monarch.actor
        from monarch.actor import Actor, endpoint, this_host

        def fault(failure) -> None:  # the default hook would exit the process
            extra_errors["unhandled failure"] += 1
            print(f"unhandled failure: {failure.report()}", file=sys.stderr, flush=True)

        monarch.actor.unhandled_fault_hook = fault

        class Soak(Actor):
            """Reaches the procs by value (cloudpickle), like every class in ``__main__``."""

            def __init__(self) -> None:
                self.notes = 0

            @endpoint
            def ping(self, n: int) -> tuple:
                from monarch.actor import context

                # the actor's own rank in the whole mesh (current_rank() is the rank in
                # the slice the message went to: 0 for a call_one to a one-actor slice)
                return context().actor_instance.rank.rank, n

            @endpoint
            def note(self, n: int) -> None:
                self.notes += 1

            @endpoint
            def echo(self, data: bytes) -> bytes:
                return data

            @endpoint
            def notes_seen(self) -> int:
                return self.notes

            @endpoint
            def pid(self) -> int:
                return os.getpid()

        procs = this_host().spawn_procs(per_host={"gpus": 4})
        cleanup.callback(lambda: procs.stop().get(TIMEOUT))
        mesh = procs.spawn("soak", Soak)
        pids = {"client": os.getpid()}
        pids.update({f"proc{r}": p for r, p in enumerate(mesh.pid.call().get(TIMEOUT).values())})
        pids["broker"] = broker.pid
        print(f"pids: {pids}", file=sys.stderr, flush=True)

        sampler = Sampler(pids, args.interval)
        traffic = Traffic(mesh, 4)
        sampler.start()
        traffic.start()
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                time.sleep(min(10.0, seconds - (time.monotonic() - started)))
                done = dict(traffic.done)
                rss = {k: f"{v / 1024:.0f}" for k, v in sampler.samples[-1][1].items() if v}
                print(f"t={time.monotonic() - started:5.0f}s {done} errors={sum(traffic.errors.values())} "
                      f"rss MiB {rss}", file=sys.stderr, flush=True)  # fmt: skip
        finally:
            stuck = traffic.finish()
            sampler.stop()
        elapsed = time.monotonic() - started
        for name in stuck:
            extra_errors[f"hung thread {name}"] += 1
        seen = list(mesh.notes_seen.call().get(TIMEOUT).values())
        if seen != [traffic.done["broadcasts"]] * 4:
            extra_errors["broadcasts lost"] += 1
            print(f"broadcasts sent {traffic.done['broadcasts']}, seen {seen}", flush=True)
        ok = report(sampler, traffic, elapsed, window, args.json, extra_errors,
                    warnings.records)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
