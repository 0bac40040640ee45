"""How fast a request/reply through nats-server can be from Python, against nats-py's.

    python benchmarks/bench_nats_floor.py [--calls 3000] [--runs 3]

Two clients on one embedded nats-server, each pair a requester in this
process and a responder process, both on uvloop:

* ``minimal``: an ``asyncio.Protocol`` that speaks just enough of the NATS
  protocol (CONNECT, SUB, PUB, MSG, PING/PONG) and handles a message in the
  socket's own callback, writing the answer at once;
* ``nats-py``: ``nc.request`` to a responder that answers from a
  ``subscribe(cb=...)`` callback (the S1 baseline of compare/run.py).

The gap is what nats-py's tasks and Python cost per round trip; it bounds
what any change inside the runtime's use of nats-py can win (NOTES.md entry
30). Interleaved runs; prints p50/p99 per run. No assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import uvloop

from monarch.broker.connections.server import EmbeddedBroker

SUBJECT, INBOX = b"floor.echo", b"floor.inbox"


class MinimalNats(asyncio.Protocol):
    """Enough NATS for an echo: every MSG goes to ``on_msg(reply, payload)`` at once."""

    def __init__(self, on_msg) -> None:  # type: ignore[no-untyped-def]
        self.buf = b""
        self.on_msg = on_msg
        self.pong: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        while (i := buf.find(b"\r\n")) >= 0:
            line = buf[:i]
            if line.startswith(b"MSG "):
                parts = line.split(b" ")
                size = int(parts[-1])
                if len(buf) < i + 4 + size:
                    break
                self.on_msg(parts[3] if len(parts) == 5 else b"", buf[i + 2 : i + 2 + size])
                buf = buf[i + 4 + size :]
                continue
            buf = buf[i + 2 :]
            if line == b"PING":
                self.transport.write(b"PONG\r\n")
            elif line == b"PONG" and self.pong is not None:
                self.pong.set_result(None)
                self.pong = None
        self.buf = buf


async def minimal_connect(host: str, port: int, token: str, on_msg) -> MinimalNats:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_connection(lambda: MinimalNats(on_msg), host, port)
    transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    auth = f',"auth_token":"{token}"' if token else ""
    transport.write(b'CONNECT {"verbose":false,"pedantic":false%s}\r\n' % auth.encode())
    return proto


async def minimal_sub(proto: MinimalNats, subject: bytes) -> None:
    proto.transport.write(b"SUB %s 1\r\nPING\r\n" % subject)
    proto.pong = asyncio.get_running_loop().create_future()
    await proto.pong


async def minimal_responder(host: str, port: int, token: str) -> None:
    box: dict[str, MinimalNats] = {}

    def echo(reply: bytes, payload: bytes) -> None:
        box["p"].transport.write(b"PUB %s %d\r\n%s\r\n" % (reply, len(payload), payload))

    box["p"] = await minimal_connect(host, port, token, echo)
    await minimal_sub(box["p"], SUBJECT)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def minimal_requests(host: str, port: int, token: str, n: int) -> list[float]:
    box: dict[str, asyncio.Future] = {}
    proto = await minimal_connect(host, port, token, lambda r, p: box["f"].set_result(p))
    await minimal_sub(proto, INBOX)
    loop, out = asyncio.get_running_loop(), []
    request = b"PUB %s %s 16\r\n%s\r\n" % (SUBJECT, INBOX, b"x" * 16)
    for _ in range(n):
        box["f"] = loop.create_future()
        t = time.perf_counter()
        proto.transport.write(request)
        await box["f"]
        out.append(time.perf_counter() - t)
    proto.transport.close()
    return out


NATS_PY_RESPONDER = r"""
import asyncio, sys, nats, uvloop
async def main(url):
    nc = await nats.connect(url)
    async def echo(msg):
        await nc.publish(msg.reply, msg.data)
    await nc.subscribe("floor.nats-py", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
uvloop.run(main(sys.argv[1]))
"""


async def nats_py_requests(url: str, n: int) -> list[float]:
    import nats

    nc = await nats.connect(url)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await nc.request("floor.nats-py", b"x" * 16, timeout=5)
        out.append(time.perf_counter() - t)
    await nc.close()
    return out


def _start(args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if proc.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"responder did not start: {args[:3]}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--responder", nargs=3, help=argparse.SUPPRESS)  # host port token
    args = ap.parse_args()
    if args.responder:
        host, port, token = args.responder
        uvloop.run(minimal_responder(host, int(port), token if token != "-" else ""))
        return
    broker = EmbeddedBroker().start()
    token = broker.token or "-"
    responders = [
        _start([sys.executable, __file__, "--responder", "127.0.0.1", str(broker.port), token]),
        _start([sys.executable, "-c", NATS_PY_RESPONDER, broker.url]),
    ]
    warm = args.calls // 10
    try:
        for run in range(1, args.runs + 1):
            for name, make in (
                ("minimal", lambda: minimal_requests("127.0.0.1", broker.port,
                                                     broker.token or "", args.calls)),
                ("nats-py", lambda: nats_py_requests(broker.url, args.calls)),
            ):  # fmt: skip
                lat = sorted(uvloop.run(make())[warm:])
                p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
                print(f"run {run} {name:8s} p50 {p50:5.0f} us  p99 {p99:5.0f} us", flush=True)
    finally:
        for proc in responders:
            proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.stop()


if __name__ == "__main__":
    main()
