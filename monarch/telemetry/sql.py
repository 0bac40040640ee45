"""Telemetry records as SQL tables, in an in-memory SQLite database (``monarch query``).

SQLite is in the standard library, so querying needs nothing installed. Two
tables (``monarch query --tables`` prints them):

``spans``: one row per span. ``span`` is ``send`` (the caller publishing a
call or a send), ``deliver`` (the message waiting in the actor's mailbox),
``handle`` (the endpoint running), ``reply`` (the caller waiting for and taking
one rank's reply), or a user span; ``trace_id`` links the spans of one call.

``metrics``: one row per metric point and interval (delta: a counter's
``value`` is what was added during the interval, so ``sum(value)`` is the
total); ``labels`` is a JSON object (``json_extract(labels, '$.endpoint')``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

TABLES: dict[str, list[tuple[str, str, str]]] = {
    "spans": [
        ("trace_id", "TEXT", "links the spans of one call (the Mon-Trace header)"),
        ("span", "TEXT", "send, deliver, handle, reply, or a user span's name"),
        ("proc", "TEXT", "uid of the process that recorded it"),
        ("actor_id", "TEXT", "the actor that handled the message (NULL for a send)"),
        ("mesh", "TEXT", "the actor mesh's name"),
        ("rank", "INTEGER", "the actor's rank (NULL: a send to several)"),
        ("endpoint", "TEXT", "the endpoint called"),
        ("start", "REAL", "seconds since the epoch"),
        ("end", "REAL", "seconds since the epoch"),
        ("duration_ms", "REAL", "end - start, in milliseconds"),
        ("ok", "INTEGER", "0 if the endpoint raised"),
        ("caller", "TEXT", "the caller's proc uid (deliver, handle)"),
    ],
    "metrics": [
        ("time", "REAL", "end of the interval, seconds since the epoch"),
        ("proc", "TEXT", "uid of the process that recorded it"),
        ("scope", "TEXT", "the meter's name (get_meter(name)); monarch for built-ins"),
        ("name", "TEXT", "the instrument's name"),
        ("kind", "TEXT", "counter, up_down_counter or histogram"),
        ("unit", "TEXT", "the instrument's unit"),
        ("labels", "TEXT", "the point's attributes, a JSON object"),
        ("value", "REAL", "sum of what was added or recorded during the interval"),
        ("count", "INTEGER", "histograms: how many values were recorded"),
        ("min", "REAL", "histograms: the smallest value"),
        ("max", "REAL", "histograms: the largest value"),
        ("buckets", "TEXT", "histograms: counts per bucket, a JSON array"),
        ("bounds", "TEXT", "histograms: the buckets' upper bounds, a JSON array"),
    ],
    "logs": [
        ("time", "REAL", "when the record was made, seconds since the epoch"),
        ("proc", "TEXT", "uid of the process that logged it"),
        ("actor_id", "TEXT", "the actor whose code logged it (NULL: the process's own code)"),
        ("level", "TEXT", "DEBUG, INFO, WARNING, ERROR or CRITICAL"),
        ("logger", "TEXT", "the logger's name"),
        ("message", "TEXT", "the formatted message"),
        ("pathname", "TEXT", "the source file of the logging call"),
        ("lineno", "INTEGER", "its line"),
    ],
}


def schema() -> str:
    """The tables as ``CREATE TABLE`` statements, each column with what it holds."""
    out = []
    for table, cols in TABLES.items():
        body = ",\n".join(f"  {name} {typ}  -- {doc}" for name, typ, doc in cols)
        out.append(f"CREATE TABLE {table} (\n{body}\n);")
    return "\n".join(out)


def _span_row(rec: dict[str, Any]) -> tuple:
    start, end = rec.get("start"), rec.get("end")
    duration = (end - start) * 1000.0 if start is not None and end is not None else None
    ok = rec.get("ok")
    return (
        rec.get("trace_id"), rec.get("span"), rec.get("proc"), rec.get("actor_id"),
        rec.get("mesh"), rec.get("rank"), rec.get("endpoint"), start, end, duration,
        None if ok is None else int(bool(ok)), rec.get("caller"),
    )  # fmt: skip


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _metric_row(rec: dict[str, Any]) -> tuple:
    return (
        rec.get("time"), rec.get("proc"), rec.get("scope"), rec.get("name"), rec.get("kind"),
        rec.get("unit"), _json(rec.get("labels") or {}), rec.get("value"), rec.get("count"),
        rec.get("min"), rec.get("max"), _json(rec.get("buckets")), _json(rec.get("bounds")),
    )  # fmt: skip


def load(records: Iterable[dict[str, Any]]) -> sqlite3.Connection:
    """An in-memory database holding ``records`` (as :func:`~monarch.telemetry.stream.read_records`
    gives them) in the tables above."""
    db = sqlite3.connect(":memory:")
    for table, cols in TABLES.items():
        db.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t, _ in cols)})")
    spans, metrics, logs = [], [], []
    log_cols = [name for name, _, _ in TABLES["logs"]]
    for rec in records:
        kind = rec.get("type")
        if kind == "span":
            spans.append(_span_row(rec))
        elif kind == "metric":
            metrics.append(_metric_row(rec))
        elif kind == "log":
            logs.append(tuple(rec.get(name) for name in log_cols))
    db.executemany(f"INSERT INTO spans VALUES ({', '.join('?' * len(TABLES['spans']))})", spans)
    db.executemany(
        f"INSERT INTO metrics VALUES ({', '.join('?' * len(TABLES['metrics']))})", metrics
    )
    db.executemany(f"INSERT INTO logs VALUES ({', '.join('?' * len(log_cols))})", logs)
    db.commit()
    return db


def query(db: sqlite3.Connection, sql: str) -> tuple[list[str], list[tuple]]:
    """Run ``sql``; its column names and rows. Raises ``sqlite3.Error`` for bad SQL."""
    cur = db.execute(sql)
    columns = [d[0] for d in cur.description or []]
    return columns, cur.fetchall()
