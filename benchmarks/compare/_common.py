"""What every scenario script shares: counts, timing helpers, the JSON line format.

Standard library only: this file is imported by scenario scripts running in
three different virtual environments (ours, the real Monarch's, Ray's).

Each result is one JSON line, ``{"compare": 1, "framework": ..., ...}``, printed
on stdout and, with ``--results FILE``, appended to that file, which is what the
driver (run.py) reads: a framework's own threads also print on stdout (Ray's
"worker died" notice in S7, for one) and can land in the middle of a line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable

TIMEOUT = 60.0  # seconds; any single wait longer than this is a failure, not a slow result
KILL_WAIT = 60.0  # S7: how long to wait for the in-flight call to raise
N_PROCS = 4
TENSOR_BYTES = 64 * 2**20  # S6

# settle: seconds of idling after the first spawn, before S1 (see scenarios_monarch_api.py)
FULL = dict(warmup=200, latency=2000, pipelined=10_000, rounds=1000, fire=10_000, tensor_reps=5,
            settle=8.0)  # fmt: skip
QUICK = dict(warmup=20, latency=200, pipelined=1000, rounds=100, fire=1000, tensor_reps=2,
             settle=0.0)  # fmt: skip


def parse_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--skip", default="", help="comma-separated scenarios not to run, e.g. S6,S7")
    ap.add_argument("--results", help="also append the result lines to this file")
    args = ap.parse_args()
    args.counts = QUICK if args.quick else FULL
    args.skip = {s.strip().upper() for s in args.skip.split(",") if s.strip()}
    return args


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, round(q * (len(sorted_xs) - 1)))]


class Reporter:
    """Prints result lines for one framework; runs each scenario so a failure stays local."""

    def __init__(self, framework: str, args: argparse.Namespace) -> None:
        self.framework = framework
        self.skip = args.skip
        self.results = args.results

    def _write(self, row: dict) -> None:
        line = json.dumps(dict(compare=1, framework=self.framework, **row))
        print(line, flush=True)
        if self.results:
            with open(self.results, "a") as f:
                f.write(line + "\n")

    def emit(self, scenario: str, figure: str, value: float | None, unit: str, **extra) -> None:
        value = None if value is None else round(value, 4)
        self._write(dict(scenario=scenario, figure=figure, value=value, unit=unit, **extra))

    def info(self, **fields) -> None:
        self._write(dict(info=fields))

    def run(self, scenario: str, fn: Callable[[], None]) -> bool:
        """Run one scenario; on an exception print an error line and go on. True if it ran."""
        if scenario in self.skip:
            return False
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # reported in the table; the other scenarios still run
            traceback.print_exc(file=sys.stderr)
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            self._write(dict(scenario=scenario, error=msg))
            return False
        finally:
            took = time.perf_counter() - t
            print(f"[{self.framework}] {scenario} took {took:.1f} s", file=sys.stderr, flush=True)
        return True


def latencies_us(call: Callable[[int], object], warmup: int, n: int) -> tuple[float, float]:
    """p50 and p99 in microseconds of ``call(i)``, one at a time, after ``warmup`` calls."""
    for i in range(warmup):
        call(i)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        lat.append(time.perf_counter() - t)
    lat.sort()
    return percentile(lat, 0.50) * 1e6, percentile(lat, 0.99) * 1e6
