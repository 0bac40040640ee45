"""Thousands of actors per broadcast, side by side: ours, the real Monarch, ours on a 3-node cluster.

    python benchmarks/bench_scale.py [--sizes 512,2048,8192] [--procs 8,16] [--runs 1]
        [--only ours,monarch,cluster] [--monarch-python PATH] [--quick] [--json]

Each run is ``compare/scenarios_growth.py``'s actors sweep (``compare/run.py``
starts it with each framework's python in a temporary directory and reaps what
it leaves): for P in ``--procs``, P procs hold N actors for N in ``--sizes``, as
N/P actor meshes of P, the only layout Monarch 0.7 has (one actor per proc per
mesh: its ``ProcMesh.spawn`` takes no extent), so the same script runs on both.
One "broadcast and gather to N actors" is one ``call`` to each of the N/P meshes
and waiting for all N replies. Figures per point: ``spawn`` (the N actors, until
each mesh answered once), broadcast-and-gather p50 and p99 over ``--rounds``,
fire-and-forget (seconds per 10,000 broadcasts to all N actors; fewer sent and
scaled, see the scenario), PSS per proc and of everything the run added, and
from it memory per actor (what the run added, divided by N).

Variants:

* ``ours``: the client and its procs on one nats-server that this driver starts
  with HTTP monitoring (``MONARCH_NATS_URL``; the same server the embedded
  broker runs), whose ``/varz`` counters the scenario reads around the rounds
  and over an idle window: the measured side of the model in docs/scale.md;
* ``monarch``: torchmonarch 0.7 (``--monarch-python``, or
  ``COMPARE_MONARCH_PYTHON``, or ``../venv-monarch``);
* ``per_proc``: ours on one server as ``ours``, but the N actors are one mesh,
  ``procs.per_proc(actors=N/P)`` (our extension): a broadcast is one call, and
  each proc's replies to it leave as one message;
* ``per_proc_async``: ``per_proc`` with ``async def`` endpoints: the actors run on
  their proc's loop (no thread each), share one subscription per proc for what the
  whole group hears and read a broadcast's arguments once per proc (NOTES 62);
* ``cluster``: ours with ``MONARCH_NATS_URL`` naming the three nodes of a routed
  cluster on loopback (``monarch.broker.connections.cluster``): nats-py picks a
  node at random per connection, so the client and the procs spread over the
  nodes and a call crosses routes; this driver samples each node's connection
  count during the run to show the spread.

Writes ``results/scale.md``, ``.json`` and ``.png``. Runs of one P are
interleaved (ours, Monarch, cluster, ours, ...); figures are medians over
``--runs``. NOTES.md entry 53 has a measured run and what it shows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE / "compare"))
sys.path.insert(0, str(ROOT))

import run as harness  # noqa: E402  (compare/run.py: runs, reaping, probing)
from bench_growth_compare import pyplot, slope  # noqa: E402  (beside this script)

from monarch.broker.connections.cluster import nats_cluster  # noqa: E402
from monarch.broker.connections.server import EmbeddedBroker, free_port  # noqa: E402

SCRIPT = "scenarios_growth.py"
FULL = dict(sizes="512,2048,8192", procs="8,16", rounds=20, fire=2000)
QUICK = dict(sizes="64,256", procs="8", rounds=5, fire=200)
VARIANTS = ("ours", "monarch", "cluster", "per_proc", "per_proc_async")
# figure -> (label, unit shown, scale from the JSON unit)
FIGURES = {
    "spawn": ("spawn", "s", 1.0),
    "gather": ("bcast+gather p50", "ms", 1e3),
    "gather_p99": ("bcast+gather p99", "ms", 1e3),
    "reduce": ("sum merged on procs p50", "ms", 1e3),  # per_proc layouts only (reducer)
    "fire": ("10k fire-and-forget", "s", 1.0),
    "pss_proc_mb": ("PSS per proc", "MB", 1.0),
    "kb_per_actor": ("added PSS per actor", "KB", 1.0),
}
MODEL = ("round_in_msgs", "round_out_msgs", "round_in_bytes", "round_out_bytes",
         "subscriptions", "connections", "idle_per_s_in_msgs", "idle_per_s_out_msgs",
         "slow_consumers")  # fmt: skip


@contextlib.contextmanager
def single_broker() -> Iterator[tuple[str, list[str]]]:
    """One nats-server with JetStream and HTTP monitoring: (client URL, monitor URLs)."""
    port = free_port()
    broker = EmbeddedBroker(extra_args=["-m", str(port)]).start()
    try:
        yield broker.url, [f"http://127.0.0.1:{port}"]
    finally:
        broker.stop()


@contextlib.contextmanager
def three_nodes() -> Iterator[tuple[str, list[str]]]:
    with tempfile.TemporaryDirectory(prefix="scale-cluster-") as folder:
        with nats_cluster(Path(folder), size=3) as cluster:
            yield cluster.url, [f"http://127.0.0.1:{n.monitor_port}" for n in cluster.nodes]


class Spread:
    """Samples each node's client connections while a run goes; keeps the largest per node."""

    def __init__(self, monitors: list[str]) -> None:
        self.monitors = monitors
        self.most = [0] * len(monitors)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Spread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            for i, url in enumerate(self.monitors):
                try:
                    with urllib.request.urlopen(f"{url}/varz", timeout=5) as r:
                        self.most[i] = max(self.most[i], int(json.load(r)["connections"]))
                except (OSError, ValueError, KeyError):
                    continue


