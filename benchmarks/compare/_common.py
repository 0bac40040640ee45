"""What every scenario script shares: counts, timing helpers, the JSON line format.

Standard library only: this file is imported by scenario scripts running in
three different virtual environments (ours, the real Monarch's, Ray's).

Each result is one line on stdout, ``{"compare": 1, "framework": ..., ...}``;
the driver (run.py) ignores every other line, so a framework's own log output
on stdout does no harm.
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

FULL = dict(warmup=200, latency=2000, pipelined=10_000, rounds=1000, fire=10_000, tensor_reps=5)
QUICK = dict(warmup=20, latency=200, pipelined=1000, rounds=100, fire=1000, tensor_reps=2)


def parse_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--skip", default="", help="comma-separated scenarios not to run, e.g. S6,S7")
    args = ap.parse_args()
    args.counts = QUICK if args.quick else FULL
    args.skip = {s.strip().upper() for s in args.skip.split(",") if s.strip()}
    return args


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, round(q * (len(sorted_xs) - 1)))]


class Reporter:
    """Prints result lines for one framework; runs each scenario so a failure stays local."""

    def __init__(self, framework: str, skip: set[str]) -> None:
        self.framework = framework
        self.skip = skip

    def emit(self, scenario: str, figure: str, value: float | None, unit: str, **extra) -> None:
        row = dict(compare=1, framework=self.framework, scenario=scenario, figure=figure)
        row.update(value=None if value is None else round(value, 4), unit=unit, **extra)
        print(json.dumps(row), flush=True)

    def info(self, **fields) -> None:
        print(json.dumps(dict(compare=1, framework=self.framework, info=fields)), flush=True)

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
            row = dict(compare=1, framework=self.framework, scenario=scenario, error=msg)
            print(json.dumps(row), flush=True)
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
