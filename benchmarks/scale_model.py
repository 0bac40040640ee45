"""The paper model of docs/scale.md: what the brokers carry at a given size, and its check.

    python benchmarks/scale_model.py                   # 1,024 hosts x 8 procs, settings as shipped
    python benchmarks/scale_model.py --hosts 64 --per-host 8 --interval 2
    python benchmarks/scale_model.py --check benchmarks/results/scale.json

The model counts what a nats-server counts (``/varz``: messages and bytes in
and out, subscriptions, client connections) for one job on one cluster, from
the subjects of docs/design.md and these per-item constants. Each constant was
read off the code and then confirmed by ``bench_scale.py``'s measured runs
(``--check`` prints model and measurement side by side at every measured
point, the single-server variant: a cluster's counters also count route hops
and JetStream's own replication, which the model gives separately):

* an actor subscribes to 2^d subjects (d: its mesh's dimensions);
* a proc holds 2 connections (main, heartbeats; 3 with telemetry on) and 14
  subscriptions besides its actors' (its port wildcard, control subjects, the
  heartbeat of its owner on both connections, ...), 2 of them on the client's
  side (the client watches each proc's heartbeat on both its connections);
* the client holds 2 connections, and the broker ~73 subscriptions of its own
  and of the job's streams;
* a call is ~77 bytes as the server counts it (headers and body; the subject
  and reply are the HMSG line's, not counted), a reply ~74 bytes, a heartbeat ~45;
* every process publishes a heartbeat every ``MONARCH_HEARTBEAT_INTERVAL``
  (0.5 s); each proc's beat is heard by the client twice (its heartbeat thread
  and its main connection's announcements), the client's by every proc twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

CALL_BYTES = 77
REPLY_BYTES = 74
BEAT_BYTES = 45
SUBS_PER_PROC = 14
SUBS_BASE = 73
SUBS_PER_AGENT = 10  # a host agent: its control subject, heartbeats, the hosts KV (read off the code)
CONNS_PER_PROC = 2
CONNS_PER_AGENT = 2
CONNS_CLIENT = 2


@dataclass
class Job:
    hosts: int
    per_host: int  # procs per host
    actors: int  # actors in the broadcast
    dims: int  # dimensions of each actor mesh
    meshes: int  # actor meshes the broadcast goes to (one call each)
    interval: float = 0.5  # MONARCH_HEARTBEAT_INTERVAL
    agents: bool = True  # one host agent per host (a multi-host job has them)
    telemetry: bool = False

    @property
    def procs(self) -> int:
        return self.hosts * self.per_host

    def connections(self) -> int:
        per_proc = CONNS_PER_PROC + self.telemetry
        agents = self.hosts * CONNS_PER_AGENT if self.agents else 0
        return self.procs * per_proc + agents + CONNS_CLIENT + self.telemetry

    def subscriptions(self) -> int:
        agents = self.hosts * SUBS_PER_AGENT if self.agents else 0
        return self.actors * 2**self.dims + self.procs * SUBS_PER_PROC + agents + SUBS_BASE

    def broadcast(self) -> dict[str, float]:
        """One broadcast-and-gather: a call per mesh, fanned out, and every actor's reply."""
        return {
            "in_msgs": self.meshes + self.actors,
            "out_msgs": 2 * self.actors,
            "in_bytes": self.meshes * CALL_BYTES + self.actors * REPLY_BYTES,
            "out_bytes": self.actors * (CALL_BYTES + REPLY_BYTES),
        }

    def heartbeats(self) -> dict[str, float]:
        """One second of idling: every process beats; the watchers hear them."""
        rate = 1.0 / self.interval
        agents = self.hosts if self.agents else 0
        senders = self.procs + agents + 1
        # the client hears each proc and agent twice; each proc hears the client twice
        heard = 2 * (self.procs + agents) + 2 * self.procs
        return {
            "in_msgs": senders * rate,
            "out_msgs": heard * rate,
            "in_bytes": senders * rate * BEAT_BYTES,
            "out_bytes": heard * rate * BEAT_BYTES,
            "stream_appends": senders * rate,  # monarch-<ns>-hb keeps the latest per subject
        }


