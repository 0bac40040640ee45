"""``monarch ps``: the host agents, procs and actor meshes of a namespace.

Hosts and procs come from the registry buckets (``monarch-<ns>-hosts``,
``monarch-<ns>-procs``); whether each is still there comes from listening: a
host is ``up`` if its heartbeat is heard within ``--window`` seconds, a proc
if it answers the request ``monarch ps`` publishes on ``mon.<ns>.ctl.ps``
(its answer also lists the actors it hosts, which make up the actor meshes).
Entries of processes killed outright stay in the buckets, shown as
``silent``; ``--prune`` removes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from nats.aio.client import Client

from monarch.broker.connections.registry import (
    HOSTS,
    PROCS,
    HeartbeatSeen,
    bucket_name,
    list_hosts,
    list_procs,
)
from monarch.broker.vocabulary.subjects import ps_subject
from monarch.cli.main import broker_url


async def snapshot(nc: Client, namespace: str, window: float) -> dict[str, Any]:
    """``{"hosts": [...], "procs": [...], "meshes": [...]}``, each entry with its state."""
    hosts, procs = await list_hosts(nc, namespace), await list_procs(nc, namespace)
    answers: dict[str, dict] = {}

    async def on_answer(msg: Any) -> None:
        try:
            answer = json.loads(msg.data)
            answers[answer["uid"]] = answer
        except (ValueError, KeyError):
            pass

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_answer)
    async with HeartbeatSeen(nc, namespace) as seen:
        await nc.publish(ps_subject(namespace), b"", reply=inbox)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            heard = all(seen.alive(h.uid, window) for h in hosts)
            if heard and all(p["uid"] in answers for p in procs):
                break
            await asyncio.sleep(0.05)
        await sub.unsubscribe()
        host_rows = [
            {**h.__dict__, "state": "up" if seen.alive(h.uid, window) else "silent"} for h in hosts
        ]
    registered = {p["uid"] for p in procs}
    proc_rows = [{**p, "state": "up" if p["uid"] in answers else "silent"} for p in procs]
    proc_rows += [{**a, "state": "up"} for uid, a in answers.items() if uid not in registered]
    for row in proc_rows:
        row.pop("actors", None)
    return {"hosts": host_rows, "procs": proc_rows, "meshes": _meshes(answers.values())}


def _meshes(answers: Any) -> list[dict[str, Any]]:
    meshes: dict[str, dict[str, Any]] = {}
    for answer in answers:
        for a in answer.get("actors", []):
            mesh = meshes.setdefault(
                a["mesh_uid"],
                {"name": a["mesh"], "uid": a["mesh_uid"], "class": a["class"], "sizes": a["sizes"]},
            )
            mesh.setdefault("members", []).append((a["rank"], answer["uid"]))
    for mesh in meshes.values():
        members = sorted(mesh.pop("members"))
        mesh["ranks"], mesh["procs"] = [r for r, _ in members], [u for _, u in members]
    return sorted(meshes.values(), key=lambda m: (m["name"], m["uid"]))


async def prune(nc: Client, namespace: str, snap: dict[str, Any]) -> int:
    """Delete the entries of silent hosts and procs; how many were removed."""
    js, n = nc.jetstream(), 0
    for what, rows in ((HOSTS, snap["hosts"]), (PROCS, snap["procs"])):
        silent = [r["uid"] for r in rows if r["state"] == "silent"]
        if silent:
            kv = await js.key_value(bucket_name(namespace, what))
            for uid in silent:
                await kv.delete(uid)
                n += 1
    return n


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    cells = [[title for title, _ in cols]]
    cells += [[_cell(r.get(key)) for _, key in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items()) or "-"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    return str(v)


def render(snap: dict[str, Any]) -> str:
    now = time.time()
    for h in snap["hosts"]:
        h["up_for"] = f"{max(0, now - h['started_at']):.0f}s"
    parts = [
        "HOSTS",
        _table(
            snap["hosts"],
            [
                ("UID", "uid"),
                ("NAME", "name"),
                ("ADDRESS", "address"),
                ("LABELS", "labels"),
                ("CAPACITY", "capacity"),
                ("PID", "pid"),
                ("UP FOR", "up_for"),
                ("STATE", "state"),
            ],
        ),  # fmt: skip
        "",
        "PROCS",
        _table(
            snap["procs"],
            [
                ("UID", "uid"),
                ("HOST", "host_uid"),
                ("HOSTNAME", "hostname"),
                ("PID", "pid"),
                ("RANK", "rank"),
                ("OWNER", "owner"),
                ("STATE", "state"),
            ],
        ),  # fmt: skip
        "",
        "ACTOR MESHES",
        _table(
            snap["meshes"],
            [
                ("NAME", "name"),
                ("UID", "uid"),
                ("CLASS", "class"),
                ("SIZES", "sizes"),
                ("RANKS", "ranks"),
                ("PROCS", "procs"),
            ],
        ),  # fmt: skip
    ]
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.hosts.connect import connect
    from monarch.settings import settings

    url, ns = broker_url(args), settings().namespace

    async def go() -> dict[str, Any]:
        nc = await connect(url, "monarch-ps", timeout=args.connect_timeout)
        try:
            snap = await snapshot(nc, ns, args.window)
            if args.prune:
                snap["pruned"] = await prune(nc, ns, snap)
            return snap
        finally:
            await nc.close()

    snap = asyncio.run(go())
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        print(render(snap))
        if args.prune:
            print(f"\npruned {snap['pruned']} silent entr{'y' if snap['pruned'] == 1 else 'ies'}")
    return 0
