"""The embedded broker's token reaches nobody but the job: never argv, never a file others can read.

Any local user can read every process's command line (``ps -eo args``,
``/proc/<pid>/cmdline``) and every world-readable file, while
``/proc/<pid>/environ`` is the owner's only. So the token travels to procs
and agents in ``MONARCH_NATS_URL`` (the environment), and to nats-server in a
0600 config file in a 0700 directory that is removed with the broker.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nats

from monarch.broker.connections.server import EmbeddedBroker
from tests.helpers import descendants

ROOT = Path(__file__).resolve().parents[2]

JOB = """
import os, subprocess, sys
from urllib.parse import urlsplit
from monarch.actor import Actor, attach_to_workers, endpoint, this_host

class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

local = this_host().spawn_procs(per_host={"gpus": 2})
local.spawn("p", Pinger).ping.call().get()
# A host agent on this job's broker, started as a user would: the URL, token
# included, in its environment (started after the runtime, which set it).
agent = subprocess.Popen(
    [sys.executable, "-m", "monarch.cli.main", "host", "--name", "secrets-host"],
    env=os.environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
)
hosts = attach_to_workers(workers=["secrets-host"], timeout=60)
remote = hosts.spawn_procs(per_host={"gpus": 1})
remote.spawn("r", Pinger).ping.call().get()
# The test learns the token through a pipe, which no other user can read.
print("ready", urlsplit(os.environ["MONARCH_NATS_URL"]).username, agent.pid, flush=True)
sys.stdin.readline()
remote.stop().get()
local.stop().get()
agent.terminate()
agent.wait(30)
"""


def all_cmdlines() -> dict[int, bytes]:
    """Every process's command line on this machine, as any local user can read it."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out[int(entry)] = f.read()
            except OSError:
                pass  # it just ended
    return out


def files_holding(root: Path, secret: bytes) -> list[tuple[str, bool]]:
    """``(path, others_can_read)`` for each plain file under ``root`` that contains ``secret``.

    ``root`` counts as open to all (as /tmp is); below it, a file is readable by
    others when it grants read to group or others and every folder on the way
    grants them entry. pytest's own 0700 folders above ``root`` are not
    counted, or the check could never fail.
    """
    found = []
    for folder, _dirs, files in os.walk(root):
        below = Path(folder).relative_to(root).parts
        way = [root.joinpath(*below[: i + 1]) for i in range(len(below))]
        try:
            reachable = all(os.stat(d).st_mode & 0o011 for d in way)
        except OSError:
            continue  # removed while we walked
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 4 << 20:
                    continue
                with open(path, "rb") as f:
                    if secret not in f.read():
                        continue
            except OSError:
                continue
            found.append((path, bool(reachable and st.st_mode & 0o044)))
    return found


def readable_by_others(root: Path, secret: bytes) -> list[str]:
    return [path for path, exposed in files_holding(root, secret) if exposed]


def test_a_running_jobs_token_is_on_no_command_line_and_in_no_readable_file(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    job = subprocess.Popen(
        [sys.executable, str(tmp_path / "job.py")],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    running: set[int] = set()
    try:
        ready, _, _ = select.select([job.stdout], [], [], 90)
        line = job.stdout.readline().split() if ready else []
        assert line[:1] == [b"ready"], job.stderr.read1(1 << 16) if job.poll() is not None else line
        token, agent_pid = line[1], int(line[2])
        assert len(token) >= 16

        running = descendants(job.pid)
        # nats-server, zygote, two procs, the agent and its proc
        assert agent_pid in running and len(running) >= 6
        cmdlines = all_cmdlines()
        assert all(p in cmdlines for p in running)  # we did read theirs
        assert [p for p, cmd in cmdlines.items() if token in cmd] == []

        (store,) = tmp.glob("monarch-nats-*")
        holders = [
            p for p in store.iterdir() if p.is_file() and token in p.read_bytes()
        ]  # the server must learn it from somewhere: its config file
        assert [p.name for p in holders] == ["nats-server.conf"]
        assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(holders[0]).st_mode) == 0o600
        assert readable_by_others(tmp, token) == []
        assert readable_by_others(Path(tempfile.gettempdir()), token) == []

        job.stdin.write(b"done\n")
        job.stdin.flush()
        assert job.wait(60) == 0, job.stderr.read()
        assert not holders[0].exists() and list(tmp.glob("monarch-nats-*")) == []
    finally:
        leftovers = descendants(job.pid) if job.poll() is None else set()
        for pid in [job.pid, *leftovers, *running]:  # the agent is the script's, not monarch's
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.communicate(timeout=30)


def test_token_with_characters_a_config_file_quotes_still_admits_its_clients(tmp_path):
    token = 'a"b\\c$HOME d'  # a quote, a backslash, a $ (variables), a space
    broker = EmbeddedBroker(token=token, store_dir=str(tmp_path / "store")).start()
    try:

        async def connects(**auth) -> bool:
            try:
                nc = await nats.connect(
                    f"nats://127.0.0.1:{broker.port}",
                    connect_timeout=5,
                    max_reconnect_attempts=0,
                    allow_reconnect=False,
                    **auth,
                )
            except Exception:
                return False
            await nc.close()
            return True

        assert asyncio.run(connects(token=token))
        assert not asyncio.run(connects(token="a"))
        assert token.encode() not in open(f"/proc/{broker.pid}/cmdline", "rb").read()
        # A store dir the caller gave may be shared: the config lives elsewhere.
        assert files_holding(tmp_path / "store", token.encode()) == []
    finally:
        broker.stop()
    assert files_holding(Path(tempfile.gettempdir()), token.encode()) == []  # config removed