class Results:
    """Medians per (variant, P, N, figure)."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.values: dict[tuple[str, int, int, str], list[float]] = {}
        self.labels: dict[str, str] = {}
        self.errors: list[str] = []
        self.spread: dict[int, list[list[int]]] = {}  # P -> per run, connections per node

    def add(self, variant: str, p: int, rows: list[dict]) -> None:
        for r in rows:
            if "info" in r:
                if "version" in r["info"]:
                    self.labels[variant] = f"{variant} ({r['framework']} {r['info']['version']})"
            elif "error" in r:
                self.errors.append(f"{variant}, {p} procs, {r['scenario']}: {r['error']}")
            elif r.get("sweep") == "actors":
                n = int(r["x"])
                self.values.setdefault((variant, p, n, r["figure"]), []).append(r["value"])
                if r["figure"] == "pss_added_mb":
                    kb = r["value"] * 1024 / n
                    self.values.setdefault((variant, p, n, "kb_per_actor"), []).append(kb)

    def median(self, variant: str, p: int, n: int, figure: str) -> float | None:
        vals = self.values.get((variant, p, n, figure))
        return statistics.median(vals) if vals else None

    def points(self) -> list[tuple[int, int]]:
        return sorted({(k[1], k[2]) for k in self.values})

    def variants(self) -> list[str]:
        return [v for v in VARIANTS if any(k[0] == v for k in self.values)]

    def table(self) -> list[str]:
        measured = {(k[0], k[3]) for k in self.values}
        columns = [(f, v) for f in FIGURES for v in self.variants() if (v, f) in measured]
        head = "| procs | actors | " + " | ".join(
            f"{FIGURES[f][0]} ({FIGURES[f][1]}) {v}" for f, v in columns
        )
        lines = [head + " |", "|" + "---|" * (2 + len(columns))]
        for p, n in self.points():
            cells = []
            for figure, v in columns:
                m = self.median(v, p, n, figure)
                cells.append("-" if m is None else f"{m * FIGURES[figure][2]:.3g}")
            lines.append(f"| {p} | {n} | " + " | ".join(cells) + " |")
        return lines

    def ratios(self, variant: str = "ours") -> list[str]:
        """``variant`` / Monarch per point: below 1 means ours is ahead."""
        if not {variant, "monarch"} <= set(self.variants()):
            return []
        both = {k[3] for k in self.values if k[0] == variant} & {
            k[3] for k in self.values if k[0] == "monarch"
        }
        figures = [f for f in FIGURES if f in both]
        lines = ["| procs | actors | " + " | ".join(FIGURES[f][0] for f in figures) + " |",
                 "|" + "---|" * (2 + len(figures))]  # fmt: skip
        for p, n in self.points():
            cells = []
            for figure in figures:
                a, b = self.median(variant, p, n, figure), self.median("monarch", p, n, figure)
                cells.append("-" if a is None or not b else f"{a / b:.2f}x")
            lines.append(f"| {p} | {n} | " + " | ".join(cells) + " |")
        return lines

    def marginal(self) -> list[str]:
        """Memory one more actor costs: the slope of the procs' PSS (all of them) over N."""
        lines = []
        for v in self.variants():
            for p in sorted({p for p, _ in self.points()}):
                pts = [(n, self.median(v, p, n, "pss_procs_total_mb")) for pp, n in self.points()
                       if pp == p]  # fmt: skip
                pts = [(n, y) for n, y in pts if y is not None]
                fit = slope(pts)
                if fit is None:
                    continue
                lines.append(f"- {v}, {p} procs: {fit * 1024:.0f} KB of PSS per added actor")
        return lines

    def model(self) -> list[str]:
        """What the brokers counted (ours, single server and cluster), per point."""
        lines = []
        for v in ("ours", "cluster", "per_proc", "per_proc_async"):
            pts = [(p, n) for p, n in self.points() if self.median(v, p, n, "subscriptions")]
            if not pts:
                continue
            lines += [f"{v}: | procs | actors | " + " | ".join(MODEL) + " |",
                      "|" + "---|" * (2 + len(MODEL))]  # fmt: skip
            for p, n in pts:
                cells = [f"{self.median(v, p, n, f) or 0:.0f}" for f in MODEL]
                lines.append(f"| {p} | {n} | " + " | ".join(cells) + " |")
            lines.append("")
        return lines

    def json_rows(self) -> list[dict]:
        rows = []
        for (v, p, n, figure), vals in sorted(self.values.items()):
            rows.append(dict(bench="scale", variant=v, procs=p, actors=n, figure=figure,
                             value=statistics.median(vals), runs=vals))  # fmt: skip
        for p, runs in sorted(self.spread.items()):
            rows.append(dict(bench="scale", variant="cluster", procs=p,
                             figure="connections_per_node", runs=runs))  # fmt: skip
        return rows

    def plot(self, path: Path) -> bool:
        plt = pyplot()
        if plt is None:
            return False
        figs = ["gather", "spawn", "fire", "kb_per_actor"]
        ps = sorted({p for p, _ in self.points()})
        if not ps:
            return False
        fig, axes = plt.subplots(len(ps), len(figs), figsize=(17, 4 * len(ps)), squeeze=False)
        styles = {"ours": "o-", "monarch": "s--", "cluster": "^:", "per_proc": "D-.",
                  "per_proc_async": "v-"}  # fmt: skip
        for row, p in enumerate(ps):
            for col, figure in enumerate(figs):
                ax = axes[row][col]
                label, unit, scale = FIGURES[figure]
                for v in self.variants():
                    pts = [(n, self.median(v, p, n, figure)) for pp, n in self.points() if pp == p]
                    pts = [(n, y * scale) for n, y in pts if y is not None]
                    if pts:
                        ax.plot(*zip(*pts, strict=True), styles[v], label=self.labels.get(v, v))
                ax.set_xscale("log", base=2)
                if figure in ("gather", "spawn", "fire"):
                    ax.set_yscale("log")
                ax.set(xlabel=f"actors (over {p} procs, N/{p} meshes)",
                       ylabel=f"{label} ({unit})", title=f"{label}, {p} procs")  # fmt: skip
                ax.legend(fontsize=7)
        fig.suptitle(f"scale: median of {self.runs} run(s) per point")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        return True


