"""The `monarch` command: broker, ps, tail, and help."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import nats
import pytest

from monarch.actor import attach_to_workers
from monarch.broker.connections.registry import PROCS, open_bucket
from monarch.broker.connections.server import free_port
from monarch.cli.tail import decode_body
from tests.helpers import wait_until
from tests.hosts.agents import ROOT, _readline, start_agent, unique_label
from tests.hosts.host_actors import Where


def monarch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_every_command():
    out = monarch("--help").stdout
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("    ")}
    for command in ("demo", "broker", "host", "ps", "tail", "jobs", "stacks", "debug", "query",
                    "top", "dashboard"):  # fmt: skip
        assert command in listed, out


def test_broker_serves_jetstream_until_interrupted(tmp_path):
    port = free_port()
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "monarch.cli.main", "broker", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--store-dir", str(store), "--name", "t1"]
    broker = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert f"JetStream on port {port}" in _readline(broker, 30)

        async def jetstream_on() -> bool:
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1)
            except Exception:
                return False
            try:
                return (await nc.jetstream().account_info()) is not None
            finally:
                await nc.close()

        assert wait_until(lambda: asyncio.run(jetstream_on()), timeout=30, interval=0.2)
        assert store.is_dir()
        broker.send_signal(signal.SIGINT)
        broker.wait(30)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait(10)


def test_ps_shows_hosts_procs_and_meshes_and_prunes_stale_entries(nats_url):
    label = unique_label()
    agent = start_agent("psnode", "--labels", f"t={label}").wait_ready()
    procs = None
    try:
        procs = attach_to_workers(workers=[agent.uid], timeout=30).spawn_procs(per_host={"gpus": 2})
        procs.spawn("psmesh", Where).ping.call().get(timeout=60)

        async def add_stale():
            nc = await nats.connect(nats_url)
            kv = await open_bucket(nc, "default", PROCS)
            await kv.put("stale-proc", json.dumps({"uid": "stale-proc", "pid": 1}).encode())
            await nc.close()

        asyncio.run(add_stale())
        snap = json.loads(monarch("ps", "--json", "--prune").stdout)
        (host,) = [h for h in snap["hosts"] if h["uid"] == agent.uid]
        assert host["state"] == "up" and host["labels"] == {"t": label} and host["pid"] == agent.pid
        mine = [p for p in snap["procs"] if p.get("host_uid") == agent.uid]
        assert len(mine) == 2 and {p["state"] for p in mine} == {"up"}
        (mesh,) = [m for m in snap["meshes"] if m["name"] == "psmesh"]
        assert mesh["ranks"] == [0, 1] and mesh["class"] == "Where"
        assert mesh["sizes"] == {"hosts": 1, "gpus": 2}
        assert {"uid": "stale-proc", "pid": 1, "state": "silent"} in snap["procs"]
        assert snap["pruned"] >= 1
        procs.stop().get(timeout=60)
        procs = None
        table = monarch("ps").stdout
        assert "psnode" in table and "ACTOR MESHES" in table
        assert "stale-proc" not in table and "psmesh" not in table
    finally:
        if procs is not None:
            procs.stop().get(timeout=60)
        agent.stop()


def test_tail_prints_subjects_headers_and_decoded_bodies(nats_url):
    from monarch.actor import this_host

    cmd = [sys.executable, "-m", "monarch.cli.main", "tail", "mon.default.act.tailed.>"]
    cmd += ["--seconds", "60", "--width", "400"]
    tail = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert tail.stdout.readline().startswith("# listening on mon.default.act.tailed.>")
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        assert procs.spawn("tailed", Where).ping.call_one(41).get(timeout=30) == 41
        procs.stop().get(timeout=30)
        tail.send_signal(signal.SIGINT)
        out, _ = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(10)
    (line,) = [x for x in out.splitlines() if "Mon-Endpoint=ping" in x]
    assert line.startswith("mon.default.act.tailed.")
    assert "Mon-Kind=call" in line and "reply=mon.default.port." in line
    assert line.endswith("((41,), {}, None)")


def test_bodies_decode_to_text_without_unpickling():
    from monarch.broker.bodies.codec import dumps

    class Local:
        pass

    assert decode_body(dumps((1, "a"))) == "(1, 'a')"
    shown = decode_body(dumps({"x": Local(), "y": (2,)}))
    assert shown.startswith("{'x': '<pickle ") and "'y': (2,)" in shown
    assert decode_body(b"1712345678.5") == "1712345678.5"  # a heartbeat
    assert decode_body(b"its process exited with code 0") == "'its process exited with code 0'"


def test_tail_shows_each_message_inside_a_batch():
    from monarch.broker.bodies import batch
    from monarch.broker.bodies.codec import dumps
    from monarch.cli.tail import format_msg

    class Raw:
        subject, reply = "mon.default.act.m.u.0", ""

        def __init__(self, data, headers):
            self.data, self.headers = data, headers

    items = [
        ({"Mon-Kind": "send", "Mon-Endpoint": "ping"}, dumps(((i,), {}, None))) for i in (1, 2)
    ]
    lines = format_msg(Raw(batch.pack(items), batch.headers(2))).splitlines()
    assert lines == [
        "mon.default.act.m.u.0 Mon-Kind=batch Mon-Count=2",
        "  > mon.default.act.m.u.0 Mon-Kind=send Mon-Endpoint=ping  ((1,), {}, None)",
        "  > mon.default.act.m.u.0 Mon-Kind=send Mon-Endpoint=ping  ((2,), {}, None)",
    ]
    bad = format_msg(Raw(b"\xc1", batch.headers(3)))
    assert bad.startswith("mon.default.act.m.u.0 Mon-Kind=batch Mon-Count=3  <batch on")


@pytest.mark.parametrize(
    "command",
    [["ps"], ["stacks"], ["tail", "--count", "1"], ["query", "SELECT 1"], ["debug", "--list"]],
)
def test_an_unreachable_broker_is_a_message_after_the_connect_timeout(command):
    # Port 1 on loopback: nothing listens, every attempt is refused. The tool gives up after
    # --connect-timeout (not its 10 s default), names the address and how long it tried, and
    # prints no traceback.
    name = command[0]
    done = monarch(*command, "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "1")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"monarch {name}: cannot reach the NATS broker at nats://127.0.0.1:1" in done.stderr
    assert "(tried for 1 s)" in done.stderr
    assert "Traceback" not in done.stderr
