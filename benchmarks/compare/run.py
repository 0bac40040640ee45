"""Side by side: our package, the real Monarch and Ray on the same scenarios S1-S7.

    python benchmarks/compare/run.py [--runs N] [--quick] [--json]
        [--only ours,monarch,ray] [--monarch-python PATH] [--ray-python PATH]

Each framework lives in a virtual environment of its own (ours and the real
Monarch share the import name ``monarch``), so every run is a subprocess: the
scenario script for that framework, started with that venv's python, in a
fresh temporary directory, in a session of its own, with a tag in its
environment. Runs are interleaved (run 1 of each framework, then run 2, ...),
so noise hits all of them alike; figures are medians over runs. After each run
every process still carrying the tag (procs, brokers, Ray daemons) is killed
and counted. A framework whose venv is missing is reported as "not installed";
our own column needs nothing but this repository's venv. See
benchmarks/README.md for setting up the peer venvs and NOTES.md for results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BESIDE_REPO = HERE.parent.parent.parent  # peer venvs default to folders next to the checkout
TAG_VAR = "COMPARE_RUN_TAG"  # not MONARCH_*: both Monarchs read that prefix
RUN_TIMEOUT = 600.0  # seconds for one scenario-script run, all scenarios together
LEFTOVER_GRACE = 5.0  # seconds a run's processes get to exit on their own before SIGKILL


@dataclass
class Framework:
    name: str
    script: str
    python: str
    probe: str  # python code that fails unless this framework is installed
    label: str = ""  # name and version, from the scripts' info line
    missing: str = ""  # why it cannot run; empty if it can
    values: dict = field(default_factory=dict)  # (scenario, figure) -> [value per run]
    units: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # scenario -> [message per failed run]
    leftovers: int = 0  # processes killed after its runs
    env: dict = field(default_factory=dict)  # extra environment of its runs (--ours-env)
    run_notes: list = field(default_factory=list)  # runs killed or failed as a whole


def peer_python(flag: str | None, env_var: str, venv: str) -> str:
    """The flag, else the environment variable, else ``<venv>/bin/python`` beside the repo."""
    return flag or os.environ.get(env_var) or str(BESIDE_REPO / venv / "bin" / "python")


def frameworks(args: argparse.Namespace) -> list[Framework]:
    return [
        Framework("ours", "scenarios_monarch_api.py", args.ours_python, "import monarch.broker"),
        Framework(
            "monarch",
            "scenarios_monarch_api.py",
            peer_python(args.monarch_python, "COMPARE_MONARCH_PYTHON", "venv-monarch"),
            "import monarch._rust_bindings, torch",
        ),
        Framework(
            "ray",
            "scenarios_ray.py",
            peer_python(args.ray_python, "COMPARE_RAY_PYTHON", "venv-ray"),
            "import ray, torch",
        ),
    ]


def child_env(tag: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment less MONARCH_* (ours must start its embedded broker; the real
    Monarch has settings of the same prefix) and PYTHONPATH (each venv imports its own
    ``monarch``), plus the tag that finds every process a run leaves behind and the
    framework's own extra variables (``--ours-env``, for A/B runs of one setting)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    env[TAG_VAR] = tag
    return env


def probe(fw: Framework) -> None:
    if not Path(fw.python).exists():
        fw.missing = f"not installed ({fw.python} not found)"
        return
    with tempfile.TemporaryDirectory() as cwd:  # not the repo root: it holds our `monarch`
        try:
            r = subprocess.run(
                [fw.python, "-c", fw.probe], cwd=cwd, env=child_env("probe"),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            fw.missing = "not installed (import timed out)"
            return
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        fw.missing = f"not installed ({last[:80]})"


# -- processes -------------------------------------------------------------------


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (they descend from one run)."""
    needle = f"{TAG_VAR}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def reap(proc: subprocess.Popen, tag: str) -> int:
    """After a run: kill what it left behind; how many processes that was.

    A run still going loses its whole process group at once. Then the run's processes
    get a moment to exit (daemons told to stop), and every process still carrying the
    tag is killed one by one, wherever it is (procs run in sessions of their own).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + LEFTOVER_GRACE
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = tagged_pids(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        print(f"  killed {len(left)} leftover process(es): {left}", file=sys.stderr)
    return len(left)


def run_once(fw: Framework, extra: list[str], timeout: float) -> tuple[list[dict], str]:
    """One run of ``fw``'s scenario script: its result lines and its stderr."""
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="compare-") as cwd:
        results = Path(cwd) / "results.jsonl"
        cmd = [fw.python, str(HERE / fw.script), *extra, "--results", str(results)]
        killed = False
        # stderr goes to a file, not a pipe: a process the run leaves behind may hold it open.
        with open(Path(cwd) / "stderr.txt", "w+") as errors:
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=child_env(tag, fw.env), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                killed = True
            finally:
                fw.leftovers += reap(proc, tag)
            errors.seek(0)
            err = errors.read()
        lines = results.read_text().splitlines() if results.exists() else []
    rows = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    if killed:
        fw.run_notes.append(f"a run was killed after {timeout:.0f} s (--timeout)")
        err += f"\n[driver] run killed after {timeout:.0f} s"
    elif proc.returncode != 0:
        fw.run_notes.append(f"a run exited with status {proc.returncode}")
        err += f"\n[driver] exit status {proc.returncode}"
    return rows, err


