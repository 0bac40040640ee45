"""Who may talk to a job's broker: tokens, passwords, and namespaces fenced by accounts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.broker.connections.connect import BrokerConnectionError, connect, redact
from monarch.broker.connections.server import EmbeddedBroker
from monarch.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def run(coro):
    return asyncio.run(coro)


def test_token_broker_refuses_missing_and_wrong_tokens():
    broker = EmbeddedBroker(token="right-token").start()
    try:
        bare = broker.url.replace("right-token@", "")
        with pytest.raises(
            BrokerConnectionError, match="Authorization Violation.*MONARCH_NATS_TOKEN"
        ):
            run(connect(bare, Settings(), name="t"))
        with pytest.raises(BrokerConnectionError) as info:
            run(connect(bare, Settings(nats_token="wrong"), name="t"))
        assert "wrong" not in str(info.value)  # no secret in the message

        async def ok(url, cfg):
            nc = await connect(url, cfg, name="t")
            await nc.close()
            return True

        assert run(ok(broker.url, Settings()))
        assert run(ok(bare, Settings(nats_token="right-token")))
    finally:
        broker.stop()


def test_user_password_broker():
    broker = EmbeddedBroker(extra_args=["--user", "u1", "--pass", "p1"]).start()
    try:
        with pytest.raises(BrokerConnectionError, match="MONARCH_NATS_USER"):
            run(connect(broker.url, Settings(nats_user="u1", nats_password="nope"), name="t"))

        async def ok():
            nc = await connect(broker.url, Settings(nats_user="u1", nats_password="p1"), name="t")
            await nc.close()

        run(ok())
    finally:
        broker.stop()


def test_unreachable_broker_is_a_clear_error_not_a_hang():
    with pytest.raises(BrokerConnectionError, match="MONARCH_NATS_URL"):
        run(connect("nats://127.0.0.1:1", Settings(), name="t"))


def test_redact_hides_credentials():
    assert redact("nats://tok@h:4222,nats://u:p@g:1") == "nats://***@h:4222,nats://***@g:1"


def test_embedded_broker_of_a_client_requires_the_generated_token(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, os
            from urllib.parse import urlsplit
            from monarch.actor import this_host
            from tests.actors.actors_for_tests import Echo
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            assert pm.spawn("e", Echo).ping.call_one(3).get() == 3  # the procs got it
            url = urlsplit(os.environ["MONARCH_NATS_URL"])
            print(bool(url.username), url.hostname, url.port, flush=True)
            import nats
            async def intrude():
                try:
                    nc = await nats.connect(f"nats://{url.hostname}:{url.port}",
                                            max_reconnect_attempts=1, connect_timeout=3)
                except Exception as e:
                    return type(e).__name__
                await nc.close()
                return "connected"
            print(asyncio.run(intrude()), flush=True)
            pm.stop().get()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    has_token, host, port, outcome = result.stdout.split()
    assert has_token == "True" and host == "127.0.0.1"
    assert outcome != "connected"


def test_namespace_accounts_fence_jobs_from_each_other():
    conf = ROOT / "docs" / "nats-namespaces.conf"
    broker = EmbeddedBroker(jetstream=True, extra_args=["-c", str(conf)]).start()

    async def scenario():
        a = await connect(
            broker.url, Settings(nats_user="job-a", nats_password="secret-a"), name="a"
        )
        b = await connect(
            broker.url, Settings(nats_user="job-b", nats_password="secret-b"), name="b"
        )
        got_b: list = []
        got_a: list = []

        async def on_b(msg):
            got_b.append(msg)

        async def on_a(msg):
            got_a.append(msg)

        await b.subscribe("mon.b.>", cb=on_b)
        await a.subscribe("mon.a.>", cb=on_a)
        await b.flush()
        await a.flush()
        await a.publish("mon.b.act.victim.1._", b"intrusion")  # refused or invisible to b
        await a.publish("mon.a.act.mine.1._", b"fine")
        await a.flush()
        await b.publish("mon.b.act.victim.1._", b"own")
        await b.flush()
        await asyncio.sleep(0.3)
        await a.close()
        await b.close()
        return [m.data for m in got_a], [m.data for m in got_b]

    try:
        got_a, got_b = run(scenario())
    finally:
        broker.stop()
    assert got_a == [b"fine"]
    assert got_b == [b"own"]  # nothing from job a reached job b


def test_pickle_forbidden_at_the_receiver_too():
    from monarch.broker.bodies.codec import DecodeError, dumps, loads

    body = dumps({1, 2}, allow_pickle=True)
    with pytest.raises(DecodeError, match="pickle"):
        loads(body, allow_pickle=False)


def _make_certs(tmp: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
    ca_key, ca, key, csr, cert = (tmp / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem"))
    ext = tmp / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", "/CN=monarch-test-ca")  # fmt: skip
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    ssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


def test_tls_broker_needs_the_right_ca(tmp_path):
    ca, cert, key = _make_certs(tmp_path)
    broker = EmbeddedBroker(
        extra_args=["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
    ).start()
    try:
        url = broker.url.replace("nats://", "tls://")

        async def ok():
            nc = await connect(url, Settings(nats_tls_ca=str(ca)), name="t")
            # a thread never writes to a TLS socket itself (monarch.broker.natspy_internals.direct_write)
            assert getattr(nc, "_monarch_direct_write", None) is None
            await nc.publish("mon.tls.check", b"x")
            await nc.flush()
            await nc.close()

        run(ok())
        # the system CAs do not know our test CA: a clear error within the deadline
        with pytest.raises(BrokerConnectionError, match="MONARCH_NATS_TLS_CA"):
            run(connect(url, Settings(connect_timeout=2), name="t"))
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def operator_broker(tmp_path_factory):
    """A nats-server in operator (JWT) mode, and a user of one of its accounts."""
    from tests.reliability.nats_jwt import Operator

    folder = tmp_path_factory.mktemp("operator")
    operator = Operator()
    job = operator.account("JOB")
    alice = operator.user(job, "alice")
    conf = operator.server_config(folder / "server.conf")
    broker = EmbeddedBroker(jetstream=True, extra_args=["-c", str(conf)]).start()
    yield broker, operator, alice, folder
    broker.stop()


def test_creds_file_runs_a_whole_job(operator_broker):
    from tests.reliability.nats_jwt import write_creds

    broker, _, alice, folder = operator_broker
    creds = write_creds(alice, folder / "alice.creds")
    script = folder / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            from monarch.actor import this_host, get_or_spawn_controller
            from tests.actors.actors_for_tests import Echo
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            echoes = pm.spawn("e", Echo)
            print(sorted(echoes.ping.call(5).get().values()), flush=True)
            ctl = get_or_spawn_controller("creds-ctl", Echo).get()  # JetStream KV too
            print(ctl.ping.call_one(7).get(), flush=True)
            pm.stop().get()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(PYTHONPATH=str(ROOT), MONARCH_NATS_URL=broker.url, MONARCH_NATS_CREDS=str(creds))
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[5, 5]", "7"]


def test_creds_of_an_unknown_account_or_none_are_refused(operator_broker):
    from tests.reliability.nats_jwt import Operator, write_creds

    broker, _, _, folder = operator_broker
    stranger = Operator()  # signed by an operator this server does not trust
    eve = write_creds(stranger.user(stranger.account("EVE"), "eve"), folder / "eve.creds")
    with pytest.raises(BrokerConnectionError, match="Authorization Violation.*MONARCH_NATS_CREDS"):
        run(connect(broker.url, Settings(nats_creds=str(eve)), name="t"))
    with pytest.raises(BrokerConnectionError, match="Authorization Violation"):
        run(connect(broker.url, Settings(), name="t"))


def test_unusable_creds_file_is_named_before_connecting(tmp_path):
    missing = tmp_path / "nope.creds"
    with pytest.raises(BrokerConnectionError, match="nope.creds.*cannot be read"):
        run(connect("nats://127.0.0.1:1", Settings(nats_creds=str(missing)), name="t"))
    junk = tmp_path / "junk.creds"
    junk.write_text("not a credentials file\n")
    with pytest.raises(BrokerConnectionError, match="not a NATS credentials file"):
        run(connect("nats://127.0.0.1:1", Settings(nats_creds=str(junk)), name="t"))
