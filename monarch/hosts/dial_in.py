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
the next client (``HostMesh.stop()`` hangs up so; ``shutdown()`` says
``shutdown`` first, and the worker ends). One client at a time; another one
is told so, except that one coming while the last one's agent closes after
it hung up waits for that.

Nothing but the hello travels on that connection; every message goes through
the broker. The client's embedded broker listens on loopback only, so a worker
on another machine needs a broker both can reach (``MONARCH_NATS_URL``).

Who may attach. Whoever attaches runs code as the worker's user (its actors),
so a worker does not take every hello the way Monarch's
``trust_all_connections`` does (a departure, said in docs/deployment.md):

* an ``ipc://`` socket is created for the worker's user only (mode 0600) and
  the peer's uid is checked (``SO_PEERCRED``);
* a TCP client on this machine (a loopback peer) must be the worker's own user:
  its socket's owner is read from ``/proc/net/tcp``, as identd does;
* any other client must prove it holds the worker's key: with
  ``MONARCH_WORKER_KEY`` set on both sides, the worker opens with a random
  challenge and the hello carries HMAC-SHA256(key, challenge); the key never
  travels. Without a key on the worker, remote clients are refused, naming
  the variable to set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import struct
import threading
from typing import Any

from monarch.hosts.stop_signals import ignore_stop_signals, stop_on_signals
from monarch.settings import settings

HELLO_TIMEOUT = 10.0  # seconds a dialling client has to say hello
SHUTDOWN = b"shutdown"  # the client's last line: its host mesh is shut down, the worker ends
HANG_UP_WAIT = 30.0  # seconds a client waits for the one before it (which hung up) to be let go
KEY_ENV = "MONARCH_WORKER_KEY"  # shared secret that lets clients on other machines attach


def _proof(key: str, challenge: str) -> str:
    return hmac.new(key.encode(), challenge.encode(), hashlib.sha256).hexdigest()


def _proc_net_hex(host: str, port: int) -> tuple[str, str]:
    """``host:port`` as /proc/net/tcp (IPv4) and /proc/net/tcp6 print it."""
    addr = ipaddress.ip_address(host)
    packed = addr.packed if addr.version == 6 else ipaddress.IPv6Address(f"::ffff:{addr}").packed
    v6 = "".join(f"{int.from_bytes(packed[i : i + 4], 'little'):08X}" for i in range(0, 16, 4))
    v4 = f"{int.from_bytes(addr.packed, 'little'):08X}" if addr.version == 4 else ""
    return (f"{v4}:{port:04X}" if v4 else ""), f"{v6}:{port:04X}"


