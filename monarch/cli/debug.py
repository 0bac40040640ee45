"""``monarch debug``: list the actors paused at a ``breakpoint()``, and drive their pdb.

Interactive (the default): a ``monarch_dbg>`` prompt with Monarch's commands
(:mod:`monarch.cli.debug_commands`); ``attach RANK`` switches to that
session's ``(Pdb)`` prompt until ``detach`` or a pdb ``continue`` ends it.
For scripts: ``monarch debug --list`` prints the sessions, ``monarch debug
--cast 'ranks(all)' c`` sends one command and prints each rank's output.

Nothing waits unbounded: a session answers within ``--timeout`` seconds or
the prompt says why not (it is running, it ended, its process is gone).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from monarch.actors.debugging import protocol as p
from monarch.cli import debug_commands as dc
from monarch.cli.debug_client import NO_ANSWER, PROC_GONE, DebugClient
from monarch.cli.main import broker_url

BANNER = (
    "monarch debugger: `list` shows the paused actors, `attach RANK` debugs one, "
    "`help` lists the commands"
)


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.settings import settings

    if args.pdb_command and args.cast is None:
        print("monarch debug: a pdb command is given only with --cast SEL "
              "(e.g. monarch debug --cast 'ranks(all)' c)", file=sys.stderr)  # fmt: skip
        return 2
    url, cfg = broker_url(args), settings()
    client = DebugClient(
        cfg.namespace,
        window=args.window,
        timeout=args.timeout,
        heartbeat_timeout=cfg.heartbeat_timeout,
    )
    try:
        try:
            client.connect(url, args.connect_timeout)
        except Exception as e:  # noqa: BLE001  (unreachable broker: one line, not a traceback)
            print(f"monarch debug: {e}", file=sys.stderr)
            return 1
        if args.list:
            return print_sessions(client.sessions())
        if args.cast is not None:
            return cast_once(client, args.cast, " ".join(args.pdb_command))
        return Console(client).loop()
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001  (the broker went away mid-command: say so, no traceback)
        print(f"monarch debug: {_failure(e)}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def cast_once(client: DebugClient, selection: str, command: str) -> int:
    """``--cast SEL CMD``: 0 if every selected session answered, 1 otherwise."""
    try:
        cmd = dc.parse(f"cast {selection} {command}")
    except dc.ParseError as e:
        print(f"monarch debug --cast: {e}", file=sys.stderr)
        return 2
    assert isinstance(cmd, dc.Cast)
    return 0 if cast(client, cmd) else 1


def print_sessions(sessions: list[dict[str, Any]]) -> int:
    if not sessions:
        print("no paused sessions (no actor is stopped at a breakpoint)")
        return 0
    cols = ["ACTOR", "RANK", "COORDS", "PROC", "HOST", "PID", "STATE", "STOPPED AT"]
    rows = [cols] + [
        [
            str(s.get("mesh")),
            str(s.get("rank")),
            ",".join(f"{k}={v}" for k, v in (s.get("coords") or {}).items()) or "-",
            str(s.get("proc")),
            str(s.get("host")),
            str(s.get("pid")),
            str(s.get("state")),
            f"{s.get('function')} {s.get('file')}:{s.get('line')}",
        ]
        for s in sessions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cast(client: DebugClient, cmd: dc.Cast, lines: list[str] | None = None) -> bool:
    """Send ``cmd`` (or ``lines``) to the sessions it selects; print each one's output."""
    chosen = [s for s in client.sessions() if dc.selected(s, cmd.ranks, cmd.actor)]
    if not chosen:
        print("no paused session matches; `list` shows them")
        return False
    answers = client.send_many(chosen, lines or [cmd.command])
    ok = True
    for info, answer in zip(chosen, answers):
        label = f"[{info.get('mesh')} rank {info.get('rank')}]"
        text = answer.get("out") or ""
        for line in text.splitlines():
            print(f"{label} {line}")
        note = _note(info, answer)
        if note:
            print(f"{label} {note}")
        ok = ok and answer.get("state") in (p.PROMPT, p.RUNNING, p.ENDED)
    return ok


