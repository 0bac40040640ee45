"""Monarch's way in: a worker listens on an address and a client dials it.

Monarch's scripts and tests start workers with
``run_worker_loop_forever(address="tcp://host:port")`` (or ``ipc://path``, or
the alias ``tcp://PUBLIC:PORT@tcp://0.0.0.0:PORT``: dial the first, bind the
second) and hand the same addresses to ``attach_to_workers(workers=[...])``,
with no broker configured anywhere. Here such a worker listens on that
address for one thing only: a client's hello, a JSON line carrying the
client's ``MONARCH_*`` settings (its broker URL among them). The worker then
runs a host agent on that broker with those settings, answers with the agent's
uid (or ``{"error": ...}``), and keeps the agent while the client keeps the
connection open: the connection is the client's lifeline. When it closes (the
client ended), the agent stops its procs and leaves, and the worker waits for
the next client. One client at a time; another one is told so.

Nothing but the hello travels on that connection; every message goes through
the broker. The client's embedded broker listens on loopback only, so a worker
on another machine needs a broker both can reach (``MONARCH_NATS_URL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from monarch.broker.config import settings

HELLO_TIMEOUT = 10.0  # seconds a dialling client has to say hello


def split_address(address: str) -> tuple[str, str]:
    """``(dial, bind)`` of a Monarch worker address (``dial@bind`` or just one)."""
    dial, _, bind = address.partition("@")
    return dial, bind or dial


def is_dialable(worker: str) -> bool:
    """Whether ``worker`` is an address a worker could listen on (not an agent name)."""
    dial, _ = split_address(worker)
    if dial.startswith("ipc://") or dial.startswith("unix:"):
        return True
    if dial.startswith("tcp://"):
        return dial.rsplit(":", 1)[-1].isdigit()
    return False


def _unix_path(address: str) -> str:
    return address.removeprefix("ipc://").removeprefix("unix:")


def _tcp_host_port(address: str) -> tuple[str, int]:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    return host.strip("[]"), int(port)


async def open_connection(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a worker's dial address (raises OSError when nobody listens)."""
    if address.startswith("tcp://"):
        return await asyncio.open_connection(*_tcp_host_port(address))
    return await asyncio.open_unix_connection(_unix_path(address))


async def _listen(bind: str, handler: Any) -> asyncio.AbstractServer:
    if bind.startswith("tcp://"):
        host, port = _tcp_host_port(bind)
        return await asyncio.start_server(handler, host, port)
    return await asyncio.start_unix_server(handler, _unix_path(bind))


class DialInWorker:
    """Listens on ``address``; runs a host agent for the client attached to it."""

    def __init__(
        self,
        address: str,
        *,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        capacity: int | None = None,
    ) -> None:
        self.dial, self.bind = split_address(address)
        self.name, self.labels, self.capacity = name, labels, capacity
        self._busy: int | None = None  # pid of the client being served

    async def serve_forever(self) -> None:
        """Serve clients one after another until SIGINT or SIGTERM."""
        server = await _listen(self.bind, self._client)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        print(f"monarch worker listening at {self.dial} (bound to {self.bind})", flush=True)
        async with server:
            await stop.wait()
        if self.bind.startswith(("ipc://", "unix:")):
            with contextlib.suppress(OSError):
                os.unlink(_unix_path(self.bind))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT))
            env = {k: str(v) for k, v in hello["env"].items() if k.startswith("MONARCH_")}
            if self._busy is not None:
                await _reply(writer, error=f"worker {self.dial} serves another client "
                             f"(pid {self._busy}); one client at a time")  # fmt: skip
                return
            self._busy = int(hello.get("pid", 0))
            try:
                await self._serve(hello, env, reader, writer)
            finally:
                self._busy = None
        except (OSError, ValueError, KeyError, asyncio.TimeoutError):
            pass  # not a client of ours, or one that left mid-hello
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, hello: dict, env: dict[str, str], reader: Any, writer: Any) -> None:
        from monarch.hosts.agent import HostAgent  # the agent's imports, paid per client

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the client's broker and settings, for the agent and its procs
        settings.cache_clear()
        try:
            agent = HostAgent(
                env["MONARCH_NATS_URL"], name=self.name, labels=self.labels, capacity=self.capacity
            )
            try:
                await agent.start(float(hello.get("timeout", 30.0)))
            except Exception as e:
                await _reply(writer, error=f"worker {self.dial} could not join the client's "
                             f"broker {_redacted(env['MONARCH_NATS_URL'])}: {e!r}")  # fmt: skip
                return
            try:
                await _reply(writer, uid=agent.uid)
                while await reader.read(4096):  # the lifeline: until the client hangs up
                    pass
            finally:
                await agent.close()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            settings.cache_clear()


def _redacted(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rsplit('@', 1)[-1]}" if rest else url


async def _reply(writer: asyncio.StreamWriter, **fields: Any) -> None:
    writer.write(json.dumps(fields).encode() + b"\n")
    await writer.drain()


async def dial(worker: str, timeout: float) -> tuple[str, asyncio.StreamWriter] | None:
    """Say hello to the worker at ``worker``: its agent's uid and the lifeline to keep.

    None when nobody listens there (yet); RuntimeError when the worker refuses.
    """
    address, _ = split_address(worker)
    try:
        reader, writer = await open_connection(address)
    except OSError:
        return None
    env = {k: v for k, v in os.environ.items() if k.startswith("MONARCH_")}
    hello = {"env": env, "pid": os.getpid(), "timeout": max(1.0, timeout)}
    try:
        writer.write(json.dumps(hello).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), max(1.0, timeout))
    except (OSError, asyncio.TimeoutError) as e:
        writer.close()
        raise RuntimeError(f"worker {address} did not answer within {timeout:.0f} s: {e!r}") from e
    reply = json.loads(line) if line else {"error": "it closed the connection"}
    if "uid" not in reply:
        writer.close()
        raise RuntimeError(f"worker {address} refused to attach: {reply.get('error')}")
    return str(reply["uid"]), writer
