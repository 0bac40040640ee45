"""Workers started Monarch's way: ``run_worker_loop_forever(address=...)`` with no broker.

Each worker is a real process whose environment names no broker; the test's
client dials the address it was given and hands the worker its broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from monarch.actor import Actor, Future, attach_to_workers, context, endpoint

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


def start_worker(address: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    code = (
        "from monarch.actor import run_worker_loop_forever\n"
        f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=env)


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


def test_attach_to_an_address_nobody_listens_on_fails_within_its_timeout(nats_url, tmp_path):
    """No worker at the address: a TimeoutError naming it, never a hang."""
    missing = f"ipc://{tmp_path}/never-bound"
    with pytest.raises(TimeoutError, match="never-bound"):
        attach_to_workers(workers=[missing], timeout=2)
