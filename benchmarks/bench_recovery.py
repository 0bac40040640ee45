"""How fast data-parallel training recovers from a SIGKILLed rank, and Monarch 0.7 beside it.

    python benchmarks/bench_recovery.py [--runs N] [--steps S] [--json]
        [--monarch-python PATH] [--skip-monarch]

Ours: ``examples/fault_tolerant_training.py`` (4 gloo ranks, a hot spare, the
coordinator in this process) on a broker this script starts. Each run trains
``--steps`` steps and SIGKILLs rank 1 as step ``steps // 2`` starts. Figures,
medians over runs (one warm-up run first, not counted), all from ``time.time()``
on this machine:

  supervise   SIGKILL -> the coordinator's ``__supervise__`` runs
  ready       SIGKILL -> the replacement holds the state and the group is re-formed
  first step  SIGKILL -> the replayed step has completed on every rank
  lost        training time lost: start of the interrupted step -> end of its
              replay, minus the median duration of an undisturbed step

Side by side: ``benchmarks/recovery_scenario.py``, the same owner/worker
scenario written for Monarch's public API (SIGKILL -> ``__supervise__``, and
-> a replacement proc and actor answering), run with each framework's default
settings in a subprocess from a temporary folder: with this repository on the
path (ours) and with ``--monarch-python`` (the real Monarch 0.7). The gloo and
RDMA parts are not in that scenario (Monarch has no respawn-in-place helper;
the scenario only uses what both APIs share).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "benchmarks" / "recovery_scenario.py"
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "examples"))  # the procs get this sys.path too

from _job import own_broker  # noqa: E402

import monarch.actor  # noqa: E402

TARGET = 1.0  # seconds, SIGKILL -> first step after recovery


def ours_full(runs: int, steps: int) -> list[dict]:
    import fault_tolerant_training as ex

    out = []
    for i in range(runs + 1):
        report, _ = ex.run(steps, steps // 2)
        (rec,) = report["recoveries"]
        kill = report["kill"]
        typical = statistics.median(report["steps"])
        row = dict(
            supervise=rec["supervise"] - kill,
            ready=rec["ready"] - kill,
            first_step=rec["first_step"] - kill,
            lost=rec["first_step"] - rec["started"] - typical,
        )
        print(f"ours run {i}{' (warm-up)' if i == 0 else ''}: "
              + " ".join(f"{k}={v:.3f}s" for k, v in row.items()), file=sys.stderr, flush=True)  # fmt: skip
        if i:
            out.append(row)
    return out


def scenario(python: str, runs: int, with_repo: bool) -> tuple[list[dict], str]:
    """Run recovery_scenario.py with ``python`` from a fresh folder; its counted rows, or why not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.pop("PYTHONPATH", None)
    if with_repo:
        env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:  # no monarch/ folder next to the script
        script = Path(tmp) / "recovery_scenario.py"
        script.write_text(SCENARIO.read_text())
        try:
            done = subprocess.run(
                [python, str(script), "--runs", str(runs)], cwd=tmp, env=env,
                capture_output=True, text=True, timeout=120 + 40 * runs, start_new_session=True,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            return [], f"{type(e).__name__}: {e}"
    rows = []
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if "error" in row:
                return rows, row["error"]
            if not row.get("warmup"):
                rows.append(row)
    return rows, "" if rows else f"exit {done.returncode}: {done.stderr[-400:]}"


def med(rows: list[dict], key: str) -> float | None:
    return statistics.median(r[key] for r in rows) if rows else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--monarch-python", default="/work/monarch-real/bin/python")
    ap.add_argument("--skip-monarch", action="store_true")
    args = ap.parse_args()
    if args.runs < 1 or args.steps < 2:
        ap.error("--runs must be >= 1 and --steps >= 2")

    faults = []
    monarch.actor.unhandled_fault_hook = faults.append  # the default one exits
    with contextlib.ExitStack() as cleanup:
        own_broker(cleanup)
        full = ours_full(args.runs, args.steps)
    ours_sc, ours_why = scenario(sys.executable, args.runs, with_repo=True)
    if args.skip_monarch:
        theirs, their_why = [], "skipped"
    else:
        theirs, their_why = scenario(args.monarch_python, args.runs, with_repo=False)

    rows = [
        ("ours, example", "SIGKILL -> __supervise__", med(full, "supervise")),
        ("ours, example", "SIGKILL -> replacement ready", med(full, "ready")),
        ("ours, example", "SIGKILL -> first step after recovery", med(full, "first_step")),
        ("ours, example", "training time lost", med(full, "lost")),
        ("ours, scenario", "SIGKILL -> __supervise__", med(ours_sc, "supervise")),
        ("ours, scenario", "SIGKILL -> replacement answers", med(ours_sc, "ready")),
        ("Monarch 0.7, scenario", "SIGKILL -> __supervise__", med(theirs, "supervise")),
        ("Monarch 0.7, scenario", "SIGKILL -> replacement answers", med(theirs, "ready")),
    ]
    print(
        f"\nmedians of {args.runs} runs ({args.steps} steps, 4 ranks, kill at step {args.steps // 2})"
    )
    print(f"{'who':22} {'figure':38} {'median':>9}")
    for who, figure, value in rows:
        shown = f"{value:8.3f}s" if value is not None else "      n/a"
        print(f"{who:22} {figure:38} {shown}")
    first = med(full, "first_step")
    print(f"\ngoal SIGKILL -> first step after recovery < {TARGET} s: "
          + ("met" if first is not None and first < TARGET else "NOT met"))  # fmt: skip
    ratios = {}
    for key, label in (("supervise", "SIGKILL -> __supervise__"), ("ready", "-> replacement")):
        a, b = med(theirs, key), med(ours_sc, key)
        if a and b:
            ratios[key] = a / b
            print(f"Monarch 0.7 / ours, scenario {label}: {a / b:.0f}x")
    if theirs and first:
        ratios["monarch_ready_over_ours_first_step"] = med(theirs, "ready") / first
        print(f"Monarch 0.7 replacement answering / ours back to training: "
              f"{ratios['monarch_ready_over_ours_first_step']:.0f}x")  # fmt: skip
    for who, why in (("ours scenario", ours_why), ("Monarch 0.7", their_why)):
        if why:
            print(f"{who}: {why}")
    if args.json:
        for who, figure, value in rows:
            print(json.dumps({"bench": "recovery", "who": who, "figure": figure,
                              "value": None if value is None else round(value, 4), "unit": "s",
                              "runs": args.runs}))  # fmt: skip
        print(
            json.dumps({"bench": "recovery", "ratios": {k: round(v, 2) for k, v in ratios.items()}})
        )


if __name__ == "__main__":
    main()
