"""From counters that only grow to rates and latencies: one proc's and one endpoint's.

A proc's stats answers carry running totals (calls, errors, a latency
histogram per endpoint; CPU seconds per process). The difference between two
answers of the same proc, over the time between them on that proc's clock,
is the last interval: calls/s, errors/s, the histogram of the calls that
finished meanwhile, CPU %. A counter that went down belongs to a new actor
under the same id: its rates start again. :func:`aggregate` sums actors into
one row per mesh endpoint (or any other key).
"""

from __future__ import annotations

import collections
from typing import Any

from monarch.actors.calls.activity import BUCKETS, percentile


def summary(actor_id: str, reason: str | None) -> str:
    """A failure's reason in one line: its first, without the actor's id said again."""
    text = str(reason or "failed").strip()
    first = text.splitlines()[0] if text else "failed"
    prefix = f"{actor_id} failed: "
    return first[len(prefix) :] if first.startswith(prefix) else first


class EndpointCounters:
    """One endpoint of one actor: its last counters and this interval's differences."""

    __slots__ = ("calls", "errors", "hist", "t", "rate", "error_rate", "d_hist", "in_flight")

    def __init__(self) -> None:
        self.calls = self.errors = self.in_flight = 0
        self.hist = [0] * BUCKETS
        self.t: float | None = None
        self.rate: float | None = None
        self.error_rate: float | None = None
        self.d_hist = [0] * BUCKETS

    def update(self, doc: dict[str, Any], t: float) -> None:
        calls, errors = int(doc.get("calls", 0)), int(doc.get("errors", 0))
        hist = list(doc.get("hist") or [0] * BUCKETS)
        if self.t is not None and t > self.t and calls >= self.calls:
            dt = t - self.t
            self.rate = (calls - self.calls) / dt
            self.error_rate = max(0, errors - self.errors) / dt
            self.d_hist = [max(0, a - b) for a, b in zip(hist, self.hist)]
        elif self.t is not None and calls < self.calls:  # counters restarted: a new actor
            self.rate = self.error_rate = None
            self.d_hist = [0] * BUCKETS
        self.calls, self.errors, self.hist, self.t = calls, errors, hist, t
        self.in_flight = int(doc.get("in_flight", 0))


class ProcRecord:
    """One proc: what it last said, and its CPU/memory over time."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.info: dict[str, Any] = {"uid": uid}
        self.stats: dict[str, Any] | None = None
        self.ps: dict[str, Any] | None = None
        self.answered = False
        self.last_seen = 0.0
        self.cpu_pct: float | None = None
        self._cpu: tuple[float, float] | None = None  # (cpu_seconds, time) of the last answer
        self.history: collections.deque = collections.deque()  # (t, cpu %, rss bytes)
        # (actor id, endpoint) -> counters; rebuilt from each answer, so the
        # endpoints of actors that went away go with them.
        self.endpoints: dict[tuple[str, str], EndpointCounters] = {}

    def took_stats(self, doc: dict[str, Any], now: float) -> None:
        """Take one stats answer: CPU % since the last one, and every endpoint's counters."""
        t = float(doc.get("time") or now)
        endpoints = {}
        for actor in doc.get("actors") or ():
            for name, ep in (actor.get("endpoints") or {}).items():
                key = (actor["actor_id"], name)
                counters = endpoints[key] = self.endpoints.get(key) or EndpointCounters()
                counters.update(ep, t)
        self.endpoints = endpoints
        cpu = doc.get("cpu_seconds")
        if cpu is not None:
            if self._cpu is not None and t > self._cpu[1]:
                self.cpu_pct = max(0.0, 100.0 * (float(cpu) - self._cpu[0]) / (t - self._cpu[1]))
            self._cpu = (float(cpu), t)
        self.stats = doc
        self.history.append((now, self.cpu_pct, doc.get("rss_bytes")))


def aggregate(
    rows: list[dict[str, Any]], key: tuple[str, ...] = ("mesh_uid", "endpoint")
) -> list[dict[str, Any]]:
    """Sum per-actor endpoint rows (``actor_endpoints`` of a view) into one row per ``key``.

    Rates and in-flight counts add up; p50/p99 come from the summed interval
    histograms (``None`` when no call finished in the interval), ``p50_all``
    and ``p99_all`` from the summed cumulative ones.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in key), []).append(row)
    out = []
    for members in groups.values():
        first = members[0]
        d_hist = [sum(col) for col in zip(*(m["d_hist"] for m in members))]
        hist = [sum(col) for col in zip(*(m["hist"] for m in members))]
        rates = [m["rate"] for m in members if m["rate"] is not None]
        out.append(
            {
                "mesh": first["mesh"],
                "mesh_uid": first["mesh_uid"],
                "endpoint": first["endpoint"],
                "actors": len(members),
                "rate": sum(rates) if rates else None,
                "error_rate": sum(m["error_rate"] or 0.0 for m in members) if rates else None,
                "in_flight": sum(m["in_flight"] for m in members),
                "calls": sum(m["calls"] for m in members),
                "errors": sum(m["errors"] for m in members),
                "p50": percentile(d_hist, 0.5) if any(d_hist) else None,
                "p99": percentile(d_hist, 0.99) if any(d_hist) else None,
                "p50_all": percentile(hist, 0.5) if any(hist) else None,
                "p99_all": percentile(hist, 0.99) if any(hist) else None,
            }
        )
    return sorted(out, key=lambda r: (r["mesh"], r["mesh_uid"], r["endpoint"]))
