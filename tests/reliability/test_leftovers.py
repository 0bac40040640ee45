"""However a client ends, nothing it started outlives it, its exit never hangs,
and what a killed client could not clean up is removed by the next one.

Each test runs a real client script on its own embedded broker (no
``MONARCH_NATS_URL``), with its temp folder in ``tmp_path``, and ends it one way.
"Outlives" means: still alive ``MONARCH_HEARTBEAT_TIMEOUT`` plus a margin after
the client is gone; that is the promise, so it is the bound we check.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from monarch.broker.connections.server import _process_identity, remove_stale_store_dirs
from tests.helpers import descendants, pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[2]

HEARTBEAT_TIMEOUT = 1.5
MARGIN = 3.0  # a loaded two-core machine may take a moment to reap and report
EXIT_BOUND = 20.0  # MONARCH_STOP_TIMEOUT (2 s) + the runtime's own bounded waits + start-up noise

CLIENT = """
import json, os, sys
from monarch.actor import Actor, endpoint, this_host

class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"gpus": 2})
print("ready", json.dumps(list(procs.spawn("p", Pinger).ping.call().get().values())), flush=True)
how = sys.stdin.readline().strip()
if how == "_exit":
    os._exit(0)
# "exit": the script ends; the runtime stops its procs and its broker at exit
"""

FORKING_CLIENT = """
import json, multiprocessing, os, sys, time
from monarch.actor import Actor, endpoint, this_host

class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

def say(word, value):
    print(word, json.dumps(value), flush=True)

def child_uses_monarch(go):
    # A multiprocessing child, as Monarch's own tests run clients: it must start
    # its own runtime (broker, zygote, procs), never use or stop its parent's.
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    say("child-ready", [os.getpid(), procs.spawn("c", Pinger).ping.call_one().get()])
    go.wait(60)
    # multiprocessing ends the child with os._exit: no atexit, no shutdown

def wait_child(pid, bound):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"

if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    pinger = procs.spawn("p", Pinger)
    say("ready", list(pinger.ping.call().get().values()))
    sys.stdin.readline()

    # A plain forked child that never touches monarch and ends through the
    # interpreter's exit (atexit handlers run): it must neither wait on nor
    # stop its parent's runtime, broker or store directory.
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    say("plain-child", wait_child(pid, 5.0))

    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    child = ctx.Process(target=child_uses_monarch, args=(go,))
    child.start()
    sys.stdin.readline()
    go.set()
    child.join(15)
    say("child-done", child.exitcode)

    say("parent-still-works", sorted(pinger.ping.call().get().values()))
    sys.stdin.readline()
