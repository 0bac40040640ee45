"""`monarch debug`: breakpoint() in an endpoint pauses that actor; the CLI lists, attaches, casts.

Real processes throughout: a client script (tests/cli/debug_target.py) whose
2-rank mesh stops at ``breakpoint()`` on both ranks, the real ``monarch
debug`` command (driven under tmux where it is interactive), and the shared
nats-server. Each test has a namespace of its own, so no test sees another's
sessions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from monarch.cli.debug_commands import Attach, Cast, ParseError, parse, selected
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _env(nats_url: str, namespace: str) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        MONARCH_NATS_URL=nats_url,
        MONARCH_NAMESPACE=namespace,
        MONARCH_OPEN_BROKER_OK="1",
    )


@pytest.fixture
def namespace() -> str:
    return f"dbg{uuid.uuid4().hex[:8]}"


def debug(env: dict[str, str], *args: str, stdin: str = "", timeout: float = 90):
    """Run ``monarch debug ARGS`` to its end (stdin given); the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", "debug", *args],
        cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


class Target:
    """The client script of tests/cli/debug_target.py, in a process of its own."""

    def __init__(self, env: dict[str, str], kind: str) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cli.debug_target", kind],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def sessions(self) -> list[list[str]]:
        """The rows of ``monarch debug --list`` (without its header)."""
        out = debug(self.env, "--list").stdout.splitlines()
        return [line.split() for line in out[1:]] if out and out[0].startswith("ACTOR") else []

    def wait_paused(self, n: int, timeout: float = 180) -> list[list[str]]:
        rows: list[list[str]] = []

        def paused() -> bool:
            nonlocal rows
            assert self.proc.poll() is None, f"the client script ended: {self.proc.communicate()}"
            rows = self.sessions()
            return len(rows) == n and all(r[6] == "paused" for r in rows)

        assert wait_until(paused, timeout=timeout, interval=0.5), f"sessions: {rows}"
        return rows

    def result(self, timeout: float = 120) -> tuple[int, list[int]]:
        """The script's exit code and the values its call returned."""
        out, err = self.proc.communicate(timeout=timeout)
        values = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                  if line.startswith("RESULT ")]  # fmt: skip
        assert values, f"no RESULT line; stdout={out!r} stderr={err[-3000:]!r}"
        return self.proc.returncode, values[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


class Tmux:
    """One tmux server (a socket of its own) running one command in a fixed-size window."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"monarch-dbg-{uuid.uuid4().hex[:8]}"
        shown = " ".join(command) + "; echo EXIT=$?; sleep 120"
        envs = [a for k in ("PYTHONPATH", "MONARCH_NATS_URL", "MONARCH_NAMESPACE",
                            "MONARCH_OPEN_BROKER_OK", "PATH") for a in ("-e", f"{k}={env[k]}")]  # fmt: skip
        self._tmux("new-session", "-d", "-s", "dbg", "-x", "160", "-y", "50", *envs,
                   "-c", str(ROOT), shown)  # fmt: skip

    def _tmux(self, *args: str) -> str:
        cmd = ["tmux", "-L", self.socket, "-f", "/dev/null", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout

    def screen(self) -> str:
        """The whole scrollback and screen, as text."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", "dbg")

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "dbg", "-l", line)
        self._tmux("send-keys", "-t", "dbg", "Enter")

    def wait_for(self, text: str, count: int = 1, timeout: float = 60) -> str:
        """Wait until ``text`` is on the screen ``count`` times; the screen then."""
        ok = wait_until(lambda: self.screen().count(text) >= count, timeout=timeout, interval=0.2)
        assert ok, f"{text!r} (x{count}) never showed; screen:\n{self.screen()}"
        return self.screen()

    def keep(self, name: str) -> Path:
        """Save the screen as an artefact; its path is printed (pytest -s shows it)."""
        path = Path(tempfile.gettempdir()) / f"monarch-debug-{name}.txt"
        path.write_text(self.screen())
        print(f"tmux screen capture: {path}")
        return path

    def close(self) -> None:
        """Stop the tmux server, and remove its socket file (kill-server leaves it behind)."""
        try:
            path = self._tmux("display-message", "-p", "#{socket_path}").strip()
        except subprocess.SubprocessError:
            path = ""
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        if path.endswith(self.socket):
            Path(path).unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_attach_prints_locals_steps_and_continue_returns_the_value_after_the_breakpoint(
    nats_url, namespace
):
    env = _env(nats_url, namespace)
    target = Target(env, "sync")
    tmux = None
    try:
        rows = target.wait_paused(2)
        assert sorted((r[0], r[1]) for r in rows) == [("syncstepper", "0"), ("syncstepper", "1")]
        tmux = Tmux([sys.executable, "-m", "monarch.cli.main", "debug"], env)
        tmux.wait_for("monarch_dbg> ")
        tmux.type("list")
        screen = tmux.wait_for("syncstepper  1")
        assert "syncstepper  0" in screen and screen.count("paused  compute") == 2

        tmux.type("attach 5")  # no such rank: a message, and the prompt again
        tmux.wait_for("no paused session for rank 5")
        tmux.wait_for("monarch_dbg> ", count=3)

        tmux.type("attach 1")
        tmux.wait_for("attached to syncstepper rank 1")
        tmux.type("p x")
        tmux.wait_for("(Pdb) p x\n41\n")  # rank 1's x: 4 * 10 + 1
        tmux.type("p y")  # not assigned yet
        tmux.wait_for("NameError")
        tmux.type("n")
        tmux.type("p y")  # after one step, y = x + 1
        tmux.wait_for("(Pdb) p y\n42\n")
        tmux.type("c")
        tmux.wait_for("session ended (continued) (syncstepper rank 1)")
        tmux.wait_for("monarch_dbg> ", count=4)

        tmux.type("cast ranks(0) p x")
        tmux.wait_for("[syncstepper rank 0] 40")
        tmux.type("cast ranks(0) c")  # releases the other rank
        tmux.wait_for("[syncstepper rank 0] session ended (continued)")
        code, values = target.result()
        assert (code, values) == (0, [82, 84])  # (x + 1) * 2 on each rank

        tmux.type("list")
        tmux.wait_for("no paused sessions")
        tmux.type("quit")
        tmux.wait_for("EXIT=0")
        tmux.keep("attach-step-continue")
    finally:
        if tmux is not None:
            tmux.close()
        target.stop()


