"""What a job record (monarch.broker.connections.job_records) adds to a client's start.

Two measurements, medians of several runs:

1. in process: ``publish`` (record + NATS context, with the stale-record scan
   a writer does) and ``remove``, in a private temporary home;
2. a client's whole start (``runtime()``: zygote request, embedded broker,
   connection, supervision), each in a fresh process, with records and with
   ``publish`` replaced by a no-op (the baseline, measured in the same run).

    PYTHONPATH=$PWD python benchmarks/bench_job_record.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_START = """
import json, sys, time
import monarch.actor  # noqa: F401  (what a script imports first)
from monarch.broker.connections import job_records
from monarch.core.process_runtime import runtime
if sys.argv[1] == "off":
    job_records.publish = lambda *a, **k: None
t = time.perf_counter()
runtime()
print(json.dumps({"start_s": time.perf_counter() - t}), flush=True)
"""


def in_process(n: int) -> tuple[float, float]:
    from monarch.broker.connections import job_records

    publish, remove = [], []
    for _ in range(n):
        t = time.perf_counter()
        record = job_records.new_record(
            url="nats://secrettoken@127.0.0.1:4222",
            namespace="default",
            embedded=True,
            credentials={},
            script="bench.py",
        )
        job = job_records.publish(record)
        t1 = time.perf_counter()
        assert job is not None
        job.remove()
        publish.append(t1 - t)
        remove.append(time.perf_counter() - t1)
    return statistics.median(publish), statistics.median(remove)


def client_start(mode: str, env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _START, mode], env=env, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.splitlines()[-1])["start_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="bench-job-record-")
    try:
        os.environ["XDG_RUNTIME_DIR"] = os.path.join(home, "run")
        os.environ["XDG_CONFIG_HOME"] = os.path.join(home, "config")
        os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700)
        env = {k: v for k, v in os.environ.items() if k != "MONARCH_NATS_URL"}
        pub, rem = in_process(200)
        on, off = [], []
        for i in range(args.runs):  # interleaved, first one then the other: noise falls alike
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                (off if mode == "off" else on).append(client_start(mode, env))
        rows = {
            "publish_ms": pub * 1e3,
            "remove_ms": rem * 1e3,
            "client_start_without_ms": statistics.median(off) * 1e3,
            "client_start_with_ms": statistics.median(on) * 1e3,
            "client_start_without_min_ms": min(off) * 1e3,
            "client_start_with_min_ms": min(on) * 1e3,
        }
        print(f"{'measure':<28}{'median ms':>12}")
        for name, value in rows.items():
            print(f"{name:<28}{value:>12.2f}")
        print(json.dumps({"bench": "job_record", "runs": args.runs, **rows}))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