def collect(fw: Framework, rows: list[dict]) -> None:
    for r in rows:
        if "info" in r:
            fw.label = f"{fw.name} {r['info'].get('version', '')}".strip()
        elif "error" in r:
            fw.errors.setdefault(r["scenario"], []).append(r["error"])
        else:
            key = (r["scenario"], r["figure"])
            fw.values.setdefault(key, []).append(r["value"])  # None: "> 60 s"
            fw.units[key] = r["unit"]


# -- report ----------------------------------------------------------------------

SCENARIOS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7")
# (scenario, figure, description, higher is better)
ROWS = [
    ("S1", "p50", "S1 call_one round trip", False),
    ("S1", "p99", "S1 call_one round trip", False),
    ("S2", "rate", "S2 10,000 pipelined call_one", True),
    ("S3", "rate", "S3 broadcast + gather, 4 procs", True),
    ("S4", "rate", "S4 10,000 fire-and-forget + 1 call", True),
    ("S5", "warm", "S5 spawn 4 procs + 4 actors, replies", False),
    ("S5", "cold", "S5 same, first spawn (runtime start)", False),
    ("S6", "rate", "S6 64 MiB tensor as an argument", True),
    ("S7", "raise", "S7 SIGKILL -> in-flight call raises", False),
    ("S1raw", "p50", "S1 raw nats-py request/reply", False),
    ("S1raw", "p99", "S1 raw nats-py request/reply", False),
]
# (scenario, figure, what, bound, against): against is "monarch", "raw" or None (absolute, s)
TARGETS = [
    ("S1", "p50", "S1 p50 <= 0.7x Monarch's", ("<=", 0.7), "monarch"),
    ("S1", "p99", "S1 p99 <= 0.8x Monarch's", ("<=", 0.8), "monarch"),
    ("S1", "p50", "S1 p50 <= 1.3x raw nats-py RTT", ("<=", 1.3), "raw"),
    ("S2", "rate", "S2 rate >= 3x Monarch's", (">=", 3.0), "monarch"),
    ("S3", "rate", "S3 rate >= 1.5x Monarch's", (">=", 1.5), "monarch"),
    ("S4", "rate", "S4 rate >= 4x Monarch's", (">=", 4.0), "monarch"),
    ("S5", "warm", "S5 time <= 1x Monarch's", ("<=", 1.0), "monarch"),
    ("S5", "cold", "S5 first spawn <= 1x Monarch's", ("<=", 1.0), "monarch"),
    ("S6", "rate", "S6 MB/s >= 4x Monarch's", (">=", 4.0), "monarch"),
    ("S7", "raise", "S7 <= 0.2 s", ("<=", 0.2), None),
]


def median(values: list) -> float:
    """Median over runs; a run in which the call never raised counts as infinitely slow."""
    return statistics.median(math.inf if v is None else v for v in values)


def fmt(value: float, unit: str) -> str:
    if math.isinf(value):
        return "> 60 s"
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:,.0f} {unit}"