def test_async_endpoint_breakpoint_answers_while_its_loop_is_blocked(nats_url, namespace):
    env = _env(nats_url, namespace)
    target = Target(env, "async")
    try:
        rows = target.wait_paused(2)
        assert sorted(r[1] for r in rows) == ["0", "1"]
        # The proc's event loop is blocked by the paused endpoint; the side channel answers.
        stalled = _loop_stall(nats_url, namespace, rows[0][3])
        assert stalled > 0.5, stalled
        out = debug(env, "--cast", "ranks(all)", "p", "x")
        assert out.returncode == 0, out
        assert "[asyncstepper rank 0] 400" in out.stdout
        assert "[asyncstepper rank 1] 401" in out.stdout
        # `n` over the await stops at the next line, as in pdb (the loop ran meanwhile).
        out = debug(env, "--cast", "ranks(1)", "n")
        assert out.returncode == 0 and f"({_line_of('return x + 7')})compute()" in out.stdout, out
        out = debug(env, stdin="continue\nquit\n")  # clears breakpoints, continues every rank
        assert out.returncode == 0, out
        assert out.stdout.count("session ended (continued)") == 2, out.stdout
        code, values = target.result()
        assert (code, values) == (0, [407, 408])
        assert "no paused sessions" in debug(env, "--list").stdout
    finally:
        target.stop()


