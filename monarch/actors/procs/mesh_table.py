"""``ProcMesh.to_table()`` and ``ProcMesh.from_host_mesh()``: Monarch 0.7 names on our procs.

``to_table`` draws where each proc of a mesh runs, as Monarch's does: one
cell per proc, ``H.gpu[L]`` for the L-th proc of the H-th host of the host
mesh it was started on; the last dimension makes the columns, the one before
it the rows, and each coordinate of the dimensions before those gets a table
of its own under a ``label=i`` heading. Monarch builds it with torch and
tabulate through its tensor engine; here it is plain text from what the
proc mesh already knows, so it needs neither and starts nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from monarch.actors.meshes.shape import Extent


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A bordered text grid (tabulate's ``grid`` look)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head_rule = "+" + "+".join("=" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [rule, line(header), head_rule]
    for row in rows:
        out += [line(row), rule]
    return "\n".join(out)


def proc_table(extent: Extent, base_ranks: Sequence[int], procs_per_host: int) -> str:
    """The table of a proc mesh view: ``extent`` and the base rank of each of its procs."""
    labels, sizes = extent.labels, extent.sizes
    per_host = max(1, procs_per_host)
    cells = [f"{r // per_host}.gpu[{r % per_host}]" for r in base_ranks]
    if not labels:  # a single proc of no dimensions
        return _grid([""], [[cells[0]]])
    cols = sizes[-1]
    rows_label = labels[-2] if len(labels) > 1 else ""
    rows = sizes[-2] if len(labels) > 1 else 1
    header = [rows_label, *(f"{labels[-1]}={c}" for c in range(cols))]
    tables = []
    outer = [range(s) for s in sizes[:-2]]
    per_table = rows * cols
    for n, coords in enumerate(itertools.product(*outer)):
        block = cells[n * per_table : (n + 1) * per_table]
        body = [
            [str(r) if rows_label else "", *block[r * cols : (r + 1) * cols]] for r in range(rows)
        ]
        heading = ", ".join(f"{lab}={c}" for lab, c in zip(labels[:-2], coords))
        tables.append((heading + "\n" if heading else "") + _grid(header, body))
    return "\n\n".join(tables)


def per_host_of(host_extent: Extent, region: Any) -> dict[str, int]:
    """``from_host_mesh``'s ``region`` as ``spawn_procs``' per-host dimensions.

    ``region`` may be the whole proc mesh's extent (the host mesh's dimensions
    first, as Monarch's region is) or just the per-host part; a dict or an
    ``Extent``.
    """
    if region is None:
        return {}
    if isinstance(region, Extent):
        items = list(zip(region.labels, region.sizes))
    elif isinstance(region, dict):
        items = list(region.items())
    else:
        raise TypeError(f"region must be an Extent or a dict of sizes, got {region!r}")
    host_items = list(zip(host_extent.labels, host_extent.sizes))
    if items[: len(host_items)] == host_items:
        items = items[len(host_items) :]
    elif any(label in host_extent.labels for label, _ in items):
        raise ValueError(
            f"region {dict(items)} repeats dimensions of the host mesh {dict(host_items)} "
            "with other sizes: give the host mesh's dimensions first, unchanged, or only "
            "the per-host ones"
        )
    return dict(items)