class Report:
    def __init__(self, fws: list[Framework], runs: int, load: str, skipped: set[str]) -> None:
        self.fws = {fw.name: fw for fw in fws}
        self.skipped = skipped
        self.runs = runs
        self.load = load  # the machine's load averages at the start and end
        self.notes: dict[str, int] = {}  # footnote text -> its number

    def figure(self, fw: Framework, scenario: str, figure: str) -> float | None:
        vals = fw.values.get((scenario, figure))
        return median(vals) if vals else None

    def cell(self, fw: Framework, scenario: str, figure: str) -> str:
        if fw.missing:
            return fw.missing.split(" (")[0]
        if scenario.removesuffix("raw") in self.skipped:
            return "skipped"
        vals = fw.values.get((scenario, figure))
        errs = fw.errors.get(scenario, [])
        tag = ""
        if errs:
            note = f"{fw.label or fw.name} {scenario}: {errs[0]}"
            tag = f"[{self.notes.setdefault(note, len(self.notes) + 1)}]"
        if not vals:
            return f"failed {tag}" if errs else "-"
        text = fmt(median(vals), fw.units[(scenario, figure)])
        if len(vals) < self.runs:
            text += f" ({len(vals)}/{self.runs} runs)"
        return f"{text} {tag}" if errs else text

    def ratio(self, ours: float | None, theirs: float | None) -> str:
        if ours is None or theirs is None:
            return ""
        if math.isinf(theirs):
            return "< 0.01" if not math.isinf(ours) else ""
        if math.isinf(ours):
            return ""
        return f"{ours / theirs:.2f}"

    def table(self) -> list[str]:
        ours, mon, ray = (self.fws[n] for n in ("ours", "monarch", "ray"))
        head = (
            f"{'scenario':38} {'fig':5} {ours.label or 'ours':>14} "
            f"{mon.label or 'monarch':>16} {'ours/it':>7} {ray.label or 'ray':>16} {'ours/it':>7}"
        )
        lines = [head, "-" * len(head)]
        for scenario, figure, what, _higher in ROWS:
            if scenario == "S1raw" and (scenario, figure) not in ours.values:
                continue
            cells = [self.cell(fw, scenario, figure) for fw in (ours, mon, ray)]
            o = self.figure(ours, scenario, figure)
            r_mon = self.ratio(o, self.figure(mon, scenario, figure)) if scenario != "S1raw" else ""
            r_ray = self.ratio(o, self.figure(ray, scenario, figure)) if scenario != "S1raw" else ""
            if scenario == "S1raw":
                cells[1] = cells[2] = ""
            lines.append(
                f"{what:38} {figure:5} {cells[0]:>14} {cells[1]:>16} {r_mon:>7} "
                f"{cells[2]:>16} {r_ray:>7}"
            )
        return lines

    def targets(self) -> list[tuple[str, str, str]]:
        ours, mon = self.fws["ours"], self.fws["monarch"]
        out = []
        for scenario, figure, what, (op, bound), against in TARGETS:
            o = self.figure(ours, scenario, figure)
            if against is None:  # an absolute bound, in seconds
                measured, shown = o, "-" if o is None else fmt(o, "s")
            else:
                base_fw, base_scenario = (
                    (mon, scenario) if against == "monarch" else (ours, "S1raw")
                )
                base = self.figure(base_fw, base_scenario, figure)
                if base_fw.missing:
                    measured, shown = None, "not installed"
                elif o is None or base is None:
                    measured, shown = None, "-"
                elif math.isinf(o):
                    measured, shown = math.inf, "ours > 60 s"
                elif math.isinf(base):
                    measured, shown = 0.0, "theirs > 60 s"
                else:
                    measured = o / base
                    shown = f"{measured:.2f}x"
            if measured is None:
                met = "-"
            else:
                met = "yes" if (measured <= bound if op == "<=" else measured >= bound) else "NO"
            out.append((what, shown, met))
        return out

    def print(self, as_json: bool) -> None:
        print(f"\nmedian of {self.runs} runs per framework (interleaved); {self.load}")
        for line in self.table():
            print(line)
        print(
            "\nours/it = our figure / theirs: below 1 is better for times (us, s), above 1 "
            "for rates.\nS5 times all 4 replies of one call() after spawn_procs + spawn; "
            "'first spawn' also starts the runtime (our embedded broker, Monarch's "
            "local host, ray.init)."
        )
        print(f"\n{'target (issues 8, 18)':40} {'measured':>26}  met")
        for what, shown, met in self.targets():
            print(f"{what:40} {shown:>26}  {met}")
        for note, i in self.notes.items():
            print(f"[{i}] {note}")
        for fw in self.fws.values():
            for note in sorted(set(fw.run_notes)):
                print(f"{fw.label or fw.name}: {note}; its missing figures are from the other runs")
        left = ", ".join(f"{fw.name} {fw.leftovers}" for fw in self.fws.values() if not fw.missing)
        print(f"\nprocesses left behind by the runs and killed by the driver: {left}")
        for fw in self.fws.values():
            if fw.missing:
                print(f"{fw.name}: {fw.missing}")
        if as_json:
            self.print_json()

    def print_json(self) -> None:
        ours = self.fws["ours"]
        for fw in self.fws.values():
            for (scenario, figure), vals in sorted(fw.values.items()):
                m = median(vals)
                o = self.figure(ours, scenario, figure)
                row = dict(bench="compare", framework=fw.label or fw.name, scenario=scenario,
                           figure=figure, value=None if math.isinf(m) else round(m, 4),
                           unit=fw.units[(scenario, figure)], runs=vals)  # fmt: skip
                if o is not None and fw.name != "ours" and not math.isinf(m) and m:
                    row["ours_over_it"] = None if math.isinf(o) else round(o / m, 4)
                print(json.dumps(row))
        for what, shown, met in self.targets():
            print(json.dumps(dict(bench="compare", target=what, measured=shown, met=met)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per framework; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    ap.add_argument("--only", default="ours,monarch,ray", help="frameworks to run")
    ap.add_argument("--skip", default="", help="scenarios not to run, e.g. S6,S7")
    ap.add_argument("--ours-python", default=sys.executable, help="python of our venv")
    ap.add_argument("--monarch-python", help="python of a venv with torchmonarch")
    ap.add_argument("--ray-python", help="python of a venv with ray and torch")
    ap.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for our runs (repeatable), e.g. MONARCH_BUSY_POLL_US=0",
    )
    ap.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help="seconds per run")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    only = {s.strip() for s in args.only.split(",")}
    skipped = {s.strip().upper() for s in args.skip.split(",") if s.strip()}
    extra = (["--quick"] if args.quick else []) + (["--skip", args.skip] if args.skip else [])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the run's `finally` reaps

    load_start = os.getloadavg()
    fws = frameworks(args)
    for pair in args.ours_env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            ap.error(f"--ours-env wants NAME=VALUE, not {pair!r}")
        fws[0].env[name] = value
    if fws[0].env:
        print(f"our runs also get {fws[0].env}", file=sys.stderr)
    for fw in fws:
        if fw.name in only:
            probe(fw)
        else:
            fw.missing = "not run (--only)"
    for i in range(args.runs):
        for fw in fws:
            if fw.missing:
                continue
            t = time.monotonic()
            rows, err = run_once(fw, extra, args.timeout)
            collect(fw, rows)
            seen = {r.get("scenario") for r in rows}
            absent = sorted(set(SCENARIOS) - seen - skipped)
            if absent:
                fw.run_notes.append(f"a run printed no result for {', '.join(absent)}")
            failed = absent or [r for r in rows if "error" in r] or "[driver]" in err
            print(f"run {i + 1}/{args.runs} {fw.name}: {time.monotonic() - t:.0f} s, "
                  f"{len(rows)} lines", file=sys.stderr, flush=True)  # fmt: skip
            if failed:
                tail = "\n".join(err.strip().splitlines()[-15:])
                print(f"  stderr tail:\n{tail}", file=sys.stderr, flush=True)
    loads = (load_start, os.getloadavg())
    load = "load average (1, 5, 15 min) " + " -> ".join(
        "/".join(f"{x:.1f}" for x in triple) for triple in loads
    )
    Report(fws, args.runs, load, skipped).print(args.json)


if __name__ == "__main__":
    main()