def _note(info: dict[str, Any], answer: dict[str, Any]) -> str:
    """What to say about an answer's state (nothing for a session still at its prompt)."""
    state = answer.get("state")
    if state == p.ENDED:
        return f"session ended ({answer.get('how') or 'continued'})"
    if state == p.RUNNING:
        return "running: it pauses again at a breakpoint (`list` shows it then)"
    if state == p.GONE:
        return "session ended meanwhile (it is not paused any more)"
    if state == PROC_GONE:
        return f"session ended: proc {info.get('proc')} is gone"
    if state == NO_ANSWER:
        return (
            "no answer in time: it is running (e.g. a long `next`); `list` shows it once it pauses"
        )
    return ""


class Console:
    """The interactive ``monarch_dbg>`` prompt."""

    def __init__(self, client: DebugClient) -> None:
        self.client = client
        try:  # line editing and history at the prompts, where the platform has it
            import readline  # noqa: F401
        except ImportError:
            pass

    def loop(self) -> int:
        print(BANNER)
        while True:
            line = _read("monarch_dbg> ")
            if line is None:  # Ctrl-D
                print()
                return 0
            if line == INTERRUPTED:
                continue
            try:
                cmd = dc.parse(line)
            except dc.ParseError as e:
                print(e)
                continue
            if isinstance(cmd, dc.Quit):
                return 0
            if cmd is None:
                continue
            try:
                self.do(cmd)
            except KeyboardInterrupt:
                print("\ninterrupted")
            except Exception as e:  # noqa: BLE001  (e.g. the broker went away: the prompt stays)
                print(f"command failed: {_failure(e)}")

    def do(self, cmd: dc.Command) -> None:
        if isinstance(cmd, dc.Help):
            print(dc.HELP, end="")
        elif isinstance(cmd, dc.ListSessions):
            print_sessions(self.client.sessions())
        elif isinstance(cmd, dc.Attach):
            self.attach(cmd)
        elif isinstance(cmd, dc.Cast):
            cast(self.client, cmd)
        elif isinstance(cmd, dc.ContinueAll):
            cast(self.client, dc.Cast("continue"), ["clear", "continue"])
        elif isinstance(cmd, dc.Detach):
            print("not attached; `attach RANK` first")

    def attach(self, cmd: dc.Attach) -> None:
        sessions = self.client.sessions()
        chosen = [
            s for s in sessions if s.get("rank") == cmd.rank and dc.actor_matches(s, cmd.actor)
        ]
        who = f"{cmd.actor} rank {cmd.rank}" if cmd.actor else f"rank {cmd.rank}"
        if not chosen:
            have = ", ".join(f"{s.get('mesh')} {s.get('rank')}" for s in sessions) or "none"
            print(f"no paused session for {who} (paused: {have})")
            return
        meshes = {s.get("mesh") for s in chosen}
        if len(chosen) > 1 and len(meshes) > 1:
            print(f"{who} is paused in several actor meshes ({', '.join(map(str, sorted(meshes)))}): "
                  "say which, e.g. `attach MESH RANK`")  # fmt: skip
            return
        info = chosen[0]
        answer = self.client.send(info, p.ATTACH)
        label = f"{info.get('mesh')} rank {info.get('rank')}"
        if answer.get("state") == p.PROMPT:
            print(f"attached to {label} ({info.get('actor')} on {info.get('host')}, "
                  f"pid {info.get('pid')}); `detach` returns to monarch_dbg")  # fmt: skip
        while answer.get("state") == p.PROMPT:
            print(answer.get("out") or "", end="")
            line = _read("(Pdb) ")
            while line == INTERRUPTED:
                print("(Ctrl-C is not sent to the actor; `detach` leaves the session paused)")
                line = _read("(Pdb) ")
            if line is None or line.strip() == "detach":
                if line is None:
                    print()
                print(f"detached from {label}; it stays paused")
                return
            answer = self.client.send(info, p.LINE, line)
        print(answer.get("out") or "", end="")
        print(_note(info, answer) or "", f"({label})")


INTERRUPTED = "\x03"  # what _read gives for Ctrl-C


def _read(prompt: str) -> str | None:
    """A line from the terminal; None at end of input, :data:`INTERRUPTED` for Ctrl-C."""
    try:
        return input(prompt)
    except EOFError:
        return None
    except KeyboardInterrupt:
        print()
        return INTERRUPTED
