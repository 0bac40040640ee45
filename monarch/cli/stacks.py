"""``monarch stacks [MESH[RANK]]``: the Python stack of every thread of the job's procs.

Which procs: those hosting actor mesh ``MESH`` (``MESH[RANK]``: the one
hosting that rank), those named with ``--proc UID``, or all of them. They are
found by asking ``mon.<ns>.ctl.stats``, which every process with actors
answers from its side channel (so a proc whose event loop is blocked is
found too), plus the procs' registry (``monarch ps``), for those that do not
answer. Each proc is then asked ``mon.<ns>.ctl.stacks.<uid>``, also answered
from the side channel (:mod:`monarch.actors.hosting.stacks`), and its
threads are printed as ``py-spy dump`` does, innermost frame first, each
marked with the actor calls it runs.

A proc whose interpreter is held (a long C call that keeps the GIL, or a
stopped process) answers nothing: then ``py-spy dump --pid`` reads it from
outside, automatically when the proc is on this host and py-spy is installed
(``--py-spy`` uses it for every local proc). py-spy is looked for in
``PYSPY_BIN`` (Monarch's setting), on ``PATH``, and beside this Python.

Exit status: 0 when every proc was shown; 1 when one did not answer or has
died; 2 for bad input (an unknown mesh, a rank out of range, an unknown proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from monarch.broker.connections.registry import list_procs
from monarch.broker.vocabulary.subjects import stacks_subject, stats_subject
from monarch.cli.main import broker_url

_TARGET = re.compile(r"^([A-Za-z0-9_-]+)(?:\[(\d+)\])?$")
PY_SPY_TIMEOUT = 60  # seconds py-spy may take to read a process


class BadInput(Exception):
    """What the user asked for does not exist: exit status 2."""


def py_spy() -> str | None:
    """The py-spy binary: ``PYSPY_BIN``, on ``PATH``, or beside this Python (a venv's bin)."""
    for candidate in (
        os.environ.get("PYSPY_BIN"),
        shutil.which("py-spy"),
        os.path.join(os.path.dirname(sys.executable), "py-spy"),
    ):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_target(target: str | None) -> tuple[str | None, int | None]:
    if target is None:
        return None, None
    m = _TARGET.fullmatch(target)
    if m is None:
        raise BadInput(f"{target!r} is not MESH or MESH[RANK] (e.g. trainers or trainers[3])")
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


async def discover(nc: Client, namespace: str, window: float) -> tuple[list[dict], list[dict]]:
    """(stats answers of the processes that answered, registered procs that did not)."""
    registered = await list_procs(nc, namespace)
    answers: dict[str, dict] = {}

    async def on_answer(msg: Any) -> None:
        try:
            answer = json.loads(msg.data)
            answers[answer["uid"]] = answer
        except (ValueError, KeyError, TypeError):
            pass

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_answer)
    try:
        await nc.publish(stats_subject(namespace), b"", reply=inbox)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            if registered and all(p["uid"] in answers for p in registered):
                break
            await asyncio.sleep(0.05)
    finally:
        await sub.unsubscribe()
    silent = [p for p in registered if p["uid"] not in answers]
    return list(answers.values()), silent


def select(
    answers: list[dict], silent: list[dict], mesh: str | None, rank: int | None, uids: list[str]
) -> tuple[list[dict], list[str]]:
    """(the procs to show, notes for the user); raises BadInput for what does not exist."""
    notes: list[str] = []
    if uids:
        known = {p["uid"]: p for p in [*answers, *silent]}
        missing = [u for u in uids if u not in known]
        if missing:
            raise BadInput(f"no proc {', '.join(missing)} (`monarch ps` lists the procs)")
        return [known[u] for u in uids], notes
    if mesh is None:
        chosen = list(answers)
        for p in silent:
            if _local(p) and not _alive(p["pid"]):
                notes.append(f"proc {p['uid']} (pid {p['pid']}) is gone; its registry entry "
                             "stays until `monarch ps --prune`")  # fmt: skip
            else:
                chosen.append(p)
        return chosen, notes
    hosting = [
        (p, a) for p in answers for a in p.get("actors", [])
        if a["mesh"] == mesh and a.get("state") != "stopped"
    ]  # fmt: skip
    if not hosting:
        meshes = sorted({a["mesh"] for p in answers for a in p.get("actors", [])})
        hint = f" (meshes: {', '.join(meshes)})" if meshes else ""
        if silent:
            hint += f"; {len(silent)} proc(s) did not answer, it may be there (try --proc UID)"
        raise BadInput(f"no actor mesh named {mesh!r}{hint}")
    if rank is not None:
        size = _size(hosting[0][1].get("sizes") or {})
        if not 0 <= rank < size:
            raise BadInput(f"mesh {mesh!r} has ranks 0..{size - 1}: there is no rank {rank}")
        hosting = [(p, a) for p, a in hosting if a["rank"] == rank]
        if not hosting:
            raise BadInput(
                f"no proc answered for {mesh}[{rank}]"
                + (f"; {len(silent)} proc(s) did not answer (try --proc UID)" if silent else "")
            )
    seen: dict[str, dict] = {}
    for p, _ in sorted(hosting, key=lambda pa: pa[1]["rank"]):
        seen.setdefault(p["uid"], p)
    return list(seen.values()), notes


def _size(sizes: dict[str, int]) -> int:
    n = 1
    for s in sizes.values():
        n *= int(s)
    return n


def _local(proc: dict) -> bool:
    return proc.get("hostname") == socket.gethostname()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