def local_peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The uid owning the other end of an accepted connection from this machine, or None.

    Unix sockets: ``SO_PEERCRED``. TCP: the peer's socket is one of this
    machine's, so ``/proc/net/tcp[6]`` lists it (its local address is our
    peer, its remote address is us) with its owner's uid.
    """
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    peer, ours = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
    if not peer or not ipaddress.ip_address(peer[0].split("%")[0]).is_loopback:
        return None
    peer4, peer6 = _proc_net_hex(peer[0], peer[1])
    ours4, ours6 = _proc_net_hex(ours[0], ours[1])
    for table, local, remote in (("/proc/net/tcp", peer4, ours4), ("/proc/net/tcp6", peer6, ours6)):
        if not local:
            continue
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[1] == local and fields[2] == remote:
                        return int(fields[7])
        except OSError:
            continue
    return None


def _is_loopback(writer: asyncio.StreamWriter) -> bool:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        return True
    peer = writer.get_extra_info("peername")
    return bool(peer) and ipaddress.ip_address(peer[0].split("%")[0]).is_loopback


def split_identity(address: str) -> tuple[str | None, str]:
    """``(identity, address)`` of ``ID@address`` (``monarch.job.service_proc_addr``'s form).

    The identity is the part before the first ``@`` when it is no address
    itself (has no ``://``): ``service<...>@tcp://h:p``, but not ``dial@bind``.
    """
    head, sep, rest = address.partition("@")
    if sep and "://" not in head and not head.startswith("unix:"):
        return head, rest
    return None, address


def split_address(address: str) -> tuple[str, str]:
    """``(dial, bind)`` of a Monarch worker address (``dial@bind`` or just one; an
    ``ID@`` identity in front is left out)."""
    dial, _, bind = split_identity(address)[1].partition("@")
    return dial, bind or dial


def is_dialable(worker: str) -> bool:
    """Whether ``worker`` is an address a worker could listen on (not an agent name).

    A worker's own address may also name a listening socket it inherited,
    ``tcp://host:fdN`` (Monarch's form): the worker adopts fd N; clients dial
    that socket's real port.
    """
    dial, _ = split_address(worker)
    if dial.startswith("ipc://") or dial.startswith("unix:"):
        return True
    if dial.startswith("tcp://"):
        port = dial.rsplit(":", 1)[-1]
        return port.isdigit() or (port.startswith("fd") and port[2:].isdigit())
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
        port = bind.rsplit(":", 1)[-1]
        if port.startswith("fd"):  # a listening socket this process inherited
            sock = socket.socket(fileno=int(port[2:]))
            return await asyncio.start_server(handler, sock=sock)
        host, number = _tcp_host_port(bind)
        return await asyncio.start_server(handler, host, number)
    path = _unix_path(bind)
    old = os.umask(0o177)  # the socket is the worker's user's alone (0600)
    try:
        return await asyncio.start_unix_server(handler, path)
    finally:
        os.umask(old)


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
        # The service identity it was started with (ID@address): a client that names
        # another one meant another worker (one that was here before, say) and is refused.
        self.identity = split_identity(address)[0]
        self.name, self.labels, self.capacity = name, labels, capacity
        self._busy: int | None = None  # pid of the client being served
        # Set once the client being served hung up (its agent is being closed), and
        # set when the worker is free again: a client that comes meanwhile waits.
        self._hung_up = False
        self._free = asyncio.Event()
        self._stop: asyncio.Event | None = None
        self.listening = threading.Event()  # set once clients may dial (any thread may wait)

    async def serve_forever(self) -> None:
        """Serve clients one after another until SIGINT or SIGTERM, or until the
        client being served shuts its host mesh down (as Monarch's workers end)."""
        server = await _listen(self.bind, self._client)
        stop = self._stop = asyncio.Event()
        stop_on_signals(asyncio.get_running_loop(), stop)
        print(f"monarch worker listening at {self.dial} (bound to {self.bind})", flush=True)
        self.listening.set()
        try:
            async with server:
                await stop.wait()
        finally:
            # Stopping already (a signal, or the client shut its host mesh down): a
            # SIGTERM on the rest of the way out must not make it death by signal.
            ignore_stop_signals()
        if self.bind.startswith(("ipc://", "unix:")):
            with contextlib.suppress(OSError):
                os.unlink(_unix_path(self.bind))

    def _refusal(self, writer: asyncio.StreamWriter, hello: dict, challenge: str) -> str | None:
        """Why this client may not attach (see the module's docstring), or None."""
        wanted = hello.get("identity")
        if self.identity is not None and wanted is not None and wanted != self.identity:
            return (
                f"worker {self.dial} is service {self.identity}, not {wanted}: "
                "the client's address names another worker"
            )
        key = os.environ.get(KEY_ENV)
        proof = hello.get("proof")
        if key and isinstance(proof, str) and hmac.compare_digest(proof, _proof(key, challenge)):
            return None
        if _is_loopback(writer):
            uid = local_peer_uid(writer)
            if uid == os.getuid():
                return None
            return (
                f"worker {self.dial} runs as uid {os.getuid()} and takes clients of that user "
                f"only (or with {KEY_ENV}); this one is uid {uid}"
            )
        if not key:
            return (
                f"worker {self.dial} takes clients from other machines only with a shared key: "
                f"set {KEY_ENV} to the same secret for the worker and the client"
            )
        return f"worker {self.dial}: wrong or missing proof of {KEY_ENV}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            challenge = secrets.token_hex(16)
            await _reply(writer, challenge=challenge)
            hello = json.loads(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT))
            refusal = self._refusal(writer, hello, challenge)
            if refusal is not None:
                await _reply(writer, error=refusal)
                return
            env = {k: str(v) for k, v in hello["env"].items() if k.startswith("MONARCH_")}
            if self._busy is not None and self._hung_up:
                # The last client hung up (HostMesh.stop) and its agent is closing: a
                # reconnect right after that is served once it is done, not refused.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._free.wait(), HANG_UP_WAIT)
            if self._busy is not None:
                await _reply(writer, error=f"worker {self.dial} serves another client "
                             f"(pid {self._busy}); one client at a time")  # fmt: skip
                return
            self._busy, self._hung_up = int(hello.get("pid", 0)), False
            self._free.clear()
            try:
                await self._serve(hello, env, reader, writer)
            finally:
                self._busy = None
                self._free.set()
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
                # The lifeline: until the client hangs up (it may come back, or another
                # may), or says its host mesh is shut down (then this worker ends).
                while line := await reader.readline():
                    if line.strip() == SHUTDOWN and self._stop is not None:
                        self._stop.set()
                        break
            finally:
                self._hung_up = True
                await agent.close()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            settings.cache_clear()


def shutdown_lifeline(writer: asyncio.StreamWriter) -> None:
    """Tell a dialled worker that the client shut its host mesh down, and hang up."""
    with contextlib.suppress(Exception):
        writer.write(SHUTDOWN + b"\n")
        writer.close()


def _redacted(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rsplit('@', 1)[-1]}" if rest else url


async def _reply(writer: asyncio.StreamWriter, **fields: Any) -> None:
    writer.write(json.dumps(fields).encode() + b"\n")
    await writer.drain()


async def dial(
    worker: str, timeout: float, push_timeout: float | None = None
) -> tuple[str, asyncio.StreamWriter] | None:
    """Say hello to the worker at ``worker``: its agent's uid and the lifeline to keep.

    None when nobody listens there (yet), or the connection is not made within
    ``push_timeout`` (default ``timeout``); RuntimeError when the worker
    refuses or does not answer. ``push_timeout`` bounds handing the worker our
    settings (connect, its opening line); ``timeout`` its agent's start.
    """
    address, _ = split_address(worker)
    push = max(0.05, timeout if push_timeout is None else push_timeout)
    try:
        reader, writer = await asyncio.wait_for(open_connection(address), push)
    except (OSError, asyncio.TimeoutError):
        return None
    env = {k: v for k, v in os.environ.items() if k.startswith("MONARCH_") and k != KEY_ENV}
    hello: dict[str, Any] = {"env": env, "pid": os.getpid(), "timeout": max(1.0, timeout)}
    identity = split_identity(worker)[0]
    if identity is not None:
        hello["identity"] = identity
    try:
        opening = json.loads(await asyncio.wait_for(reader.readline(), push) or b"{}")
        key = os.environ.get(KEY_ENV)
        if key and isinstance(opening.get("challenge"), str):
            hello["proof"] = _proof(key, opening["challenge"])
        writer.write(json.dumps(hello).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), max(1.0, timeout))
    except (OSError, ValueError, asyncio.TimeoutError) as e:
        writer.close()
        raise RuntimeError(f"worker {address} did not answer the client's hello: {e!r}") from e
    reply = json.loads(line) if line else {"error": "it closed the connection"}
    if "uid" not in reply:
        writer.close()
        raise RuntimeError(f"worker {address} refused to attach: {reply.get('error')}")
    return str(reply["uid"]), writer