def scenario(hosts: int, per_host: int, interval: float, telemetry: bool) -> dict[str, Job]:
    n = hosts * per_host
    return {
        # Monarch's layout: one actor per proc, one mesh over all procs (hosts x gpus)
        "one mesh, one actor per proc": Job(hosts, per_host, n, 2, 1, interval, True, telemetry),
        # 8,192 actors over these procs as Monarch must place them: N/P meshes of P
        f"{8 * n} actors as 8 meshes of {n}": Job(
            hosts, per_host, 8 * n, 2, 8, interval, True, telemetry
        ),
    }


def show(hosts: int, per_host: int, interval: float, telemetry: bool) -> None:
    print(f"{hosts} hosts x {per_host} procs = {hosts * per_host} procs, heartbeat every "
          f"{interval} s, telemetry {'on' if telemetry else 'off'}")  # fmt: skip
    for name, job in scenario(hosts, per_host, interval, telemetry).items():
        b, h = job.broadcast(), job.heartbeats()
        print(f"\n{name} ({job.actors} actors, {job.meshes} mesh(es) of {job.dims} dims)")
        print(f"  connections {job.connections():,}, subscriptions {job.subscriptions():,}")
        print(f"  one broadcast-and-gather: {b['in_msgs']:,.0f} in, {b['out_msgs']:,.0f} out, "
              f"{(b['in_bytes'] + b['out_bytes']) / 1e6:.2f} MB through the servers; the client "
              f"takes {job.actors:,} replies")  # fmt: skip
        print(f"  heartbeats: {h['in_msgs']:,.0f}/s in (and appended to the stream), "
              f"{h['out_msgs']:,.0f}/s delivered, {(h['in_bytes'] + h['out_bytes']) / 1e6:.1f} "
              "MB/s")  # fmt: skip


def check(path: Path) -> None:
    """Model and measurement at each point bench_scale.py measured (single server)."""
    rows = [r for r in json.loads(path.read_text()) if r.get("variant") == "ours"]
    got: dict[tuple[int, int], dict[str, float]] = {}
    for r in rows:
        got.setdefault((r["procs"], r["actors"]), {})[r["figure"]] = r["value"]
    print("| procs | actors | figure | model | measured | measured/model |")
    print("|---|---|---|---|---|---|")
    for (p, n), fig in sorted(got.items()):
        if "subscriptions" not in fig:
            continue
        # on one machine: no host agents; the procs' meshes are 1-dimensional, N/P of them
        job = Job(1, p, n, 1, n // p, 0.5, agents=False)
        t = fig["round_seconds"]
        b, h = job.broadcast(), job.heartbeats()
        pairs = {
            "subscriptions": (job.subscriptions(), fig["subscriptions"]),
            "connections": (job.connections(), fig["connections"]),
            # the measured round also holds the heartbeats of its seconds
            "round in msgs": (b["in_msgs"] + h["in_msgs"] * t, fig["round_in_msgs"]),
            "round out msgs": (b["out_msgs"] + h["out_msgs"] * t, fig["round_out_msgs"]),
            "round in bytes": (b["in_bytes"] + h["in_bytes"] * t, fig["round_in_bytes"]),
            "round out bytes": (b["out_bytes"] + h["out_bytes"] * t, fig["round_out_bytes"]),
            "idle in msgs/s": (h["in_msgs"], fig["idle_per_s_in_msgs"]),
            "idle out msgs/s": (h["out_msgs"], fig["idle_per_s_out_msgs"]),
        }
        for name, (model, measured) in pairs.items():
            ratio = measured / model if model else float("nan")
            print(f"| {p} | {n} | {name} | {model:,.0f} | {measured:,.0f} | {ratio:.3f} |")
    ratios = []
    for (p, n), fig in got.items():
        if "subscriptions" in fig:
            job = Job(1, p, n, 1, n // p, 0.5, agents=False)
            ratios.append(fig["round_out_msgs"] / (job.broadcast()["out_msgs"]))
    if ratios:
        print(f"\nround out msgs, measured/model without heartbeats: median "
              f"{statistics.median(ratios):.4f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--per-host", type=int, default=8, help="procs per host")
    ap.add_argument("--interval", type=float, default=0.5, help="MONARCH_HEARTBEAT_INTERVAL")
    ap.add_argument("--telemetry", action="store_true", help="MONARCH_TELEMETRY=1")
    ap.add_argument("--check", metavar="JSON", help="model vs bench_scale.py's measured run")
    args = ap.parse_args()
    if args.check:
        check(Path(args.check))
    else:
        show(args.hosts, args.per_host, args.interval, args.telemetry)


if __name__ == "__main__":
    main()