def report(results: Results, command: str, seconds: float | None) -> str:
    """The markdown of a run: the table, ours / Monarch, memory, what the brokers counted."""
    took = f", {seconds:.0f} s" if seconds is not None else ""
    lines = [f"# Scale, side by side ({time.strftime('%Y-%m-%d')}{took})", "",
             f"Command: `python benchmarks/bench_scale.py {command}`", "",
             *results.table(), ""]  # fmt: skip
    for variant in ("ours", "per_proc", "per_proc_async"):
        if results.ratios(variant):
            lines += [f"{variant} / Monarch 0.7 (below 1: ours ahead):", "",
                      *results.ratios(variant), ""]  # fmt: skip
    if results.marginal():
        lines += ["Memory per actor (slope of all procs' PSS over N):", "", *results.marginal(), ""]
    if results.model():
        lines += ["What the nats-servers counted (`/varz`; per broadcast-and-gather round, "
                  "and per second while idle; docs/scale.md):", "", *results.model()]  # fmt: skip
    for p, runs in sorted(results.spread.items()):
        lines.append(f"cluster, {p} procs: most client connections seen per node, per run: {runs}")
    if results.errors:
        lines += ["", "Errors:", *(f"- {e}" for e in results.errors)]
    return "\n".join(lines) + "\n"


