"""The host agent on its own: registration, heartbeats, requests, leaving cleanly."""

from __future__ import annotations

import asyncio
import signal

import nats
import pytest

from monarch.actors.messaging import messages as m
from monarch.broker.bodies.codec import dumps, loads
from monarch.broker.connections.registry import HeartbeatSeen, list_hosts
from monarch.hosts.protocol import PING, SPAWN, visible_device
from monarch.supervision.streams import heartbeat_stream
from tests.helpers import signal_storm
from tests.hosts.agents import start_agent, unique_label


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_agent_sent_a_stream_of_signals_still_leaves_cleanly(nats_url):
    # The first signal stops it; the rest land anywhere on its way out (its
    # procs stopped, its entry removed, the event loop closed): none may kill it.
    for sig in (signal.SIGTERM, signal.SIGINT):
        agent = start_agent("storm", "--labels", f"t={unique_label()}").wait_ready()
        code, sent = signal_storm(agent.popen, sig)
        assert (code, sent > 1) == (0, True)

        async def registered():
            nc = await nats.connect(nats_url)
            try:
                return [h.uid for h in await list_hosts(nc, "default")]
            finally:
                await nc.close()

        assert agent.uid not in run(registered())


def test_agent_registers_beats_answers_and_deregisters_on_exit(nats_url):
    label = unique_label()
    agent = start_agent("node-a.example", "--labels", f"t={label},rack=r1", "--capacity", "3")
    try:
        agent.wait_ready()
        assert agent.uid.startswith("node-a-example-")

        async def check_running():
            nc = await nats.connect(nats_url)
            try:
                (info,) = [h for h in await list_hosts(nc, "default") if h.uid == agent.uid]
                async with HeartbeatSeen(nc, "default") as seen:
                    for _ in range(100):
                        if seen.alive(agent.uid, 2.0):
                            break
                        await asyncio.sleep(0.05)
                    beating = seen.alive(agent.uid, 2.0)
                reply = await nc.request(
                    f"mon.default.ctl.host.{agent.uid}", b"", timeout=10, headers={m.KIND: PING}
                )
                return info, beating, reply
            finally:
                await nc.close()

        info, beating, reply = run(check_running())
        assert (info.name, info.address, info.pid) == ("node-a.example", "127.0.0.1", agent.pid)
        assert info.labels == {"t": label, "rack": "r1"} and info.capacity == 3
        assert beating
        assert reply.headers[m.KIND] == "ok" and loads(reply.data)["uid"] == agent.uid
        assert agent.stop(signal.SIGTERM) == 0

        async def check_gone():
            nc = await nats.connect(nats_url)
            try:
                hosts = [h.uid for h in await list_hosts(nc, "default")]
                last = await nc.jetstream().get_last_msg(
                    heartbeat_stream("default"), f"mon.default.hb.{agent.uid}"
                )
                return hosts, last.headers
            finally:
                await nc.close()

        hosts, last_beat = run(check_gone())
        assert agent.uid not in hosts
        assert last_beat["Mon-Kind"] == "dead"  # watchers learn at once, not after a timeout
    finally:
        agent.stop()


def test_agent_refuses_what_exceeds_its_capacity_and_unknown_requests(nats_url):
    agent = start_agent("small", "--labels", f"t={unique_label()}", "--capacity", "1").wait_ready()
    try:

        async def ask():
            nc = await nats.connect(nats_url)
            try:
                subject = f"mon.default.ctl.host.{agent.uid}"
                spec = {"procs": [["p-a", 0], ["p-b", 1]], "labels": ["gpus"], "sizes": [2],
                        "ready": "mon.default.port.x.1", "exits": "mon.default.port.x.2",
                        "owner": "client-x", "root": "client-x"}  # fmt: skip
                too_many = await nc.request(
                    subject, dumps(spec), timeout=10, headers={m.KIND: SPAWN}
                )
                unknown = await nc.request(subject, b"", timeout=10, headers={m.KIND: "reboot"})
                return too_many, unknown
            finally:
                await nc.close()

        too_many, unknown = run(ask())
        assert too_many.headers[m.KIND] == "error"
        err = m.decode_error(too_many.data, actor_id=agent.uid, rank=None, endpoint="spawn")
        assert "at most 1" in str(err.exception)
        assert unknown.headers[m.KIND] == "error"
    finally:
        assert agent.stop() == 0


def test_agent_refuses_malformed_bindings_and_commands_and_goes_on_serving(nats_url):
    agent = start_agent("picky", "--labels", f"t={unique_label()}").wait_ready()
    try:

        async def ask():
            nc = await nats.connect(nats_url)
            try:
                subject = f"mon.default.ctl.host.{agent.uid}"
                spec = {"procs": [["p-a", 0]], "labels": ["gpus"], "sizes": [1],
                        "ready": "mon.default.port.x.1", "exits": "mon.default.port.x.2",
                        "owner": "client-x", "root": "client-x"}  # fmt: skip
                bad = [
                    {**spec, "bind": "cpus=0"},
                    {**spec, "bind": [{"cpus": "zero"}]},
                    {**spec, "commands": [{"program": "/bin/true", "args": "-c"}]},
                    {**spec, "commands": [{"program": "/bin/true"}, {"program": "/bin/true"}]},
                    {**spec, "commands": [{"program": "/bin/true", "shell": True}]},
                ]
                answers = [
                    await nc.request(subject, dumps(b), timeout=10, headers={m.KIND: SPAWN})
                    for b in bad
                ]
                ping = await nc.request(subject, b"", timeout=10, headers={m.KIND: PING})
                return answers, ping
            finally:
                await nc.close()

        answers, ping = run(ask())
        errors = [
            str(m.decode_error(a.data, actor_id=agent.uid, rank=None, endpoint="spawn").exception)
            for a in answers
        ]
        assert [a.headers[m.KIND] for a in answers] == ["error"] * len(answers), errors
        assert "malformed proc_bind" in errors[0]
        assert "'zero' is not a CPU list" in errors[1]
        assert all("malformed bootstrap command" in e for e in errors[2:3] + errors[4:]), errors
        assert "1 procs" in errors[3]
        assert ping.headers[m.KIND] == "ok" and loads(ping.data)["procs"] == []  # nothing started
    finally:
        assert agent.stop() == 0


def test_agent_without_a_broker_says_so():
    agent = start_agent("nobroker", "--nats-url", "nats://127.0.0.1:9", "--connect-timeout", "0.5")
    assert agent.popen.wait(30) == 1


def test_each_proc_sees_only_its_own_device_of_the_host():
    assert visible_device(None, 2) == "2"
    assert visible_device("4,5,6,7", 1) == "5"
    assert visible_device("", 0) == ""
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=4"):
        visible_device("4", 1)
