"""Workers started Monarch's way: ``run_worker_loop_forever(address=...)`` with no broker.

Each worker is a real process whose environment names no broker; the test's
client dials the address it was given and hands the worker its broker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Actor, Future, attach_to_workers, context, endpoint
from monarch.config import configured
from monarch.job import new_service_proc_id, service_proc_addr
from tests.helpers import signal_storm, wait_until

ROOT = Path(__file__).resolve().parents[2]


class Where(Actor):
    @endpoint
    async def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(
    address: str, pass_fds: tuple[int, ...] = (), stdout: Any = None, **extra_env: str
) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra_env)
    code = (
        "from monarch.actor import run_worker_loop_forever\n"
        f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=pass_fds, stdout=stdout)


def stop_workers(workers: list[subprocess.Popen]) -> list[int]:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    codes = []
    for w in workers:
        try:
            codes.append(w.wait(timeout=30))
        except subprocess.TimeoutExpired:
            w.kill()
            codes.append(w.wait(timeout=10))
    return codes


def test_attach_dials_workers_given_tcp_alias_ipc_and_future_addresses(nats_url, tmp_path):
    """Addresses as Monarch's tests give them (a dial@bind alias, a unix socket, a
    Future[str]): the client finds the workers there, and procs run on them."""
    port = free_port()
    alias = f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"
    ipc = f"ipc://{tmp_path}/worker-1"
    workers = [start_worker(alias), start_worker(ipc)]
    try:

        async def resolve(address: str) -> str:
            return address

        hosts = attach_to_workers(
            workers=[alias, Future._from_coro(resolve(ipc))], ca="trust_all_connections", timeout=60
        )
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        ranks = sorted(where.rank.call().get(timeout=60).values())
        pids = set(where.pid.call().get(timeout=60).values())
        hosts.shutdown().get(timeout=60)
    finally:
        codes = stop_workers(workers)
    assert ranks == [0, 1]
    assert len(pids) == 2 and not pids & {w.pid for w in workers}  # procs of their own
    assert codes == [0, 0]  # and the workers stopped cleanly on SIGTERM


def test_a_worker_sent_a_stream_of_sigterms_still_exits_cleanly(tmp_path):
    # The first SIGTERM stops it; the rest land anywhere on its way out (a
    # supervisor's signal crossing a client's shutdown): none may kill it.
    for i in range(3):
        worker = start_worker(f"ipc://{tmp_path}/storm-{i}", stdout=subprocess.PIPE)
        assert "listening" in worker.stdout.readline().decode()
        code, sent = signal_storm(worker, signal.SIGTERM)
        worker.stdout.close()
        assert (code, sent > 1) == (0, True)
    assert not list(tmp_path.glob("storm-*"))  # and each removed its socket file


def test_a_worker_on_an_inherited_socket_ends_when_its_client_shuts_the_hosts_down(nats_url):
    # The worker inherits a MONARCH_NATS_URL too (a client's subprocess does, as in
    # Monarch's own tests): its explicit address still wins, it listens there.
    """``tcp://host:fdN``: the worker adopts a listening socket it was handed; the
    client dials its real port. ``HostMesh.shutdown()`` ends the worker, as Monarch's
    (a client that merely goes away leaves it waiting for the next one)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        worker = start_worker(
            f"tcp://127.0.0.1:fd{sock.fileno()}",
            pass_fds=(sock.fileno(),),
            MONARCH_NATS_URL=nats_url,
        )
    try:
        hosts = attach_to_workers(workers=[f"tcp://127.0.0.1:{port}"], timeout=60)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_fd", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        hosts.shutdown().get(timeout=60)
        code = worker.wait(timeout=60)  # ended by the shutdown, not by a signal
    finally:
        if worker.poll() is None:
            stop_workers([worker])
    assert code == 0


