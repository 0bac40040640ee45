"""The model's view as text: number formats, state colours, and ``monarch top --once``.

The Textual app and the plain snapshot share these, so both read the same:
rates in calls/s, latencies with a unit (us, ms, s), memory in MiB/GiB, and
one colour per state.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

STATE_STYLE = {
    "serving": "green",
    "up": "green",
    "live": "green",
    "starting": "cyan",
    "stalled": "bold yellow",
    "failed": "bold red",
    "stopped": "dim",
    "silent": "magenta",
    "ended": "bold red",
    "waiting": "yellow",
    "unknown": "dim",
    "stall over": "yellow",
}


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}/s" if v >= 100 else f"{v:.1f}/s"


def fmt_seconds(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 1e-3:
        return f"{v * 1e6:.0f}us"
    if v < 1:
        return f"{v * 1e3:.1f}ms"
    return f"{v:.2f}s"


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 2**30:
        return f"{v / 2**30:.1f}G"
    return f"{v / 2**20:.0f}M"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def past_stall(s: dict[str, Any]) -> str:
    return f"{s.get('endpoint')} took {fmt_seconds(s.get('finished_after'))} (caller {s.get('caller') or '?'})"


def proc_label(p: dict[str, Any]) -> Text:
    t = Text(f"proc {p['uid']} ")
    t.append(f"pid {p.get('pid') or '?'} rank {p.get('rank')} ", style="dim")
    t.append(state_text(p["state"]))
    t.append(f"  cpu {fmt_pct(p.get('cpu_pct'))} mem {fmt_bytes(p.get('rss_bytes'))}", style="dim")
    return t


def mesh_label(m: dict[str, Any]) -> Text:
    states: dict[str, int] = {}
    for a in m["actors"]:
        states[a["state"]] = states.get(a["state"], 0) + 1
    t = Text(f"mesh {m['name']} ", style="bold")
    t.append(f"({m['class']}) ", style="dim")
    for i, (s, n) in enumerate(sorted(states.items())):
        t.append(", " if i else "")
        t.append(f"{n} {s}", style=STATE_STYLE.get(s, ""))
    return t


def actor_label(a: dict[str, Any]) -> Text:
    t = Text(f"{a['mesh']}[{a['rank']}] ")
    t.append(state_text(a["state"]))
    if a.get("failure"):
        t.append(f"  {a['summary']}", style="red")
    return t


def host_label(h: dict[str, Any]) -> Text:
    t = Text(f"host {h['name']} ", style="bold")
    t.append("(agent) " if h["kind"] == "agent" else "(this machine) ", style="dim")
    return t.append(state_text(h["state"]))


def endpoint_table(rows: list[dict[str, Any]], title: str = "ENDPOINTS") -> Table:
    table = Table(title=title, title_justify="left", expand=False, box=None, header_style="bold")
    for col in (
        "mesh",
        "endpoint",
        "actors",
        "rate",
        "in-flight",
        "p50",
        "p99",
        "p99 all",
        "errors",
    ):
        table.add_column(col, justify="left" if col in ("mesh", "endpoint") else "right")
    for r in rows:
        table.add_row(
            r["mesh"],
            r["endpoint"],
            str(r["actors"]),
            fmt_rate(r["rate"]),
            str(r["in_flight"]),
            fmt_seconds(r["p50"]),
            fmt_seconds(r["p99"]),
            fmt_seconds(r["p99_all"]),
            Text(str(r["errors"]), style="red" if r["errors"] else ""),
        )
    return table


def problems_table(view: dict[str, Any]) -> Table:
    """Failures (with their reasons) and stalls, newest and longest first."""
    table = Table(title="FAILURES AND STALLS", title_justify="left", box=None, header_style="bold")
    for col in ("what", "actor / proc", "detail"):
        table.add_column(col)
    for f in view["failures"]:
        table.add_row(state_text("failed"), f["actor_id"], f["summary"])
    for s in view["stalls"]:
        who = s["actor_id"] or f"proc {s['proc']} (loop)"
        what = (
            f"{s['endpoint']} running {fmt_seconds(s['seconds'])}"
            if s["endpoint"]
            else f"loop blocked {fmt_seconds(s['seconds'])}"
        )
        table.add_row(state_text("stalled"), who, what)
    for s in view["past_stalls"]:
        table.add_row(state_text("stall over"), s["actor_id"], past_stall(s))
    if not view["failures"] and not view["stalls"] and not view["past_stalls"]:
        table.add_row(Text("none", style="dim"), "", "")
    return table


def tree(view: dict[str, Any]) -> Tree:
    root = Tree(Text(f"namespace {view['namespace']}", style="bold"))
    for h in view["hosts"]:
        hn = root.add(host_label(h))
        for p in h["procs"]:
            pn = hn.add(proc_label(p))
            for m in p["meshes"]:
                mn = pn.add(mesh_label(m))
                for a in m["actors"]:
                    mn.add(actor_label(a))
    return root


def header(view: dict[str, Any]) -> Text:
    t = Text("monarch top  ", style="bold")
    t.append(state_text(view["status"]))
    t.append(f"  {view['message']}")
    tot = view["totals"]
    t.append(f"\n{tot['procs']} procs, {tot['actors']} actors, {fmt_rate(tot['rate'])} total, ")
    t.append(f"{tot['failed']} failed", style="red" if tot["failed"] else "")
    t.append(", ")
    t.append(f"{tot['stalled']} stalled", style="yellow" if tot["stalled"] else "")
    t.append(f", {tot['silent']} silent procs")
    return t


def snapshot(view: dict[str, Any]) -> Group:
    """Everything ``monarch top --once`` prints."""
    return Group(
        header(view),
        Text(""),
        tree(view),
        Text(""),
        endpoint_table(view["endpoints"]),
        Text(""),
        problems_table(view),
    )
