"""The watch model: what a job is doing, from the answers its procs give each interval.

Every interval the poller (:mod:`.poller`) hands :meth:`WatchModel.ingest` a
:class:`Poll`: the registry's hosts and procs, and each proc's answers on
``mon.<ns>.ctl.ps`` and ``mon.<ns>.ctl.stats`` (the stats document is
described in :mod:`monarch.actors.hosting.stats`). Counters only ever grow, so
everything per interval comes from the difference between two answers of the
same proc, timed by the proc's own clock: calls/s and errors/s from ``calls``
and ``errors``, latency p50/p99 of the calls that finished in the interval
from the difference of the ``hist`` histograms, CPU % from ``cpu_seconds``.
Rates need two answers, so a new endpoint shows no rate for one interval.

The model keeps a bounded history (``history_seconds``, 10 min by default)
per mesh endpoint and per proc, for the dashboard's plots. Views read
:meth:`WatchModel.view` and :meth:`WatchModel.history`, plain JSON-able dicts,
so ``monarch top``, ``top --once`` and the dashboard show the same numbers.

A proc that answered before and not in this poll is ``silent`` (its last
known numbers are kept); once procs had answered and then none has for
``ended_after`` seconds (or the broker went away, as an embedded one does
with its job), the job has ``ended``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from monarch.cli.watch.counters import ProcRecord, aggregate, summary

ACTOR_STATES = ("starting", "serving", "stalled", "failed", "stopped")
"""What an actor can be, as its proc reports it; the views add ``silent`` and ``unknown``."""

MAX_FAILURES = 100  # failures (and ended stalls) kept for the views, newest first
SERIES = ("rate", "p50", "p99", "in_flight", "error_rate")  # kept over time per mesh endpoint
FORGET_SILENT = 60.0  # seconds a silent, deregistered proc stays shown


@dataclass
class Poll:
    """One round of asking: what the registry holds and what each proc answered."""

    time: float
    connected: bool = True
    hosts: list[dict[str, Any]] = field(default_factory=list)  # registry + "state": up|silent
    registered: list[dict[str, Any]] = field(default_factory=list)  # registry proc entries
    ps: dict[str, dict[str, Any]] = field(default_factory=dict)  # proc uid -> ps answer
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)  # proc uid -> stats answer


class WatchModel:
    """What the job is doing now and lately (see the module docstring)."""

    def __init__(
        self,
        namespace: str,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        ended_after: float = 3.0,
    ) -> None:
        self.namespace = namespace
        self.interval = interval
        self.history_seconds = history_seconds
        self.ended_after = ended_after
        self.procs: dict[str, ProcRecord] = {}
        self.hosts: list[dict[str, Any]] = []
        self.series: dict[tuple[str, str], collections.deque] = {}  # (mesh uid, endpoint) -> points
        self.failures: dict[tuple[str, float], dict[str, Any]] = {}
        self.past_stalls: dict[tuple[str, float], dict[str, Any]] = {}  # stalls that ended
        self.connected = False
        self.polls = 0
        self.time = 0.0
        self._last_answer: float | None = None  # when some proc last answered
        self._rows: list[dict[str, Any]] = []

    # -- ingesting -----------------------------------------------------------------

    def ingest(self, poll: Poll) -> None:
        """Take one poll's answers; the views reflect it at once."""
        now = self.time = poll.time
        self.polls += 1
        self.connected = poll.connected
        self.hosts = poll.hosts
        registered = {p["uid"]: p for p in poll.registered if p.get("uid")}
        answering = set(poll.ps) | set(poll.stats)
        for uid in set(registered) | answering:
            proc = self.procs.setdefault(uid, ProcRecord(uid))
            proc.info.update(registered.get(uid, {}))
            proc.answered = uid in answering
            if proc.answered:
                proc.last_seen = now
            if uid in poll.ps:
                proc.ps = poll.ps[uid]
                proc.info.update({k: v for k, v in poll.ps[uid].items() if k != "actors"})
            if uid in poll.stats:
                doc = poll.stats[uid]
                proc.info.update(
                    {k: doc[k] for k in ("pid", "hostname", "host_uid", "rank", "root") if k in doc}
                )
                proc.took_stats(doc, now)
                for f in doc.get("recent_failures") or ():
                    self.failures[(f.get("actor_id", ""), float(f.get("time") or 0))] = {
                        **f,
                        "proc": uid,
                    }
                for st in doc.get("stalls") or ():
                    if st.get("finished_after") is not None:
                        key = (st.get("actor_id", ""), float(st.get("time") or 0))
                        self.past_stalls[key] = {**st, "proc": uid}
        for uid, proc in list(self.procs.items()):
            if uid not in answering:
                proc.answered = False
                if uid not in registered and now - proc.last_seen > FORGET_SILENT:
                    del self.procs[uid]
        if answering:
            self._last_answer = now
        for kept in (self.failures, self.past_stalls):
            for k in sorted(kept, key=lambda k: k[1])[: max(0, len(kept) - MAX_FAILURES)]:
                del kept[k]
        self._rows = self._actor_endpoint_rows()
        self._record(now)

    def _record(self, now: float) -> None:
        horizon = now - self.history_seconds
        for row in aggregate(self._rows):
            points = self.series.setdefault((row["mesh_uid"], row["endpoint"]), collections.deque())
            points.append((now, row["mesh"], *(row[k] for k in SERIES)))
        for key, points in list(self.series.items()):
            while points and points[0][0] < horizon:
                points.popleft()
            if not points:
                del self.series[key]
        for proc in self.procs.values():
            while proc.history and proc.history[0][0] < horizon:
                proc.history.popleft()

    # -- what the views read ---------------------------------------------------------

    @property
    def status(self) -> str:
        """``waiting`` (no proc has answered yet), ``live`` or ``ended``."""
        if self._last_answer is None:
            return "waiting"
        if self.time - self._last_answer >= self.ended_after:
            return "ended"
        return "live"

    def message(self) -> str:
        """One line for a person: where we listen and what we hear."""
        subject = f"mon.{self.namespace}.ctl.stats"
        if self.status == "waiting":
            return f"waiting for a job: no proc answers on {subject}" + (
                "" if self.connected else " (broker unreachable)"
            )
        if self.status == "ended":
            why = "the broker went away" if not self.connected else "no proc answers any more"
            return f"job ended: {why} (namespace {self.namespace})"
        up = sum(1 for p in self.procs.values() if p.answered)
        return f"namespace {self.namespace}: {up} of {len(self.procs)} procs answering"

    def actors(self) -> list[dict[str, Any]]:
        """Every actor of every known proc, with its proc uid and state."""
        out = []
        for proc in self.procs.values():
            if proc.stats is not None:
                listed = proc.stats.get("actors") or []
            else:  # only `ps` answered (a proc without stats): states are unknown
                listed = [{**a, "state": "unknown"} for a in (proc.ps or {}).get("actors") or []]
            for a in listed:
                actor_id = a.get("actor_id") or f"{a['mesh']}-{a['mesh_uid']}[{a['rank']}]"
                state = a.get("state", "unknown")
                if not proc.answered and state not in ("failed", "stopped"):
                    state = "silent"
                out.append(
                    {
                        "actor_id": actor_id,
                        "mesh": a["mesh"],
                        "mesh_uid": a["mesh_uid"],
                        "rank": a.get("rank", 0),
                        "class": a.get("class", ""),
                        "sizes": a.get("sizes", {}),
                        "proc": proc.uid,
                        "state": state,
                        "failure": a.get("failure"),
                        "summary": summary(actor_id, a.get("failure"))
                        if a.get("failure")
                        else None,
                        "in_flight": a.get("in_flight") or [],
                    }
                )
        return sorted(out, key=lambda a: (a["mesh"], a["mesh_uid"], a["rank"], a["actor_id"]))

    def _actor_endpoint_rows(self) -> list[dict[str, Any]]:
        rows = []
        for a in self.actors():
            proc = self.procs[a["proc"]]
            eps = (proc.stats or {}).get("actors") or []
            names = next(
                (x.get("endpoints") or {} for x in eps if x.get("actor_id") == a["actor_id"]), {}
            )
            for name in names:
                ep = proc.endpoints.get((a["actor_id"], name))
                if ep is None:
                    continue
                rows.append(
                    {
                        "actor_id": a["actor_id"],
                        "mesh": a["mesh"],
                        "mesh_uid": a["mesh_uid"],
                        "rank": a["rank"],
                        "proc": a["proc"],
                        "endpoint": name,
                        "rate": ep.rate if proc.answered else None,
                        "error_rate": ep.error_rate,
                        "in_flight": ep.in_flight,
                        "calls": ep.calls,
                        "errors": ep.errors,
                        "d_hist": ep.d_hist,
                        "hist": ep.hist,
                    }
                )
        return rows

    def proc_view(self, proc: ProcRecord) -> dict[str, Any]:
        s = proc.stats or {}
        stall, threshold = s.get("loop_stall"), s.get("stall_threshold")
        stalled = stall is not None and threshold is not None and stall > threshold
        state = ("stalled" if stalled else "up") if proc.answered else "silent"
        return {
            **{k: proc.info.get(k) for k in ("uid", "pid", "hostname", "host_uid", "rank", "root")},
            "state": state,
            "cpu_pct": proc.cpu_pct,
            "rss_bytes": s.get("rss_bytes"),
            "threads": s.get("threads"),
            "loop_stall": stall,
            "stall_threshold": threshold,
        }

    def view(self) -> dict[str, Any]:
        """The whole picture now: status, the host tree, meshes, endpoints, failures, stalls."""
        actors = self.actors()
        by_proc: dict[str, list[dict[str, Any]]] = {}
        for a in actors:
            by_proc.setdefault(a["proc"], []).append(a)
        agents = {h["uid"]: h for h in self.hosts}
        hosts: dict[str, dict[str, Any]] = {}
        for h in self.hosts:
            hosts[h["uid"]] = {
                "key": h["uid"],
                "name": h.get("name", h["uid"]),
                "kind": "agent",
                "state": h.get("state", "up"),
                "procs": [],
            }
        for proc in sorted(self.procs.values(), key=lambda p: (p.info.get("rank") or 0, p.uid)):
            pv = self.proc_view(proc)
            host_uid = pv.get("host_uid")
            key = host_uid if host_uid in agents else f"machine:{pv.get('hostname') or '?'}"
            host = hosts.setdefault(
                key,
                {
                    "key": key,
                    "name": pv.get("hostname") or "?",
                    "kind": "machine",
                    "state": "up",
                    "procs": [],
                },
            )
            meshes: dict[str, dict[str, Any]] = {}
            for a in by_proc.get(proc.uid, []):
                meshes.setdefault(
                    a["mesh_uid"],
                    {"uid": a["mesh_uid"], "name": a["mesh"], "class": a["class"], "actors": []},
                )["actors"].append(a)
            host["procs"].append({**pv, "meshes": list(meshes.values())})
        for host in hosts.values():
            if host["kind"] == "machine":
                host["state"] = (
                    "up" if any(p["state"] != "silent" for p in host["procs"]) else "silent"
                )
        meshes_all: dict[str, dict[str, Any]] = {}
        for a in actors:
            m = meshes_all.setdefault(
                a["mesh_uid"],
                {
                    "uid": a["mesh_uid"],
                    "name": a["mesh"],
                    "class": a["class"],
                    "sizes": a["sizes"],
                    "states": {},
                    "actors": 0,
                },
            )
            m["states"][a["state"]] = m["states"].get(a["state"], 0) + 1
            m["actors"] += 1
        endpoints = aggregate(self._rows)
        rates = [r["rate"] for r in endpoints if r["rate"] is not None]
        return {
            "namespace": self.namespace,
            "time": self.time,
            "interval": self.interval,
            "status": self.status,
            "message": self.message(),
            "connected": self.connected,
            "totals": {
                "hosts": len(hosts),
                "procs": len(self.procs),
                "actors": len(actors),
                "rate": sum(rates) if rates else None,
                "failed": sum(1 for a in actors if a["state"] == "failed"),
                "stalled": sum(1 for a in actors if a["state"] == "stalled"),
                "silent": sum(1 for p in self.procs.values() if not p.answered),
            },
            "hosts": list(hosts.values()),
            "meshes": sorted(meshes_all.values(), key=lambda m: (m["name"], m["uid"])),
            "endpoints": endpoints,
            "actor_endpoints": self._rows,
            "failures": self._failures(actors),
            "stalls": self._stalls(actors),
            "past_stalls": sorted(
                self.past_stalls.values(), key=lambda x: -float(x.get("time") or 0)
            ),
        }

    def _failures(self, actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen = {f.get("actor_id") for f in self.failures.values()}
        out = sorted(self.failures.values(), key=lambda f: -float(f.get("time") or 0))
        out = [{**f, "summary": summary(f.get("actor_id", ""), f.get("reason"))} for f in out]
        for a in actors:  # a failed actor whose proc's recent list no longer has it
            if a["state"] == "failed" and a["actor_id"] not in seen:
                out.append(
                    {
                        "actor_id": a["actor_id"],
                        "reason": a["failure"] or "failed",
                        "summary": a["summary"] or "failed",
                        "time": None,
                        "proc": a["proc"],
                    }
                )
        return out

    def _stalls(self, actors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for a in actors:
            for call in a["in_flight"]:
                if call.get("stalled"):
                    out.append(
                        {
                            "what": "call",
                            "actor_id": a["actor_id"],
                            "mesh": a["mesh"],
                            "proc": a["proc"],
                            "endpoint": call.get("endpoint"),
                            "seconds": call.get("seconds"),
                            "caller": call.get("caller"),
                        }
                    )
        for proc in self.procs.values():
            pv = self.proc_view(proc)
            if pv["state"] == "stalled":
                out.append(
                    {
                        "what": "loop",
                        "actor_id": None,
                        "mesh": None,
                        "proc": proc.uid,
                        "endpoint": None,
                        "seconds": pv["loop_stall"],
                        "caller": None,
                    }
                )
        return sorted(out, key=lambda s: -(s["seconds"] or 0))

    def history(self) -> dict[str, Any]:
        """Per mesh endpoint and per proc, the points of the last ``history_seconds``."""
        series = []
        for (mesh_uid, endpoint), points in sorted(
            self.series.items(), key=lambda kv: (kv[1][-1][1], kv[0])
        ):
            t, mesh, *values = zip(*points)
            columns = {k: list(v) for k, v in zip(SERIES, values)}
            series.append(
                {
                    "mesh": mesh[-1],
                    "mesh_uid": mesh_uid,
                    "endpoint": endpoint,
                    "t": list(t),
                    **columns,
                }
            )
        procs = []
        for proc in self.procs.values():
            if proc.history:
                t, cpu, rss = zip(*proc.history)
                procs.append(
                    {"uid": proc.uid, "t": list(t), "cpu_pct": list(cpu), "rss_bytes": list(rss)}
                )
        return {
            "now": self.time,
            "seconds": self.history_seconds,
            "endpoints": series,
            "procs": procs,
        }


def model_for(args: Any, command: str) -> tuple[WatchModel, Any] | int:
    """What ``monarch top`` and ``monarch dashboard`` both start from: the model of the
    job their arguments name, and a coroutine function that connects to its broker.
    An exit code instead when the arguments are wrong (said on stderr)."""
    import sys

    from monarch.cli.main import broker_url
    from monarch.hosts.connect import connect

    # Imported when a watching command runs, so that `monarch --help` stays fast.
    from monarch.settings import settings

    url, ns = broker_url(args), settings().namespace
    if args.interval <= 0:
        print(f"monarch {command}: --interval must be more than 0 seconds", file=sys.stderr)
        return 2
    model = WatchModel(ns, interval=args.interval, history_seconds=args.history)

    async def connect_nats() -> Any:
        return await connect(url, f"monarch-{command}", timeout=args.connect_timeout)

    return model, connect_nats