def test_stopping_the_host_mesh_ends_its_procs_and_keeps_the_worker_for_a_reconnect(
    nats_url, tmp_path
):
    """``HostMesh.stop()``, as Monarch's: the procs end, the worker does not; the
    same address attached again serves a new host mesh, whose shutdown ends it."""
    address = f"ipc://{tmp_path}/worker-stop"
    worker = start_worker(address)
    try:
        hosts = attach_to_workers(workers=[address], timeout=60)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_stop", Where)
        (pid,) = where.pid.call().get(timeout=60).values()
        assert hosts.stop().get(timeout=60) is None
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30)
        with pytest.raises(RuntimeError, match="already been stopped"):
            hosts.spawn_procs(per_host={"gpus": 1})
        assert worker.poll() is None  # still there, waiting for the next client

        again = attach_to_workers(workers=[address], timeout=60)
        where = again.spawn_procs(per_host={"gpus": 1}).spawn("where_again", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        again.shutdown().get(timeout=60)
        code = worker.wait(timeout=60)  # the shutdown ends it
    finally:
        if worker.poll() is None:
            stop_workers([worker])
    assert code == 0


@pytest.mark.parametrize(
    ("serve", "wait"),
    [
        # Monarch 0.7's variants: serving on a thread, its end a Future...
        ("fut = start_worker_loop_forever(address=ADDRESS, ca='trust_all_connections')",
         "print('started', flush=True); fut.get(); print('ended', flush=True)"),
        # ... and serving until the host mesh is shut down, then returning, not exiting
        ("print('started', flush=True)\n"
         "run_worker_loop_until_shutdown(address=ADDRESS, ca='trust_all_connections')",
         "print('ended', flush=True)"),
    ],
)  # fmt: skip
def test_worker_loop_variants_serve_until_the_host_mesh_is_shut_down(
    nats_url, tmp_path, serve, wait
):
    address = f"ipc://{tmp_path}/variant"
    code = (
        "from monarch.actor import run_worker_loop_until_shutdown, start_worker_loop_forever\n"
        f"ADDRESS = {address!r}\n{serve}\n{wait}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    worker = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        lines = iter(worker.stdout.readline, "")
        assert any(line.strip() == "started" for line in lines)
        hosts = attach_to_workers(workers=[address], timeout=60)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_variant", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        hosts.shutdown().get(timeout=60)
        assert any(line.strip() == "ended" for line in lines)  # it returned, then exits
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            stop_workers([worker])


def test_monarchs_own_tls_arguments_are_refused_naming_the_brokers_tls(tmp_path):
    # Monarch's ca/private_key between client and workers: here the broker does TLS.
    from monarch.actor import (
        run_worker_loop_forever,
        run_worker_loop_until_shutdown,
        start_worker_loop_forever,
    )

    address = f"ipc://{tmp_path}/tls"
    calls = [
        lambda: attach_to_workers(workers=[address], ca=b"PEM", timeout=1),
        lambda: run_worker_loop_forever(address=address, private_key=b"KEY"),
        lambda: run_worker_loop_until_shutdown(address=address, ca=b"PEM"),
        lambda: start_worker_loop_forever(address=address, private_key=b"KEY"),
    ]
    for call in calls:
        with pytest.raises(NotImplementedError, match="MONARCH_NATS_TLS_CA"):
            call()
    assert not list(tmp_path.iterdir())  # refused before anything listened


def test_start_worker_loop_forever_refuses_a_broker_address():
    from monarch.actor import start_worker_loop_forever

    with pytest.raises(ValueError, match="needs a worker address"):
        start_worker_loop_forever(address="nats://127.0.0.1:4222")


def test_attach_to_an_address_nobody_listens_on_fails_within_its_timeout(nats_url, tmp_path):
    """No worker at the address: a TimeoutError naming it, never a hang."""
    missing = f"ipc://{tmp_path}/never-bound"
    hosts = attach_to_workers(workers=[missing], timeout=2)
    with pytest.raises(TimeoutError, match="never-bound"):
        hosts.initialized.get(timeout=5)


def test_mesh_attach_config_timeout_bounds_reaching_a_worker_not_its_start(nats_url, tmp_path):
    """Monarch's ``mesh_attach_config_timeout``: an address nobody listens on fails
    once it has passed (not at the attach's own 120 s), naming the address; a
    worker that listens is reached within it and attaches, however long its
    agent then takes to start. Set while the runtime runs: it is read per attach."""
    missing = f"ipc://{tmp_path}/never-bound"
    with configured(mesh_attach_config_timeout="500ms") as config:
        assert config["mesh_attach_config_timeout"] == "500ms"
        unreachable = attach_to_workers(workers=[missing], timeout=120)
        with pytest.raises(TimeoutError) as failed:
            unreachable.initialized.get(timeout=5)
    message = str(failed.value)
    assert message.startswith("attach failed: config push failed during attach")
    assert f"{tmp_path}/never-bound" in message and "within 0.5 s" in message

    listening = f"ipc://{tmp_path}/worker"
    worker = start_worker(listening, stdout=subprocess.PIPE)
    try:
        assert "listening" in worker.stdout.readline().decode()
        with configured(mesh_attach_config_timeout="5s"):
            hosts = attach_to_workers(workers=[listening], timeout=120)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_cfg", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        hosts.shutdown().get(timeout=60)
        assert worker.wait(timeout=60) == 0
    finally:
        worker.stdout.close()
        if worker.poll() is None:
            stop_workers([worker])


def test_a_worker_started_with_a_service_identity_takes_only_clients_naming_it(nats_url, tmp_path):
    """``service_proc_addr(address, ProcId)`` (Monarch's ``ID@address``): the worker
    listens at the address; a client naming that identity attaches, one naming
    another is refused with both identities in the error."""
    identity = new_service_proc_id()
    address = f"ipc://{tmp_path}/service"
    worker = start_worker(service_proc_addr(address, identity), stdout=subprocess.PIPE)
    try:
        assert "listening" in worker.stdout.readline().decode()
        with pytest.raises(RuntimeError, match="names another worker") as refused:
            attach_to_workers(workers=[service_proc_addr(address, new_service_proc_id())])
        assert str(identity) in str(refused.value)
        hosts = attach_to_workers(workers=[service_proc_addr(address, identity)], timeout=60)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_id", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        hosts.shutdown().get(timeout=60)
        assert worker.wait(timeout=60) == 0
    finally:
        worker.stdout.close()
        if worker.poll() is None:
            stop_workers([worker])


# -- who may attach (monarch.hosts.dial_in: attaching runs code as the worker's user) --


def wait_listening(host: str, port: int, worker: subprocess.Popen) -> None:
    def up() -> bool:
        assert worker.poll() is None, "the worker exited"
        with socket.socket() as s:
            return s.connect_ex((host, port)) == 0

    assert wait_until(up, 30), "the worker did not listen"


FOREIGN_CLIENT = """
import json, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
f = s.makefile("rwb")
f.readline()  # the worker's challenge
hello = {"env": {"MONARCH_NATS_URL": "nats://127.0.0.1:9"}, "pid": 1}
f.write(json.dumps(hello).encode() + b"\\n"); f.flush()
print(f.readline().decode().strip())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_a_client_of_another_local_user_is_refused(nats_url, tmp_path):
    """Another user of this machine dials a worker on loopback and offers its own
    broker: refused (it would run code as the worker's user), and the ipc socket is
    the worker's user's alone."""
    port = free_port()
    worker = start_worker(f"tcp://127.0.0.1:{port}")
    ipc_path = tmp_path / "worker-sock"
    ipc_worker = start_worker(f"ipc://{ipc_path}")
    try:
        wait_listening("127.0.0.1", port, worker)
        as_nobody = subprocess.run(
            ["/usr/bin/python3", "-c", FOREIGN_CLIENT, "127.0.0.1", str(port)],
            preexec_fn=lambda: os.setuid(65534),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert wait_until(ipc_path.exists, 30), "no ipc socket"
        mode = ipc_path.stat().st_mode & 0o777
    finally:
        codes = stop_workers([worker, ipc_worker])
    reply = json.loads(as_nobody.stdout)
    assert "uid 65534" in reply["error"] and "clients of that user only" in reply["error"]
    assert set(reply) == {"error"}  # no agent was started for it (no uid came back)
    assert mode == 0o600
    assert codes == [0, 0]


def non_loopback_ipv4() -> str:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines() if "inet " in line]
    assert addresses, "this test needs a non-loopback IPv4 address (eth0 on our machines)"
    return addresses[0]


def test_a_client_from_another_machine_needs_the_workers_key(nats_url, monkeypatch):
    """A peer that is not on loopback: refused without MONARCH_WORKER_KEY on the
    worker, refused with a wrong key, attached with the right one (the key itself
    never travels: the hello carries an HMAC of the worker's challenge)."""
    ip = non_loopback_ipv4()
    keyless_port, keyed_port = free_port(), free_port()
    keyless = start_worker(f"tcp://{ip}:{keyless_port}@tcp://{ip}:{keyless_port}")
    keyed = start_worker(
        f"tcp://{ip}:{keyed_port}@tcp://{ip}:{keyed_port}", MONARCH_WORKER_KEY="s3cret-worker-key"
    )
    try:
        wait_listening(ip, keyless_port, keyless)
        wait_listening(ip, keyed_port, keyed)
        with pytest.raises(RuntimeError, match="MONARCH_WORKER_KEY"):
            attach_to_workers(workers=[f"tcp://{ip}:{keyless_port}"], timeout=10)
        monkeypatch.setenv("MONARCH_WORKER_KEY", "a-wrong-key")
        with pytest.raises(RuntimeError, match="wrong or missing proof"):
            attach_to_workers(workers=[f"tcp://{ip}:{keyed_port}"], timeout=10)
        monkeypatch.setenv("MONARCH_WORKER_KEY", "s3cret-worker-key")
        hosts = attach_to_workers(workers=[f"tcp://{ip}:{keyed_port}"], timeout=60)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where_keyed", Where)
        assert list(where.rank.call().get(timeout=60).values()) == [0]
        hosts.shutdown().get(timeout=60)
    finally:
        codes = stop_workers([keyless, keyed])
    assert codes == [0, 0]