"""


def client_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(
        TMPDIR=str(tmp),  # the embedded broker's store dir goes here
        PYTHONPATH=str(ROOT),
        MONARCH_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT),
        MONARCH_HEARTBEAT_INTERVAL="0.25",
        MONARCH_STOP_TIMEOUT="2",
    )
    return env


class Client:
    """A client script in its own process, talked to over its stdin and stdout."""

    def __init__(self, tmp_path: Path, code: str, **env: str) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        script = tmp_path / "client.py"
        script.write_text(textwrap.dedent(code))
        self.popen = subprocess.Popen(
            [sys.executable, str(script)],
            env={**client_env(self.tmp), **env},
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.popen.pid
        self._pending = b""  # read from stdout's fd, not past it by a buffer select cannot see
        self._seen: set[int] = set()

    def expect(self, word: str, timeout: float = 60.0):
        """The JSON value after ``word`` on the next line, which must start with ``word``."""
        line = self._readline(timeout)
        if not line.startswith(word):
            self._kill_tree()
            _, err = self.popen.communicate(timeout=30)
            raise AssertionError(f"client said {line!r}, not {word!r}; stderr:\n{err[-3000:]}")
        return json.loads(line.split(maxsplit=1)[1])

    def _readline(self, timeout: float) -> str:
        """The next line of output, or "" if none comes within ``timeout`` seconds."""
        fd, deadline = self.popen.stdout.fileno(), time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                return ""
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def send(self, line: str) -> None:
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def store_dirs(self) -> set[str]:
        return {p.name for p in self.tmp.iterdir() if p.name.startswith("monarch-nats-")}

    def tree(self, pid: int | None = None) -> set[int]:
        """The live descendants of the client (or of ``pid``), remembered for ``close``."""
        found = descendants(self.pid if pid is None else pid)
        self._seen |= found
        return found

    def close(self) -> None:
        """Kill whatever of the client's tree a failed test left, so the next test starts clean."""
        self._kill_tree()
        self.popen.communicate(timeout=30)

    def _kill_tree(self) -> None:
        tree = descendants(self.pid) if self.popen.poll() is None else set()
        for pid in [self.pid, *tree, *(p for p in self._seen if pid_alive(p))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def gone(pids: set[int]) -> bool:
    return not any(pid_alive(p) for p in pids)


@pytest.fixture
def client(tmp_path):
    made: list[Client] = []

    def start(code: str = CLIENT, **env: str) -> Client:
        made.append(Client(tmp_path, code, **env))
        return made[-1]

    yield start
    for c in made:
        c.close()


ENDINGS = {
    "normal-exit": lambda c: c.send("exit"),
    "os._exit": lambda c: c.send("_exit"),
    "SIGTERM": lambda c: c.popen.send_signal(signal.SIGTERM),
    "SIGKILL": lambda c: c.popen.send_signal(signal.SIGKILL),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_nothing_a_client_started_outlives_it(client, ending):
    c = client()
    proc_pids = set(c.expect("ready"))
    started = c.tree()
    assert proc_pids <= started and len(started) >= 4  # nats-server, zygote, two procs
    ENDINGS[ending](c)
    c.popen.wait(EXIT_BOUND)  # raises if the client's exit hangs
    assert wait_until(lambda: gone(started), HEARTBEAT_TIMEOUT + MARGIN), (
        f"left running after {ending}: {sorted(p for p in started if pid_alive(p))}"
    )
    if ending == "normal-exit":
        assert c.popen.returncode == 0, c.popen.stderr.read()
        assert c.store_dirs() == set()


def test_procs_not_tied_by_the_kernel_still_go_once_their_client_is_killed(client):
    # Without the parent-death signal only the client's silence ends the procs
    # (the zygote still dies with the client). On an embedded broker that
    # silence is the broker's loss, which dies with the client too: the client
    # gives its procs MONARCH_BROKER_LOST_TIMEOUT = the heartbeat timeout.
    c = client(MONARCH_DIE_WITH_PARENT="0")
    proc_pids = set(c.expect("ready"))
    started = c.tree()
    assert proc_pids <= started
    c.popen.kill()
    c.popen.wait(EXIT_BOUND)
    assert wait_until(lambda: gone(started), HEARTBEAT_TIMEOUT + MARGIN), (
        f"left running: {sorted(p for p in started if pid_alive(p))}"
    )


def test_forked_child_of_a_client_neither_reuses_nor_stops_its_parents_runtime(client):
    c = client(FORKING_CLIENT)
    parent_procs = set(c.expect("ready"))
    parent_started = c.tree()
    (parent_store,) = c.store_dirs()
    c.send("fork")

    assert c.expect("plain-child") == 0  # exited at once (no wait on the parent's loop)
    assert parent_store in c.store_dirs()  # and did not remove the parent's store

    child_pid, child_proc = c.expect("child-ready")
    child_started = c.tree(child_pid)
    assert child_proc in child_started  # its proc is its own, not one of its parent's
    assert not child_started & parent_started
    assert len(c.store_dirs()) == 2  # and so is its broker
    c.send("go")
    assert c.expect("child-done") == 0
    assert wait_until(lambda: gone(child_started), HEARTBEAT_TIMEOUT + MARGIN), (
        f"the child's processes outlived it: {sorted(p for p in child_started if pid_alive(p))}"
    )

    assert c.expect("parent-still-works") == sorted(parent_procs)
    assert all(pid_alive(p) for p in parent_started)
    c.send("exit")
    c.popen.wait(EXIT_BOUND)
    assert c.popen.returncode == 0, c.popen.stderr.read()
    assert wait_until(lambda: gone(parent_started), HEARTBEAT_TIMEOUT + MARGIN)
    # The child's store dir was left by its os._exit; the parent's own is gone.
    assert parent_store not in c.store_dirs()


def _owner_record(pid: int, start: int) -> str:
    return json.dumps({**_process_identity(os.getpid()), "pid": pid, "start": start})


def test_next_start_removes_store_dirs_of_dead_owners_and_keeps_live_ones(client, tmp_path):
    killed = client()
    killed.expect("ready")
    (stale,) = killed.store_dirs()
    killed.popen.kill()
    killed.popen.wait(EXIT_BOUND)
    assert stale in killed.store_dirs()  # a SIGKILLed client cannot clean up

    tmp = killed.tmp
    # The test process is alive: a dir naming it stays; a dir naming its pid with
    # another start time belonged to an earlier process that had the same pid.
    live, reused = tmp / "monarch-nats-live", tmp / "monarch-nats-reused"
    me = _process_identity(os.getpid())
    for d, start in ((live, me["start"]), (reused, me["start"] - 1)):
        d.mkdir(mode=0o700)
        (d / "owner").write_text(_owner_record(os.getpid(), start))
    unmarked = tmp / "monarch-nats-unmarked"  # no owner recorded: not ours to judge
    unmarked.mkdir(mode=0o700)

    nxt = client()
    nxt.expect("ready")
    dirs = nxt.store_dirs()
    assert stale not in dirs and reused.name not in dirs
    assert {live.name, unmarked.name} <= dirs and len(dirs) == 3  # plus its own
    nxt.send("exit")
    nxt.popen.wait(EXIT_BOUND)
    assert nxt.store_dirs() == {live.name, unmarked.name}


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a dir owned by another user")
def test_store_dirs_of_other_users_are_never_removed(tmp_path):
    theirs = tmp_path / "monarch-nats-theirs"
    theirs.mkdir(mode=0o700)
    (theirs / "owner").write_text(_owner_record(2**22 + 12345, 1))  # no such process
    os.chown(theirs, 65534, 65534)
    ours = tmp_path / "monarch-nats-ours"
    ours.mkdir(mode=0o700)
    (ours / "owner").write_text(_owner_record(2**22 + 12345, 1))
    remove_stale_store_dirs(str(tmp_path))
    assert theirs.exists() and not ours.exists()