def replot(source: Path, out: Path) -> None:
    """The .md and .png of a saved run (its .json), without running anything."""
    rows = json.loads(source.read_text())
    results = Results(max((len(r["runs"]) for r in rows if "actors" in r), default=1))
    for r in rows:
        if "actors" in r:
            key = (r["variant"], r["procs"], r["actors"], r["figure"])
            results.values[key] = list(r["runs"])
        elif r.get("figure") == "connections_per_node":
            results.spread[r["procs"]] = r["runs"]
    out.with_suffix(".md").write_text(report(results, f"--replot {source.name}", None))
    if not results.plot(out.with_suffix(".png")):
        sys.exit("matplotlib is not installed (pip install -e '.[bench]')")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per variant; figures are medians")
    ap.add_argument("--quick", action="store_true", help="small sizes and counts (smoke test)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per figure")
    ap.add_argument("--only", default=",".join(VARIANTS), help="variants to run")
    ap.add_argument("--ours-python", default=sys.executable, help="python of our venv")
    ap.add_argument("--monarch-python", help="python of a venv with torchmonarch")
    ap.add_argument("--sizes", help="actor counts, e.g. 512,2048")
    ap.add_argument("--procs", help="proc counts, e.g. 8,16")
    ap.add_argument("--rounds", type=int, help="broadcast-and-gather rounds per point")
    ap.add_argument("--fire", type=int, help="fire-and-forget messages per point (scaled)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--out", default=str(RESULTS / "scale"), help="results path stem")
    ap.add_argument("--replot", metavar="JSON", help="no runs: rewrite the .md/.png from a .json")
    args = ap.parse_args()
    if args.replot:
        replot(Path(args.replot), Path(args.out))
        return
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    counts = dict(QUICK if args.quick else FULL)
    for key in ("sizes", "procs", "rounds", "fire"):
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    only = {v.strip() for v in args.only.split(",") if v.strip()}
    unknown = only - set(VARIANTS)
    if unknown:
        ap.error(f"--only: unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")

    ours = harness.Framework("ours", SCRIPT, args.ours_python, "import monarch.broker")
    monarch_python = harness.peer_python(
        args.monarch_python, "COMPARE_MONARCH_PYTHON", "venv-monarch"
    )
    real = harness.Framework(
        "monarch", SCRIPT, monarch_python, "import monarch._rust_bindings, torch"
    )
    for fw in (ours, real):
        harness.probe(fw)
    if "monarch" in only and real.missing:
        print(f"monarch: {real.missing}; running without it", file=sys.stderr)
        only.discard("monarch")
    if ours.missing:
        sys.exit(f"ours: {ours.missing}")

    results = Results(args.runs)
    started = time.monotonic()
    for p in [int(x) for x in str(counts["procs"]).split(",")]:
        extra = ["--procs", "", "--actors", str(counts["sizes"]), "--actor-procs", str(p),
                 "--rounds", str(counts["rounds"]), "--fire", str(counts["fire"])]  # fmt: skip
        for run in range(args.runs):
            for v in [v for v in VARIANTS if v in only]:
                print(f"[scale] {v}, {p} procs, run {run + 1}/{args.runs}", file=sys.stderr)
                if v == "monarch":
                    rows, err = harness.run_once(real, extra, args.timeout)
                else:
                    broker = three_nodes() if v == "cluster" else single_broker()
                    layout = ["--layout", v] if v.startswith("per_proc") else []
                    with broker as (url, monitors):
                        # PYTHONPATH: our runs import the `monarch` beside this script
                        ours.env = {"MONARCH_NATS_URL": url, "MONARCH_OPEN_BROKER_OK": "1",
                                    "PYTHONPATH": str(ROOT)}  # fmt: skip
                        with Spread(monitors) as spread:
                            rows, err = harness.run_once(
                                ours, [*extra, *layout, "--varz", ",".join(monitors)], args.timeout
                            )
                        if v == "cluster":
                            results.spread.setdefault(p, []).append(spread.most)
                results.add(v, p, rows)
                if not rows or any("error" in r for r in rows):
                    tail = "\n".join(err.strip().splitlines()[-15:])
                    print(f"[scale] {v}, {p} procs: stderr tail:\n{tail}", file=sys.stderr)

    text = report(results, " ".join(sys.argv[1:]), time.monotonic() - started)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(results.json_rows(), indent=1) + "\n")
    if results.plot(out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}")
    if args.json:
        for row in results.json_rows():
            print(json.dumps(row))


if __name__ == "__main__":
    main()
