"""``monarch query "SELECT ..."``: SQL over a namespace's telemetry.

Reads the ``monarch-<ns>-telemetry`` stream from its start with an ordered
consumer (bounded by ``--timeout``), loads its records into an in-memory
SQLite database (tables ``spans`` and ``metrics``: ``--tables`` prints them)
and runs the query. Exit codes: 0 done, 1 no telemetry stream (the job ran
with telemetry off) or no broker, 2 bad SQL (SQLite's message).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sqlite3
import sys
from typing import Any

from monarch.cli.main import broker_url
from monarch.telemetry import sql
from monarch.telemetry.stream import NoTelemetryError, read_records, telemetry_stream


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e9 else f"{value:.6f}"
    return str(value)


def render_table(columns: list[str], rows: list[tuple]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.tables:
        print(sql.schema())
        return 0
    if not args.sql:
        print('monarch query: give a query, e.g. "SELECT * FROM spans LIMIT 10"', file=sys.stderr)
        return 2
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.hosts.connect import connect
    from monarch.settings import settings

    url, ns = broker_url(args), settings().namespace

    async def go() -> list[dict[str, Any]]:
        nc = await connect(url, "monarch-query", timeout=args.connect_timeout)
        try:
            return await read_records(nc, ns, args.timeout)
        finally:
            await nc.close()

    try:
        records = asyncio.run(go())
    except NoTelemetryError:
        print(
            f"monarch query: namespace {ns!r} has no telemetry (no stream "
            f"{telemetry_stream(ns)}): run the job with MONARCH_TELEMETRY=1",
            file=sys.stderr,
        )
        return 1
    except ConnectionError as e:
        print(f"monarch query: {e}", file=sys.stderr)
        return 1
    db = sql.load(records)
    try:
        columns, rows = sql.query(db, args.sql)
    except (sqlite3.Error, sqlite3.Warning) as e:
        print(f"monarch query: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dict(zip(columns, row)) for row in rows], indent=2))
    elif args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        print(render_table(columns, rows))
    return 0
