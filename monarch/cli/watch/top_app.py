"""``monarch top``'s terminal app (Textual): the job's tree, the selection's endpoints, problems.

Left, the tree hosts -> procs -> actor meshes -> actors, coloured by state;
moving the cursor selects what the endpoint table sums over (the whole job
at the root). Right, the endpoint table (rate, in-flight, p50/p99 of the last
interval and since start, errors), the procs' CPU and memory, and the
failures and stalls. The poller runs as a task on the app's own event loop,
so one NATS connection feeds every panel. When the job ends the app says so
for a few seconds, then exits with that message (exit status 0).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Input, Static, Tree

from monarch.cli.watch import text as fmt
from monarch.cli.watch.model import WatchModel, aggregate
from monarch.cli.watch.poller import Poller

SORTS = ("name", "rate", "p99", "errors", "in_flight")
HELP = (
    "q quit   arrows move   enter expand/collapse   r refresh now   "
    "s sort endpoints   f filter (meshes, endpoints)   ? help on/off   esc close"
)
STOP_WAIT = 2.0  # seconds the poller may take to close its connection at exit
ENDED_LINGER = 3.0  # seconds "job ended" stays on screen before the app exits


class TopApp(App):
    """The live view; ``connect`` is an async callable returning a NATS connection."""

    CSS = """
    #status { height: 2; padding: 0 1; }
    #main { height: 1fr; }
    #tree { width: 46%; border: round $primary; }
    #right { width: 54%; }
    #endpoints { height: 2fr; border: round $primary; }
    #procs { height: 1fr; border: round $primary; }
    #problems { height: 1fr; border: round $primary; }
    #filter { dock: bottom; display: none; }
    #help { display: none; height: 3; padding: 0 1; background: $boost; }
    """
    ENABLE_COMMAND_PALETTE = False  # every action has its own key
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("r", "refresh_now", "refresh"),
        Binding("s", "sort", "sort"),
        Binding("f", "filter", "filter"),
        Binding("question_mark", "help", "help"),
        Binding("escape", "close", "close", show=False),
    ]

    def __init__(self, connect: Any, model: WatchModel) -> None:
        super().__init__()
        self.connect_nats = connect
        self.model = model
        self.sort = "name"
        self.filter_text = ""
        self.exit_message = ""
        self._poller: Poller | None = None
        self._poll_task: asyncio.Task | None = None
        self._shape: list[tuple] = []
        self._tree_nodes: list[Any] = []
        self._ended_at: float | None = None
        self._stopping_app = False

    def compose(self) -> ComposeResult:
        yield Static("connecting...", id="status")
        yield Static(HELP, id="help")
        with Horizontal(id="main"):
            yield Tree(f"namespace {self.model.namespace}", id="tree")
            with Vertical(id="right"):
                yield DataTable(id="endpoints", cursor_type="row")
                yield DataTable(id="procs", cursor_type="row")
                yield DataTable(id="problems", cursor_type="row")
        yield Input(
            placeholder="filter: part of a mesh or endpoint name (enter to apply)", id="filter"
        )
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#endpoints", DataTable).add_columns(
            "mesh", "endpoint", "actors", "rate", "in-flight", "p50", "p99", "p99 all", "errors"
        )
        self.query_one("#procs", DataTable).add_columns(
            "proc", "host", "pid", "state", "cpu", "mem", "threads", "loop stall"
        )
        self.query_one("#problems", DataTable).add_columns("what", "actor / proc", "detail")
        self.query_one("#endpoints").border_title = "endpoints (whole job)"
        self.query_one("#procs").border_title = "procs: CPU and memory"
        self.query_one("#problems").border_title = "failures and stalls"
        self.query_one("#tree").border_title = "hosts > procs > meshes > actors"
        tree = self.query_one("#tree", Tree)
        tree.root.data = {"kind": "job"}
        tree.root.expand()
        self._poll_task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            nc = await self.connect_nats()
        except ConnectionError as e:
            self.exit_message = f"monarch top: {e}"
            self.exit(1)
            return
        try:
            async with Poller(nc, self.model) as poller:
                self._poller = poller
                await poller.run(self.redraw)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    def exit(self, *args: Any, **kwargs: Any) -> None:
        self._stopping_app = True
        super().exit(*args, **kwargs)

    async def on_unmount(self) -> None:
        self._stopping_app = True
        await self._stop_polling()

    async def _stop_polling(self) -> None:
        if self._poll_task is not None and self._poll_task is not asyncio.current_task():
            self._poll_task.cancel()
            # Bounded: closing the connection must never keep the app from exiting.
            await asyncio.wait({self._poll_task}, timeout=STOP_WAIT)

    # -- drawing ---------------------------------------------------------------------

    def redraw(self) -> None:
        """Draw every panel from the model (after each poll, and on keys)."""
        if self._stopping_app:  # a poll that ends while the app shuts down draws nothing
            return
        try:
            self._draw(self.model.view())
        except NoMatches:  # the widgets are being torn down
            pass

    def _draw(self, view: dict[str, Any]) -> None:
        status = fmt.header(view)
        if self.filter_text:
            status.append(f"   filter: {self.filter_text!r}", style="bold cyan")
        status.append(f"   sort: {self.sort}", style="dim")
        self.query_one("#status", Static).update(status)
        self._draw_tree(view)
        self._draw_endpoints(view)
        self._draw_procs(view)
        self._draw_problems(view)
        if view["status"] == "ended":
            loop = asyncio.get_running_loop()
            if self._ended_at is None:
                self._ended_at = loop.time()
            elif loop.time() - self._ended_at >= ENDED_LINGER:
                self.exit_message = f"monarch top: {view['message']}"
                self.exit(0)
        else:
            self._ended_at = None

    def _wanted(self, mesh: dict[str, Any]) -> bool:
        f = self.filter_text.lower()
        return not f or f in mesh["name"].lower() or f in mesh["class"].lower()

    def _draw_tree(self, view: dict[str, Any]) -> None:
        tree = self.query_one("#tree", Tree)
        nodes: list[tuple[tuple, Text, dict, int]] = []  # (key, label, data, depth)
        for h in view["hosts"]:
            host_actors: list[str] = []
            nodes.append(
                (("h", h["key"]), fmt.host_label(h), {"kind": "host", "actors": host_actors}, 1)
            )
            for p in h["procs"]:
                proc_actors = [a["actor_id"] for m in p["meshes"] for a in m["actors"]]
                host_actors += proc_actors
                nodes.append(
                    (("p", p["uid"]), fmt.proc_label(p), {"kind": "proc", "actors": proc_actors}, 2)
                )
                for m in p["meshes"]:
                    if not self._wanted(m):
                        continue
                    ids = [a["actor_id"] for a in m["actors"]]
                    nodes.append(
                        (
                            ("m", p["uid"], m["uid"]),
                            fmt.mesh_label(m),
                            {"kind": "mesh", "actors": ids},
                            3,
                        )
                    )
                    for a in m["actors"]:
                        nodes.append(
                            (
                                ("a", a["actor_id"]),
                                fmt.actor_label(a),
                                {"kind": "actor", "actors": [a["actor_id"]]},
                                4,
                            )
                        )
        for key, _, data, _ in nodes:
            data["key"] = key
        shape = [(key, depth) for key, _, _, depth in nodes]
        if shape == self._shape:  # same structure: relabel in place, the cursor stays put
            for node, (_, label, data, _) in zip(self._tree_nodes, nodes):
                node.set_label(label)
                node.data = data
            return
        selected = (tree.cursor_node.data or {}).get("key") if tree.cursor_node else None
        collapsed = {
            n.data["key"] for n in self._tree_nodes if n.data and n.is_collapsed and n.children
        }
        tree.root.remove_children()
        parents = {0: tree.root}
        self._tree_nodes = []
        for key, label, data, depth in nodes:
            node = parents[depth - 1].add(
                label, data=data, expand=key not in collapsed, allow_expand=depth < 4
            )
            parents[depth] = node
            self._tree_nodes.append(node)
        self._shape = shape
        for node in self._tree_nodes:
            if node.data["key"] == selected:
                tree.move_cursor(node)

    def _selected_actors(self) -> tuple[str, set[str] | None]:
        node = self.query_one("#tree", Tree).cursor_node
        data = (node.data if node else None) or {"kind": "job"}
        if data["kind"] == "job":
            return "whole job", None
        return f"{data['kind']} {data['key'][-1]}", set(data["actors"])

    def _draw_endpoints(self, view: dict[str, Any]) -> None:
        what, ids = self._selected_actors()
        rows = [r for r in view["actor_endpoints"] if ids is None or r["actor_id"] in ids]
        rows = aggregate(rows)
        f = self.filter_text.lower()
        rows = [r for r in rows if not f or f in r["mesh"].lower() or f in r["endpoint"].lower()]
        if self.sort != "name":
            rows.sort(key=lambda r: -(r[self.sort] or 0))
        table = self.query_one("#endpoints", DataTable)
        table.border_title = f"endpoints ({what}), sorted by {self.sort}"
        table.clear()
        for r in rows:
            table.add_row(
                r["mesh"],
                r["endpoint"],
                str(r["actors"]),
                fmt.fmt_rate(r["rate"]),
                str(r["in_flight"]),
                fmt.fmt_seconds(r["p50"]),
                fmt.fmt_seconds(r["p99"]),
                fmt.fmt_seconds(r["p99_all"]),
                Text(str(r["errors"]), style="red" if r["errors"] else ""),
            )

    def _draw_procs(self, view: dict[str, Any]) -> None:
        table = self.query_one("#procs", DataTable)
        table.clear()
        for h in view["hosts"]:
            for p in h["procs"]:
                stall = p.get("loop_stall")
                table.add_row(
                    p["uid"],
                    h["name"],
                    str(p.get("pid") or "-"),
                    fmt.state_text(p["state"]),
                    fmt.fmt_pct(p.get("cpu_pct")),
                    fmt.fmt_bytes(p.get("rss_bytes")),
                    str(p.get("threads") or "-"),
                    fmt.fmt_seconds(stall) if stall else "-",
                )

    def _draw_problems(self, view: dict[str, Any]) -> None:
        table = self.query_one("#problems", DataTable)
        table.clear()
        for f in view["failures"]:
            table.add_row(fmt.state_text("failed"), f["actor_id"], f["summary"])
        for s in view["stalls"]:
            who = s["actor_id"] or f"proc {s['proc']} (loop)"
            detail = (
                f"{s['endpoint']} running {fmt.fmt_seconds(s['seconds'])}"
                if s["endpoint"]
                else f"loop blocked {fmt.fmt_seconds(s['seconds'])}"
            )
            table.add_row(fmt.state_text("stalled"), who, detail)
        for s in view["past_stalls"]:
            table.add_row(fmt.state_text("stall over"), s["actor_id"], fmt.past_stall(s))

    # -- keys ------------------------------------------------------------------------

    async def action_refresh_now(self) -> None:
        if self._poller is not None:
            await self._poller.poll(window=0.5)
            self.redraw()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.redraw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.filter_text
        box.focus()

    def action_help(self) -> None:
        help_ = self.query_one("#help", Static)
        help_.display = not help_.display

    def action_close(self) -> None:
        self.query_one("#help", Static).display = False
        box = self.query_one("#filter", Input)
        if box.display:
            box.display = False
            self.query_one("#tree", Tree).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter_text = event.value.strip()
        event.input.display = False
        self.query_one("#tree", Tree).focus()
        self.redraw()

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if not self._stopping_app:
            self._draw_endpoints(self.model.view())