def _line_of(text: str) -> int:
    """The line of tests/cli/debug_target.py that holds ``text``."""
    lines = (ROOT / "tests" / "cli" / "debug_target.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _loop_stall(nats_url: str, namespace: str, proc: str) -> float:
    """The ``Mon-Loop-Stall`` a heartbeat of ``proc`` reports, once it is above half a second."""
    import asyncio

    import nats

    async def go() -> float:
        nc = await nats.connect(nats_url)
        seen = 0.0
        try:
            sub = await nc.subscribe(f"mon.{namespace}.hb.{proc}")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and seen <= 0.5:
                msg = await sub.next_msg(timeout=10)
                seen = float((msg.headers or {}).get("Mon-Loop-Stall", 0))
        finally:
            await nc.close()
        return seen

    return asyncio.run(go())


def test_console_without_sessions_says_so_and_bad_input_keeps_the_prompt(nats_url, namespace):
    env = _env(nats_url, namespace)
    out = debug(env, stdin="list\nattach 3\nattach\ncast ranks(x) p 1\nfrobnicate\nhelp\n")
    assert out.returncode == 0, out  # end of input (Ctrl-D) leaves with 0
    assert "no paused sessions" in out.stdout
    assert "no paused session for rank 3 (paused: none)" in out.stdout
    assert "usage: attach [ACTOR] RANK" in out.stdout
    assert "ranks(x): not a rank selection" in out.stdout
    assert "unknown command 'frobnicate'" in out.stdout
    assert "cast [ACTOR] ranks(SEL) CMD" in out.stdout
    assert out.stdout.count("monarch_dbg> ") == 7
    assert "Traceback" not in out.stdout + out.stderr
    assert debug(env, "--cast", "ranks(all)", "c").returncode == 1  # nothing to continue
    assert debug(env, "--cast", "ranks(0").returncode == 2
    assert debug(env, "--list").returncode == 0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_session_ends_with_a_message_when_its_proc_dies_while_attached(nats_url, namespace):
    env = _env(nats_url, namespace)
    target = Target(env, "sync")
    tmux = None
    try:
        rows = target.wait_paused(2)
        rank1 = next(r for r in rows if r[1] == "1")
        tmux = Tmux([sys.executable, "-m", "monarch.cli.main", "debug"], env)
        tmux.wait_for("monarch_dbg> ")
        tmux.type("attach 1")
        tmux.wait_for("attached to syncstepper rank 1")
        os.kill(int(rank1[5]), signal.SIGKILL)
        tmux.type("p x")
        tmux.wait_for(f"session ended: proc {rank1[3]} is gone")
        tmux.wait_for("monarch_dbg> ", count=2)  # back at the prompt
        tmux.type("quit")
        screen = tmux.wait_for("EXIT=0")
        assert "Traceback" not in screen
        tmux.keep("proc-dies-while-attached")
    finally:
        if tmux is not None:
            tmux.close()
        target.stop()


def test_breakpoint_outside_actors_keeps_the_local_pdb(nats_url):
    script = (
        "from monarch.actor import this_proc\n"
        "this_proc()\n"  # the client's runtime is up: the hook is installed
        "x = 6\n"
        "breakpoint()\n"
        "print('after', x)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_env(nats_url, "local"),
        input="p x * 7\nc\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out
    assert "(Pdb) 42" in out.stdout and "after 6" in out.stdout


def test_rank_selections_name_the_sessions_monarch_names():
    sessions = [{"mesh": "m", "actor": f"m.u[{r}]", "rank": r, "coords": {"hosts": r // 2, "gpus": r % 2}}
                for r in range(4)]  # fmt: skip

    def chosen(line: str) -> list[int]:
        cmd = parse(line)
        assert isinstance(cmd, Cast)
        return [s["rank"] for s in sessions if selected(s, cmd.ranks, cmd.actor)]

    assert chosen("cast ranks(0,2) p x") == [0, 2]
    assert chosen("cast ranks(1:3) n") == [1, 2]
    assert chosen("cast ranks(all) c") == [0, 1, 2, 3]
    assert chosen("cast ranks(::2) c") == [0, 2]
    assert chosen("cast m ranks(gpus=1) c") == [1, 3]
    assert chosen("cast ranks(hosts=1, gpus=(0,1)) c") == [2, 3]
    assert chosen("cast other ranks(all) c") == []
    assert parse("attach m 2") == Attach(2, "m") and parse("a 1") == Attach(1)
    assert parse("cast ranks(0) p (1, 2)") == Cast("p (1, 2)", frozenset({0}))
    for bad in ("cast ranks(0 c", "cast ranks(1)", "cast ranks(a:b) c", "attach x", "go"):
        with pytest.raises(ParseError):
            parse(bad)