async def ask_stacks(nc: Client, namespace: str, uid: str, timeout: float) -> dict | str:
    """The proc's answer, or ``"silent"`` (no answer in time) or ``"absent"`` (nobody listens)."""
    try:
        msg = await nc.request(stacks_subject(namespace, uid), b"", timeout=timeout)
    except NoRespondersError:
        return "absent"
    except (NatsTimeout, asyncio.TimeoutError):
        return "silent"
    return json.loads(msg.data)


def render(doc: dict) -> str:
    """One proc's answer, as ``py-spy dump`` prints a process: innermost frame first."""
    lines = [
        f"Process {doc['pid']}: proc {doc['uid']} on {doc['hostname']} (rank {doc.get('rank')})"
    ]
    actors = ", ".join(f"{a['mesh']}[{a['rank']}] {a['class']} ({a['state']})"
                       for a in doc.get("actors", []))  # fmt: skip
    lines.append(f"Actors: {actors or '-'}")
    if doc.get("loop_stall", 0) > 0:
        lines.append(f"Event loop: has not turned for {doc['loop_stall']:.1f} s")
    for t in doc["threads"]:
        marks = [t["role"]] if t["role"] else []
        for c in t["calls"]:
            stalled = ", STALLED" if c["stalled"] else ""
            marks.append(f"{c['mesh']}[{c['rank']}].{c['endpoint']} for {c['seconds']:.1f} s"
                         f"{stalled}")  # fmt: skip
        mark = f"  [{'; '.join(marks)}]" if marks else ""
        lines.append("")
        lines.append(f'Thread {t["ident"]:#x} (native {t["native_id"]}): "{t["name"]}"{mark}')
        for frame in reversed(t["stack"]):
            lines.append(f"    {frame['function']} ({frame['file']}:{frame['line']})")
            if frame["code"]:
                lines.append(f"        {frame['code']}")
    return "\n".join(lines)


def dump_with_py_spy(binary: str, pid: int) -> tuple[bool, str]:
    """``py-spy dump --pid``: (it worked, its output or why not)."""
    try:
        done = subprocess.run(
            [binary, "dump", "--pid", str(pid)],
            capture_output=True, text=True, timeout=PY_SPY_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"py-spy did not finish reading pid {pid} in {PY_SPY_TIMEOUT} s"
    if done.returncode != 0:
        return False, f"py-spy could not read pid {pid}: {done.stderr.strip() or done.stdout}"
    return True, done.stdout.rstrip()


async def show(nc: Client, namespace: str, proc: dict, args: argparse.Namespace) -> int:
    """Print one proc's threads; its exit status (0 shown, 1 not)."""
    uid, pid, local = proc["uid"], proc.get("pid"), _local(proc)
    binary = py_spy()
    header = f"=== proc {uid} (pid {pid} on {proc.get('hostname')}) ==="
    if args.py_spy and local and binary and pid:
        ok, text = dump_with_py_spy(binary, pid)
        if ok:
            print(f"{header} (read by py-spy)\n{text}\n")
            return 0
        if not _alive(pid):
            return _died(uid, pid)
        print(f"{text}; asking the proc instead", file=sys.stderr)
    elif args.py_spy:
        why = (f"it is on host {proc.get('hostname')}: run `py-spy dump --pid {pid}` there"
               if not local else "py-spy is not installed here (set PYSPY_BIN)")  # fmt: skip
        print(f"proc {uid}: {why}; asking the proc instead", file=sys.stderr)
    answer = await ask_stacks(nc, namespace, uid, args.timeout)
    if isinstance(answer, dict):
        print(f"{header}\n{render(answer)}\n")
        return 0
    if local and not _alive(pid):
        return _died(uid, pid)
    if answer == "absent":
        where = "" if local else f" (on {proc.get('hostname')}: it may have died)"
        print(f"proc {uid} is not listening{where}: it has no connection to the broker now",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"proc {uid} did not answer in {args.timeout:g} s: its interpreter is held (a long C "
          "call that keeps the GIL, or the process is stopped); try --py-spy on its host",
          file=sys.stderr)  # fmt: skip
    if local and binary and pid:
        ok, text = dump_with_py_spy(binary, pid)
        print(f"{header} (read by py-spy)\n{text}\n")
        return 0 if ok else 1
    return 1


def _died(uid: str, pid: int | None) -> int:
    print(f"proc {uid} (pid {pid}) has died: it exited or was killed", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.hosts.connect import connect
    from monarch.settings import settings

    try:
        mesh, rank = parse_target(args.target)
    except BadInput as e:
        print(f"monarch stacks: {e}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("monarch stacks: --timeout must be more than 0 seconds", file=sys.stderr)
        return 2
    url, ns = broker_url(args), settings().namespace

    async def go() -> int:
        nc = await connect(url, "monarch-stacks", timeout=args.connect_timeout)
        try:
            answers, silent = await discover(nc, ns, args.window)
            known = {p["uid"] for p in [*answers, *silent]}
            if any(u not in known for u in args.proc or ()):
                # The registry is read through a JetStream consumer, which a loaded broker
                # may answer short: read it once more before calling a named proc unknown.
                silent += [p for p in await list_procs(nc, ns) if p.get("uid") not in known]
            try:
                procs, notes = select(answers, silent, mesh, rank, args.proc)
            except BadInput as e:
                print(f"monarch stacks: {e}", file=sys.stderr)
                return 2
            for note in notes:
                print(note, file=sys.stderr)
            if not procs:
                print("monarch stacks: no procs answered (is a job running on this broker "
                      f"and namespace {ns!r}?)", file=sys.stderr)  # fmt: skip
                return 1
            status = 0
            for proc in procs:
                status = max(status, await show(nc, ns, proc, args))
            return status
        finally:
            await nc.close()

    try:
        return asyncio.run(go())
    except ConnectionError as e:
        print(f"monarch stacks: {e}", file=sys.stderr)
        return 1
