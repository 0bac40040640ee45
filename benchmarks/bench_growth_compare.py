"""Growth curves side by side with the real Monarch: procs 1-32, actors 4-512 over 8 procs.

    python benchmarks/bench_growth_compare.py [--runs 3] [--quick] [--json]
        [--only ours,monarch] [--monarch-python PATH] [--procs 1,2,4] [--actors 4,8]

Each run is ``compare/scenarios_growth.py`` started with one framework's python
in a temporary directory (``compare/run.py`` does the starting, reaping and
probing: ours and the real Monarch share the import name ``monarch``). Our runs
get ``PYTHONPATH`` = this checkout, so "ours" is the code next to this script.
Runs are interleaved (ours, Monarch, ours, ...); every figure is the median over
``--runs``. Prints a table per sweep and the marginal cost per proc and per
actor (least-squares slope), and writes ``results/growth_compare.md``,
``.json`` and ``.png``. See benchmarks/README.md and NOTES.md entry 25.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE / "compare"))

import run as harness  # noqa: E402  (compare/run.py: runs, reaping, probing)

SCRIPT = "scenarios_growth.py"
FULL = dict(procs="1,2,4,8,16,32", actors="4,8,16,32,64,128,256,512", rounds=50, fire=10_000)
QUICK = dict(procs="1,2,4", actors="4,8,16", rounds=10, fire=1000)
# figure -> (label, unit shown, scale from the JSON unit)
FIGURES = {
    "spawn": ("spawn", "s", 1.0),
    "gather": ("bcast+gather", "ms", 1e3),
    "fire": ("10k fire-and-forget", "s", 1.0),
    "pss_proc_mb": ("PSS per proc", "MB", 1.0),
    "pss_added_mb": ("PSS all added", "MB", 1.0),
}


def frameworks(args: argparse.Namespace) -> list[harness.Framework]:
    ours = harness.Framework("ours", SCRIPT, args.ours_python, "import monarch.broker")
    ours.env["PYTHONPATH"] = str(ROOT)  # our runs import this checkout's `monarch`
    monarch_python = harness.peer_python(
        args.monarch_python, "COMPARE_MONARCH_PYTHON", "venv-monarch"
    )
    real = harness.Framework(
        "monarch", SCRIPT, monarch_python, "import monarch._rust_bindings, torch"
    )
    return [ours, real]


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files (no display), or None where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x; None with fewer than two x values."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


class Results:
    """Medians per (framework, sweep, x, figure) and what is written from them."""

    def __init__(self, fws: list[harness.Framework], runs: int) -> None:
        self.fws = fws
        self.runs = runs
        self.values: dict[tuple[str, str, int, str], list[float]] = {}
        self.errors: dict[str, list[str]] = {}

    def add(self, fw: harness.Framework, rows: list[dict]) -> None:
        for r in rows:
            if "info" in r:
                if "version" in r["info"]:
                    fw.label = f"{fw.name} {r['info']['version']}"
            elif "error" in r:
                self.errors.setdefault(fw.name, []).append(f"{r['scenario']}: {r['error']}")
            elif r.get("sweep"):
                key = (fw.name, r["sweep"], int(r["x"]), r["figure"])
                self.values.setdefault(key, []).append(r["value"])

    def median(self, fw: str, sweep: str, x: int, figure: str) -> float | None:
        vals = self.values.get((fw, sweep, x, figure))
        return statistics.median(vals) if vals else None

    def xs(self, sweep: str) -> list[int]:
        return sorted({k[2] for k in self.values if k[1] == sweep})

    def slopes(self, fw: str, sweep: str) -> dict[str, float | None]:
        out = {}
        for figure in FIGURES:
            pts = [(x, self.median(fw, sweep, x, figure)) for x in self.xs(sweep)]
            out[figure] = slope([(x, y) for x, y in pts if y is not None])
        return out

    def table(self, sweep: str) -> list[str]:
        names = [fw.name for fw in self.fws if not fw.missing]
        unit = "procs" if sweep == "procs" else "actors"
        head = f"| {unit} | " + " | ".join(
            f"{FIGURES[f][0]} ({FIGURES[f][1]}) {n}" for f in FIGURES for n in names
        )
        lines = [head + " |", "|" + "---|" * (1 + len(FIGURES) * len(names))]
        for x in self.xs(sweep):
            cells = []
            for figure, (_, _, scale) in FIGURES.items():
                for n in names:
                    v = self.median(n, sweep, x, figure)
                    got = len(self.values.get((n, sweep, x, figure), []))
                    if v is None:
                        failed = (n, sweep, x, f"{figure}_failed") in self.values
                        cells.append("failed" if failed else "-")
                    else:
                        part = f" ({got}/{self.runs})" if got < self.runs else ""
                        cells.append(f"{v * scale:.3g}{part}")
            lines.append(f"| {x} | " + " | ".join(cells) + " |")
        per = "proc" if sweep == "procs" else "actor"
        lines.append("")
        for n in names:
            s = self.slopes(n, sweep)
            parts = []
            for figure, (label, unit_shown, scale) in FIGURES.items():
                if s[figure] is not None:
                    n_pts = sum(
                        self.median(n, sweep, x, figure) is not None for x in self.xs(sweep)
                    )
                    part = "" if n_pts == len(self.xs(sweep)) else f" (fit over {n_pts} sizes)"
                    parts.append(f"{label} {s[figure] * scale:+.3g} {unit_shown}{part}")
            lines.append(f"marginal cost per {per}, {n}: " + ", ".join(parts))
        return lines

    def json_rows(self) -> list[dict]:
        rows = []
        for (fw, sweep, x, figure), vals in sorted(self.values.items()):
            rows.append(dict(bench="growth_compare", framework=fw, sweep=sweep, x=x,
                             figure=figure, value=statistics.median(vals), runs=vals))  # fmt: skip
        for fw in self.fws:
            if fw.missing:
                continue
            for sweep in ("procs", "actors"):
                for figure, value in self.slopes(fw.name, sweep).items():
                    rows.append(dict(bench="growth_compare", framework=fw.name, sweep=sweep,
                                     slope=figure, value=value))  # fmt: skip
        return rows

    def plot(self, path: Path) -> bool:
        plt = pyplot()
        if plt is None:
            return False
        figs = ["spawn", "gather", "fire", "pss_added_mb"]
        fig, axes = plt.subplots(2, len(figs), figsize=(16, 7.5))
        for row, sweep in enumerate(("procs", "actors")):
            xs = self.xs(sweep)
            for col, figure in enumerate(figs):
                ax = axes[row][col]
                label, unit, scale = FIGURES[figure]
                for fw, style in zip(self.fws, ("o-", "s--"), strict=False):
                    pts = [(x, self.median(fw.name, sweep, x, figure)) for x in xs]
                    pts = [(x, y * scale) for x, y in pts if y is not None]
                    if pts:
                        s = self.slopes(fw.name, sweep)[figure]
                        tail = "" if s is None else f" ({s * scale:+.3g} {unit}/{sweep[:-1]})"
                        ax.plot(
                            *zip(*pts, strict=True), style, label=f"{fw.label or fw.name}{tail}"
                        )
                ax.set_xscale("log", base=2)
                ax.set(xlabel=sweep if sweep == "procs" else "actors (over 8 procs)",
                       ylabel=f"{label} ({unit})", title=f"{label} vs {sweep}")  # fmt: skip
                ax.legend(fontsize=7)
        fig.suptitle(f"growth, median of {self.runs} runs (slope = marginal cost, linear fit)")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per framework; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small sizes and counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    ap.add_argument("--only", default="ours,monarch", help="frameworks to run")
    ap.add_argument("--ours-python", default=sys.executable, help="python of our venv")
    ap.add_argument("--monarch-python", help="python of a venv with torchmonarch")
    ap.add_argument("--procs", help="procs sweep sizes, e.g. 1,2,4 ('' for none)")
    ap.add_argument("--actors", help="actors sweep sizes, e.g. 4,8,16 ('' for none)")
    ap.add_argument("--rounds", type=int, help="broadcast-and-gather rounds per point")
    ap.add_argument("--fire", type=int, help="fire-and-forget messages per point")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--out", default=str(RESULTS / "growth_compare"), help="results path stem")
    ap.add_argument("--replot", metavar="JSON", help="no runs: rewrite the .md/.png from a .json")
    args = ap.parse_args()
    if args.replot:
        replot(Path(args.replot), args)
        return
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    sizes = dict(QUICK if args.quick else FULL)
    for k in sizes:
        if getattr(args, k) is not None:
            sizes[k] = getattr(args, k)
    extra = [f"--{k}={v}" for k, v in sizes.items()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a run's `finally` reaps

    fws = frameworks(args)
    only = {s.strip() for s in args.only.split(",")}
    for fw in fws:
        if fw.name in only:
            harness.probe(fw)
        else:
            fw.missing = "not run (--only)"
    res = Results(fws, args.runs)
    load_start = os.getloadavg()
    for i in range(args.runs):
        for fw in fws:
            if fw.missing:
                continue
            t = time.monotonic()
            rows, err = harness.run_once(fw, extra, args.timeout)
            res.add(fw, rows)
            print(f"run {i + 1}/{args.runs} {fw.name}: {time.monotonic() - t:.0f} s, "
                  f"{len(rows)} lines", file=sys.stderr, flush=True)  # fmt: skip
            if "[driver]" in err or any("error" in r for r in rows):
                tail = "\n".join(err.strip().splitlines()[-15:])
                print(f"  stderr tail:\n{tail}", file=sys.stderr, flush=True)
    load = "load average " + " -> ".join(
        "/".join(f"{x:.1f}" for x in triple) for triple in (load_start, os.getloadavg())
    )
    write(res, args, sizes, load)


def replot(path: Path, args: argparse.Namespace) -> None:
    """Rebuild the report from a .json this script wrote (every run's value is in it)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    meta = next((r for r in rows if r.get("meta")), {})
    fws = []
    for name in ("ours", "monarch"):
        fw = harness.Framework(name, SCRIPT, "", "")
        fw.label = meta.get("labels", {}).get(name, "")
        fw.missing = "" if any(r.get("framework") == name for r in rows) else "not run"
        fws.append(fw)
    args.runs = meta.get("runs", args.runs)
    res = Results(fws, args.runs)
    for r in rows:
        if "runs" in r and "sweep" in r and "figure" in r:
            res.values[(r["framework"], r["sweep"], r["x"], r["figure"])] = r["runs"]
    res.errors = meta.get("errors", {})
    write(res, args, meta.get("sizes", {}), meta.get("load", ""))


def write(res: Results, args: argparse.Namespace, sizes: dict, load: str) -> None:
    labels = ", ".join(f"{fw.label or fw.name}" for fw in res.fws if not fw.missing)
    lines = [f"median of {args.runs} runs per framework, interleaved ({labels}); {load}",
             f"sizes: {sizes}", ""]  # fmt: skip
    for sweep in ("procs", "actors"):
        if res.xs(sweep):
            lines += [f"### {sweep} sweep", "", *res.table(sweep), ""]
    for fw in res.fws:
        if fw.missing:
            lines.append(f"{fw.name}: {fw.missing}")
        for note in sorted(set(fw.run_notes)):
            lines.append(f"{fw.name}: {note}")
        if fw.leftovers:
            lines.append(f"{fw.name}: {fw.leftovers} process(es) left behind, killed by the driver")
    for name, errs in res.errors.items():
        for e in sorted(set(errs)):
            lines.append(f"{name} failed: {e}")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    meta = dict(bench="growth_compare", meta=1, runs=args.runs, sizes=sizes, load=load,
                labels={fw.name: fw.label for fw in res.fws}, errors=res.errors)  # fmt: skip
    rows = [meta, *res.json_rows()]
    out.with_suffix(".json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if args.json:
        for r in rows:
            print(json.dumps(r))
    wrote = [out.with_suffix(".md"), out.with_suffix(".json")]
    if res.plot(out.with_suffix(".png")):
        wrote.append(out.with_suffix(".png"))
    print("wrote " + ", ".join(str(p) for p in wrote), file=sys.stderr)


if __name__ == "__main__":
    main()
